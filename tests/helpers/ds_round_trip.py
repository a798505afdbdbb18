"""DeepSpeed configs and the dsrecipes experiments written by hand to mean the same (tests/unit/test_deepspeed_config.py).

Together the cases give every key the translation maps (dsrecipes.config.ds_import.catalog's
"mapped" rows, each optimizer type's and schedule's params included); the test holds them to it.
Each experiment is written from DeepSpeed's documentation of the keys, not from the translation's
output: where a DeepSpeed block leaves a key out, the experiment spells DeepSpeed's default.
"""

from __future__ import annotations

CASES: dict[str, tuple[dict, str]] = {}

CASES["fp16_adam_zero3"] = ({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.7, "steps_per_print": 7, "log_level": "warning",
    "fp16": {"enabled": True, "auto_cast": False, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 50,
             "hysteresis": 3, "consecutive_hysteresis": True, "min_loss_scale": 0.5},
    "optimizer": {"type": "Adam", "params": {"lr": 2e-4, "betas": [0.8, 0.99], "eps": 1e-7, "weight_decay": 0.05,
                                             "adam_w_mode": False, "amsgrad": False}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 400, "warmup_min_lr": 1e-5,
                                                      "warmup_max_lr": 3e-4, "warmup_num_steps": 20,
                                                      "warmup_type": "log"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu"}, "zero_hpz_partition_size": 2, "overlap_comm": True,
                          "zero_quantized_weights": True, "zero_quantized_gradients": True,
                          "stage3_prefetch_bucket_size": "auto"},
    "activation_checkpointing": {"cpu_checkpointing": True, "partition_activations": False},
    "tensorboard": {"enabled": False},
    "wandb": {"enabled": True, "project": "p", "team": "t", "group": "g"},
    "csv_monitor": {"enabled": True},
    "pipeline": {"stages": 1, "partition": "parameters", "activation_checkpoint_interval": 1},
    "tensor_parallel": {"autotp_size": 1},
    "sequence_parallel_size": 1,
    "expert_parallel": {"autoep_size": 2, "top_k": 2, "load_balance_coeff": 0.02},
}, """
# @package _global_
defaults:
  - override /optimizer: adam
  - override /lr_scheduler: warmup_decay_lr
trainer:
  train_batch_size: null
  train_micro_batch_size_per_gpu: 4
  gradient_accumulation_steps: 2
  gradient_clipping: 0.7
logger:
  level: WARNING
  tensorboard: false
  wandb: true
  wandb_project: p
  wandb_entity: t
  wandb_group: g
  jsonl: true
precision:
  dtype: fp16
  master_weights: true
  loss_scale: 0
  initial_scale_power: 12
  loss_scale_window: 50
  hysteresis: 3
  consecutive_hysteresis: true
  min_loss_scale: 0.5
  raise_error_at_min_scale: true
optimizer:
  lr: 2.0e-4
  betas: [0.8, 0.99]
  eps: 1.0e-7
  weight_decay: 0.05
  adam_w_mode: false
  amsgrad: false
  no_decay_bias_and_norm: false
lr_scheduler:
  step_alignment: deepspeed
  total_num_steps: 400
  warmup_min_lr: 1.0e-5
  warmup_max_lr: 3.0e-4
  warmup_num_steps: 20
  warmup_type: log
zero:
  stage: 3
  offload_optimizer: cpu
  offload_param: cpu
  zero_hpz_partition_size: 2
  zero_quantized_weights: true
  zero_quantized_gradients: true
activation_checkpointing:
  mode: full
  cpu_offload: true
parallel:
  pp: 1
  pp_partition: parameters
  tp: 1
  sp: 1
moe:
  ep_size: 2
  k: 2
  aux_loss_coef: 0.02
""")

CASES["bf16_lamb_one_cycle_data_efficiency"] = ({
    "train_batch_size": 64,
    "bf16": {"enabled": True, "check_grad_overflow": False, "immediate_grad_update": True},
    "optimizer": {"type": "LAMB", "params": {"lr": 5e-3, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.01,
                                             "bias_correction": False, "max_coeff": 5.0, "min_coeff": 0.05}},
    "scheduler": {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "decay_lr_rate": 0.1, "cycle_first_step_size": 30,
        "cycle_second_step_size": 40, "cycle_first_stair_count": 2, "cycle_second_stair_count": 3, "decay_step_size": 5,
        "cycle_momentum": False, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}},
    "data_efficiency": {
        "enabled": True, "seed": 7,
        "data_sampling": {"enabled": True, "num_workers": 0, "curriculum_learning": {
            "enabled": True, "curriculum_metrics": {"seqlen": {
                "difficulty_type": "value", "clustering_type": "schedule_based", "min_difficulty": 16,
                "max_difficulty": 128, "schedule_type": "fixed_root",
                "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8, "root_degree": 2}}}}},
        "data_routing": {"enabled": True, "random_ltd": {
            "enabled": True, "random_ltd_layer_id": [1, 2], "random_ltd_layer_num": 2, "model_type": "decoder",
            "random_ltd_schedule": {"min_value": 32, "max_value": 128, "schedule_type": "fixed_linear",
                                    "schedule_config": {"require_steps": 50, "seq_per_step": 16}},
            "layer_token_lr_schedule": {"enabled": True}}}},
    "sparse_attention": {"mode": "variable", "block": 32, "different_layout_per_head": True, "num_local_blocks": 3,
                         "num_global_blocks": 2, "attention": "unidirectional", "horizontal_global_attention": False,
                         "num_different_global_patterns": 2, "num_random_blocks": 1, "local_window_blocks": [2, 4],
                         "global_block_indices": [0, 3], "global_block_end_indices": [1, 4],
                         "num_sliding_window_blocks": 2},
}, """
# @package _global_
defaults:
  - override /optimizer: lamb
  - override /lr_scheduler: one_cycle
trainer:
  train_batch_size: 64
  train_micro_batch_size_per_gpu: null
  gradient_accumulation_steps: null
precision:
  dtype: bf16
  master_weights: true
  nonfinite_grads: error
optimizer:
  lr: 5.0e-3
  betas: [0.9, 0.98]
  eps: 1.0e-6
  weight_decay: 0.01
  bias_correction: false
  max_coeff: 5.0
  min_coeff: 0.05
  no_decay_bias_and_norm: false
lr_scheduler:
  step_alignment: deepspeed
  cycle_min_lr: 1.0e-4
  cycle_max_lr: 1.0e-3
  decay_lr_rate: 0.1
  cycle_first_step_size: 30
  cycle_second_step_size: 40
  cycle_first_stair_count: 2
  cycle_second_stair_count: 3
  decay_step_size: 5
  cycle_momentum: false
  cycle_min_mom: 0.85
  cycle_max_mom: 0.95
  decay_mom_rate: 0.01
data_efficiency:
  seed: 7
  curriculum_learning:
    enabled: true
    metric: seqlen
    seqlen_mode: truncate
    difficulty_type: value
    min_difficulty: 16
    max_difficulty: 128
    schedule_type: fixed_root
    total_curriculum_step: 100
    difficulty_step: 8
    root_degree: 2
  random_ltd:
    enabled: true
    random_ltd_layer_id: [1, 2]
    min_value: 32
    max_value: 128
    require_steps: 50
    seq_per_step: 16
    layer_token_lr_schedule: true
sparse_attention:
  mode: variable
  block: 32
  different_layout_per_head: true
  num_local_blocks: 3
  num_global_blocks: 2
  attention: unidirectional
  horizontal_global_attention: false
  num_different_global_patterns: 2
  num_random_blocks: 1
  local_window_blocks: [2, 4]
  global_block_indices: [0, 3]
  global_block_end_indices: [1, 4]
  num_sliding_window_blocks: 2
""")

CASES["autocast_lion_lr_range_test_compression"] = ({
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4,
    "torch_autocast": {"enabled": True, "dtype": "bfloat16"},
    "optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.95, 0.98], "weight_decay": 0.2}},
    "scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-5, "lr_range_test_step_size": 10,
                                                    "lr_range_test_step_rate": 2.0, "lr_range_test_staircase": True}},
    "compression_training": {
        "weight_quantization": {
            "shared_parameters": {"enabled": True, "quantizer_kernel": False, "schedule_offset": 10,
                                  "quantize_groups": 4, "quantize_verbose": True, "quantization_type": "asymmetric",
                                  "rounding": "nearest", "quantize_weight_in_forward": True,
                                  "fp16_mixed_quantize": {"enabled": False}},
            "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 4, "quantization_period": 20},
                                         "modules": ["attn"]}}},
        "activation_quantization": {
            "shared_parameters": {"enabled": True, "quantization_type": "symmetric", "range_calibration": "static",
                                  "schedule_offset": 5},
            "different_groups": {"aq1": {"params": {"bits": 8}, "modules": ["mlp"]}}},
        "sparse_pruning": {
            "shared_parameters": {"enabled": True, "method": "topk", "schedule_offset": 3, "schedule_offset_end": 9,
                                  "schedule_offset_stride": 3, "block_pattern": "1x1", "dense_ratio": 0.5,
                                  "excluded_modules": ["lm_head"]},
            "different_groups": {"sp1": {"params": {"dense_ratio": 0.3}, "modules": ["blocks.*.mlp.*"]}}},
        "row_pruning": {
            "shared_parameters": {"enabled": True, "method": "l1", "schedule_offset": 4},
            "different_groups": {"rp1": {"params": {"dense_ratio": 0.6}, "modules": ["*mlp.fc_in"],
                                         "related_modules": [["fc_out"]]}}},
        "head_pruning": {
            "shared_parameters": {"enabled": True, "method": "topk", "schedule_offset": 6, "num_heads": 4},
            "different_groups": {"hp1": {"params": {"dense_ratio": 0.5}, "modules": ["*attn.out_proj"],
                                         "related_modules": [["q_proj", "kv_proj"]]}}},
        "channel_pruning": {
            "shared_parameters": {"enabled": False, "method": "l1", "schedule_offset": 8},
            "different_groups": {"cp1": {"params": {"dense_ratio": 0.5}, "modules": ["conv"],
                                         "related_modules": [["bn"]]}}},
        "layer_reduction": {"enabled": True, "keep_number_layer": 2, "module_name_prefix": "blocks",
                            "teacher_layer": [1, 3], "other_module_name": ["tok_emb", "norm_f", "lm_head"]},
    },
}, """
# @package _global_
defaults:
  - override /optimizer: lion
  - override /lr_scheduler: lr_range_test
trainer:
  train_batch_size: 32
  train_micro_batch_size_per_gpu: 8
  gradient_accumulation_steps: 4
precision:
  dtype: bf16
  master_weights: false
optimizer:
  lr: 1.0e-4
  betas: [0.95, 0.98]
  weight_decay: 0.2
  no_decay_bias_and_norm: false
lr_scheduler:
  step_alignment: deepspeed
  lr_range_test_min_lr: 1.0e-5
  lr_range_test_step_size: 10
  lr_range_test_step_rate: 2.0
  lr_range_test_staircase: true
compression:
  weight_quantization:
    enabled: true
    start_bits: 8
    target_bits: 4
    quantization_period: 20
    schedule_offset: 10
    quantization_type: asymmetric
    rounding: nearest
    quantize_groups: 4
    modules: [attn]
  activation_quantization:
    enabled: true
    bits: 8
    quantization_type: symmetric
    range_calibration: static
    schedule_offset: 5
    modules: [mlp]
  sparse_pruning:
    enabled: true
    method: topk
    dense_ratio: 0.3
    schedule_offset: 3
    schedule_offset_end: 9
    schedule_offset_stride: 3
    block_pattern: 1x1
    modules: ["blocks.*.mlp.*"]
    excluded_modules: [lm_head]
  row_pruning:
    enabled: true
    method: l1
    dense_ratio: 0.6
    schedule_offset: 4
    modules: ["*mlp.fc_in"]
    related_modules: [fc_out]
  head_pruning:
    enabled: true
    method: topk
    dense_ratio: 0.5
    schedule_offset: 6
    num_heads: 4
    modules: ["*attn.out_proj"]
    related_modules: [q_proj, kv_proj]
  channel_pruning:
    enabled: false
    method: l1
    dense_ratio: 0.5
    schedule_offset: 8
    modules: [conv]
    related_modules: [bn]
  layer_reduction:
    enabled: true
    keep_number_layer: 2
    module_name_prefix: blocks
    teacher_layer: [1, 3]
    other_module_name: [tok_emb, norm_f, lm_head]
""")

CASES["sgd_warmup_lr_legacy_curriculum"] = ({
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.8, "weight_decay": 1e-4, "nesterov": True,
                                            "dampening": 0}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.05,
                                                 "warmup_num_steps": 15, "warmup_type": "linear"}},
    "zero_optimization": {"stage": 2, "cpu_offload": True},
    "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
                            "schedule_type": "fixed_root",
                            "schedule_config": {"total_curriculum_step": 60, "difficulty_step": 8, "root_degree": 3}},
}, """
# @package _global_
defaults:
  - override /optimizer: sgd
  - override /lr_scheduler: warmup_lr
trainer:
  train_batch_size: null
  train_micro_batch_size_per_gpu: 8
  gradient_accumulation_steps: null
optimizer:
  lr: 0.05
  momentum: 0.8
  weight_decay: 1.0e-4
  nesterov: true
  no_decay_bias_and_norm: false
lr_scheduler:
  step_alignment: deepspeed
  warmup_min_lr: 0.001
  warmup_max_lr: 0.05
  warmup_num_steps: 15
  warmup_type: linear
zero:
  stage: 2
  offload_optimizer: cpu
data_efficiency:
  curriculum_learning:
    enabled: true
    metric: seqlen
    seqlen_mode: truncate
    min_difficulty: 8
    max_difficulty: 64
    schedule_type: fixed_root
    total_curriculum_step: 60
    difficulty_step: 8
    root_degree: 3
""")

CASES["vocab_rarity_curriculum"] = ({
    "data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {
        "enabled": True, "data_cluster_path": "/clusters", "curriculum_metrics": {"vocabularyrarity": {
            "index_to_sample_path": "/idx/sample", "index_to_metric_path": "/idx/metric",
            "difficulty_type": "percentile", "clustering_type": "schedule_based", "min_difficulty": 10,
            "max_difficulty": 90, "schedule_type": "fixed_discrete",
            "schedule_config": {"difficulty": [10, 50, 90], "max_step": [30, 60]}}}}},
        "data_routing": {"enabled": False, "random_ltd": {"enabled": True, "random_ltd_layer_id": [1]}}},
}, """
# @package _global_
data_efficiency:
  curriculum_learning:
    enabled: true
    metric: vocab_rarity
    seqlen_mode: truncate
    difficulty_type: percentile
    min_difficulty: 10
    max_difficulty: 90
    schedule_type: fixed_discrete
    difficulty: [10, 50, 90]
    max_step: [30, 60]
  random_ltd:
    enabled: false
""")

CASES["rmsprop_warmup_cosine"] = ({
    "gradient_accumulation_steps": 2, "train_batch_size": 16,
    "optimizer": {"type": "RMSprop", "params": {"lr": 0.01, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.0,
                                                "momentum": 0.5, "centered": True}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 300, "warmup_min_ratio": 0.1,
                                                       "warmup_num_steps": 30, "cos_min_ratio": 0.05,
                                                       "warmup_type": "linear"}},
    "zero_optimization": {"stage": 3, "cpu_offload_param": True},
    "wall_clock_breakdown": True, "dataloader_drop_last": True,
    "flops_profiler": {"enabled": True, "recompute_fwd_factor": 0.5, "profile_step": 3, "module_depth": 2,
                       "top_modules": 3, "detailed": False, "output_file": "prof.md"},
    "comms_logger": {"enabled": True, "verbose": True, "prof_all": False, "prof_ops": ["all_reduce"], "debug": True},
}, """
# @package _global_
defaults:
  - override /optimizer: rmsprop
  - override /lr_scheduler: warmup_cosine
trainer:
  train_batch_size: 16
  train_micro_batch_size_per_gpu: null
  gradient_accumulation_steps: 2
  wall_clock_breakdown: true
  dataloader_drop_last: true
flops_profiler:
  enabled: true
  recompute_fwd_factor: 0.5
  profile_step: 3
  module_depth: 2
  top_modules: 3
  detailed: false
  output_file: prof.md
comms_logger:
  enabled: true
  verbose: true
  prof_all: false
  prof_ops: [all_reduce]
  debug: true
optimizer:
  lr: 0.01
  alpha: 0.9
  eps: 1.0e-6
  weight_decay: 0.0
  momentum: 0.5
  centered: true
  no_decay_bias_and_norm: false
lr_scheduler:
  step_alignment: deepspeed
  total_num_steps: 300
  warmup_min_ratio: 0.1
  warmup_num_steps: 30
  cos_min_ratio: 0.05
  warmup_type: linear
zero:
  stage: 3
  offload_param: cpu
""")

CASES["adagrad_step_lr"] = ({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "Adagrad", "params": {"lr": 0.02, "lr_decay": 0.001, "weight_decay": 0.01, "eps": 1e-9}},
    "scheduler": {"type": "StepLR", "params": {"step_size": 40, "gamma": 0.7}},
}, """
# @package _global_
defaults:
  - override /optimizer: adagrad
  - override /lr_scheduler: torch_step
trainer:
  train_batch_size: null
  train_micro_batch_size_per_gpu: 2
  gradient_accumulation_steps: null
optimizer:
  lr: 0.02
  lr_decay: 0.001
  weight_decay: 0.01
  eps: 1.0e-9
  no_decay_bias_and_norm: false
lr_scheduler:
  step_alignment: deepspeed
  step_size: 40
  gamma: 0.7
""")

CASES["nvme_offload_zero3"] = ({
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 3,
                          "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6},
                          "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 7,
                                            "buffer_size": 2e7, "pin_memory": False}},
    "aio": {"block_size": 262144, "queue_depth": 16, "intra_op_parallelism": 2, "thread_count": 2,
            "single_submit": True, "overlap_events": False},
}, """
# @package _global_
trainer:
  train_batch_size: null
  train_micro_batch_size_per_gpu: 2
  gradient_accumulation_steps: null
zero:
  stage: 3
  offload_optimizer: nvme
  offload_param: nvme
  nvme_path: /local_nvme
  buffer_count: 6
  param_buffer_count: 7
  buffer_size: 20000000
  pin_memory: false
  aio:
    block_size: 262144
    queue_depth: 16
    thread_count: 2
    single_submit: true
    overlap_events: false
""")

CASES["adamw_torch_classes"] = ({
    "optimizer": {"type": "AdamW", "params": {"lr": 4e-4, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.02}},
    "scheduler": {"type": "ExponentialLR", "params": {"gamma": 0.99}},
    "zero_optimization": True,
}, """
# @package _global_
defaults:
  - override /optimizer: adamw
  - override /lr_scheduler: custom
optimizer:
  lr: 4.0e-4
  betas: [0.9, 0.98]
  eps: 1.0e-6
  weight_decay: 0.02
  no_decay_bias_and_norm: false
lr_scheduler:
  _target_: torch.optim.lr_scheduler.ExponentialLR
  step_alignment: deepspeed
  gamma: 0.99
zero:
  stage: 1
""")

CASES["torch_optimizer_class"] = ({
    "optimizer": {"type": "NAdam", "params": {"lr": 3e-3, "momentum_decay": 0.005}},
}, """
# @package _global_
defaults:
  - override /optimizer: custom
optimizer:
  _target_: torch.optim.NAdam
  lr: 3.0e-3
  momentum_decay: 0.005
  weight_decay: 0
  no_decay_bias_and_norm: false
""")

CASES["legacy_discrete_curriculum"] = ({
    "curriculum_learning": {"enabled": True, "min_difficulty": 16, "max_difficulty": 64, "schedule_type": "fixed_discrete",
                            "schedule_config": {"difficulty": [16, 32, 64], "max_step": [5, 10]}},
}, """
# @package _global_
data_efficiency:
  curriculum_learning:
    enabled: true
    metric: seqlen
    seqlen_mode: truncate
    min_difficulty: 16
    max_difficulty: 64
    schedule_type: fixed_discrete
    difficulty: [16, 32, 64]
    max_step: [5, 10]
""")


# A block the DeepSpeed config leaves out means what it means in DeepSpeed: no scheduler block, a constant lr
# (DeepSpeed builds no scheduler); no optimizer block, the caller's optimizer, for which dsrecipes' default
# option (adamw with its schema's numbers) stands in.
_ABSENT_OPTIMIZER = "optimizer:\n  lr: 0.001\n  betas: [0.9, 0.95]\n  eps: 1.0e-8\n  weight_decay: 0.1\n"


def _with_absent_blocks(ds: dict, text: str) -> str:
    picks = ([] if "optimizer" in ds else ["  - override /optimizer: adamw"]) + \
            ([] if "scheduler" in ds else ["  - override /lr_scheduler: constant"])
    if not picks:
        return text
    head = "# @package _global_\n"
    body = text.split(head, 1)[1]
    if body.startswith("defaults:\n"):
        body = "defaults:\n" + "\n".join(picks) + "\n" + body[len("defaults:\n"):]
    else:
        body = "defaults:\n" + "\n".join(picks) + "\n" + body
    if "optimizer" not in ds:
        body += "\n" + _ABSENT_OPTIMIZER
    return text.split(head, 1)[0] + head + body


CASES = {name: (ds, _with_absent_blocks(ds, text)) for name, (ds, text) in CASES.items()}

# DeepSpeed's Muon: muon_lr for the Muon half, lr for the Adam half (no adam_lr), its eps / betas defaults filled in;
# DeepSpeed's name split and update scale come with it
CASES["muon_zero2"] = ({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2},
    "optimizer": {"type": "Muon", "params": {"lr": 5e-4, "muon_lr": 0.02, "momentum": 0.9, "weight_decay": 0.05,
                                             "ns_method": "standard"}},
}, """
# @package _global_
defaults:
  - override /optimizer: muon
  - override /lr_scheduler: constant
trainer:
  train_batch_size: null
  train_micro_batch_size_per_gpu: 4
  gradient_accumulation_steps: 2
zero:
  stage: 2
optimizer:
  no_decay_bias_and_norm: false
  lr: 0.02
  adam_lr: 5.0e-4
  momentum: 0.9
  weight_decay: 0.05
  ns_method: standard
  betas: [0.9, 0.95]
  eps: 1.0e-10
  update_scale: shape_ratio
  adam_params: [embed, lm_head]
  muon_params: [all-matrices]
""")

# DeepSpeedExamples' bf16_master_weight configs: the ZeRO optimizer steps the bf16 weights, its state in bf16
CASES["bf16_masters_zero2"] = ({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2},
    "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
}, """
# @package _global_
defaults:
  - override /optimizer: adamw
  - override /lr_scheduler: constant
trainer:
  train_batch_size: null
  train_micro_batch_size_per_gpu: 4
  gradient_accumulation_steps: 2
precision:
  master_weights: true
  dtype: bf16
  master_dtype: bf16
  nonfinite_grads: skip
zero:
  stage: 2
optimizer:
  lr: 0.001
  betas: [0.9, 0.95]
  eps: 1.0e-08
  weight_decay: 0.1
""")
