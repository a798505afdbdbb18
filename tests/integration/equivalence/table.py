"""The layout-equivalence table: every parallel layout the suite proves, one row each, against a single process.

Each Row is one training run through the real CLI (`python -m dsrecipes ...`, 10 steps of gpt_debug, gradient
accumulation 2, clipping at 1.0, no dropout; a checkpoint at step 5 where the row resumes) compared with its Reference, a
single-process run of the same recipe on the same global batch. tests/integration/equivalence/test_layouts.py
runs the table; tests/helpers/run_cache.py runs each distinct recipe once for the whole pytest run, so a
reference serves every row of its family, and a row's equivalence and resume checks read one run.

Adding a layout is adding a Row. A supported row of the compatibility matrix (dsrecipes/config/compatibility.py)
names the rows that show it (Supported.tests); tests/unit/test_compatibility.py fails when one names none.

Tolerances (each Row's `tolerance`, absolute, over the 10 steps; defined in dsrecipes/verify/config.py):
* FP32: losses 2e-5, exported parameters 5e-5. The layouts differ from one process only in fp32 summation order
  (half-batch gradients averaged across ranks, reduce-scatters, matmuls split over tp and summed, micro-batches
  averaged by a pipeline schedule), about 1e-7 relative per step; Adam's normalisation lets it grow slowly, so the
  bound leaves ~100x room while any real error (a wrong loss scaling, a missing gradient shard) moves the loss
  by more than 1e-2.
* MASTER_WEIGHTS: losses 2e-2, parameters 5e-3 (tests/integration/test_precision_matrix.py's master-weight
  tolerance). 16-bit activations and gradients round differently when the batch is split (tied-gradient sums
  across stages, half-batch gradients at dp 2). Measured: losses 4e-3 / 3e-3, parameters 1e-3 / 2e-3 (fp16 pp 2 /
  bf16_master dp 2 x pp 2).
* BF16_EXPERTS: losses 1e-2, parameters 5e-3: bf16 expert gradients rounded from half-batch sums at world 2.
* COMPILED: losses 1e-4, parameters 2e-4. Inductor fuses each block's elementwise work into generated C++ loops
  whose float summation order differs from ATen's kernels (measured differences about 10x smaller).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# one source for the tolerances: `python -m dsrecipes.verify` holds any recipe's layout to the same numbers
from dsrecipes.verify.config import BF16_EXPERTS, COMPILED, FP32, MASTER_WEIGHTS, Tolerance

STEPS = 10
CHECKPOINT_STEP = 5  # the rows that resume save here; their resume checks continue from it in one process

# The recipe every row trains. The last two keys skip what no check reads: the end-of-run text sample and the
# loss-curve PNG (the final checkpoint stays: the offline export of tests/integration/test_distributed.py reads it).
COMMON = (
    "model=gpt_debug", "model.max_seq_len=64", "model.dropout=0.0", "data.max_bytes=300000",
    f"trainer.max_steps={STEPS}", "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.eval_batches=2",
    "trainer.progress_bar=false", "trainer.gradient_accumulation_steps=2", "trainer.gradient_clipping=1.0",
    "lr_scheduler.warmup_num_steps=3", "logger=jsonl", "trainer.sample_tokens=0", "trainer.loss_curve=false",
)
# what a run that is resumed adds: its step-5 checkpoint (saving changes nothing the other checks read)
SAVES_STEP_5 = (f"checkpoint.interval={CHECKPOINT_STEP}",)


def merged(*parts) -> list[str]:
    """Override lists joined left to right; a later value of a key replaces an earlier one in place (each key once,
    so the run cache's key does not depend on order)."""
    out: dict[str, str] = {}
    for part in parts:
        for override in part:
            out[override.split("=", 1)[0]] = override
    return list(out.values())



@dataclass(frozen=True)
class Reference:
    """A single-process run: the recipe (on top of COMMON) and its batch split (micro-batch x accumulation)."""

    name: str
    recipe: tuple[str, ...] = ()
    batch: tuple[str, ...] = ("trainer.train_micro_batch_size_per_gpu=8",)
    trained_by: float = 0.3  # how far its loss falls in the 10 steps at least (the check that it trains at all)

    def overrides(self) -> list[str]:
        return merged(COMMON, self.recipe, ("launcher.nproc_per_node=1",), self.batch)


MOE_RECIPE = ("moe.num_experts=4", "moe.k=2", "moe.expert_interval=1", "moe.use_rts=false",
              "moe.top2_2nd_expert_sampling=false", "moe.capacity_factor=1.0", "moe.min_capacity=4")
MOE_BATCH = ("trainer.train_micro_batch_size_per_gpu=4", "trainer.gradient_accumulation_steps=4")
# drop_tokens=false and no aux loss make every token's output independent of how tokens are grouped into
# micro-batches, so a one-process run at micro-batch 8 is the reference (the batch a resume needs: micro x world)
MOE_UNGROUPED = (*MOE_RECIPE, "moe.drop_tokens=false", "moe.aux_loss_coef=0")
# the layout tests' recipe with every compression technique taking effect within the 10 steps: sparse pruning of
# q_proj ramped from step 2 to 6, row pruning of fc_in (fc_out columns with it) and head pruning at step 4, int8
# weight QAT of the block linears from step 6
COMPRESSION_RECIPE = (
    "compression=combined", "compression.row_pruning.schedule_offset=4", "compression.head_pruning.schedule_offset=4",
    "compression.weight_quantization.schedule_offset=6", "compression.weight_quantization.quantize_groups=4",
    "compression.sparse_pruning.enabled=true", "compression.sparse_pruning.schedule_offset=2",
    "compression.sparse_pruning.schedule_offset_end=6", "compression.sparse_pruning.schedule_offset_stride=2",
    "compression.sparse_pruning.dense_ratio=0.5", "compression.sparse_pruning.modules=[blocks.*.attn.q_proj]",
)
# seqlen curriculum in pack mode (changes the batch shape and row count) and random-LTD in the middle layers, with
# an evaluation every 5 steps (eval/train switches re-run a pipeline schedule's shape inference)
DATA_EFFICIENCY_RECIPE = (
    "data_efficiency=combined", "data_efficiency.curriculum_learning.seqlen_mode=pack",
    "data_efficiency.curriculum_learning.min_difficulty=16",
    "data_efficiency.curriculum_learning.total_curriculum_step=8", "data_efficiency.random_ltd.min_value=16",
    "data_efficiency.random_ltd.require_steps=8", "trainer.eval_interval=5",
)

GPT = Reference("gpt")
GPT_FP16 = Reference("gpt_fp16", ("precision=fp16",))
GPT_BF16_MASTER = Reference("gpt_bf16_master", ("precision=bf16_master",))
# rotary tables at the chunk's positions on every pipeline stage, grouped-query kv heads repeated for Ulysses
LLAMA_GQA = Reference("llama_gqa", ("model.style=llama", "model.n_kv_head=2"))
# micro 4 x accumulation 4: rank r's i-th micro-batch at dp 2 (micro 4 x accumulation 2) is the single process's
# (2i + r)-th, so gating, capacity, dropped tokens and the auxiliary loss see the same token groups
MOE = Reference("moe", MOE_RECIPE, MOE_BATCH)
# micro 2 x accumulation 8: rank r's i-th micro-batch at world 4 (micro 2 x accumulation 2) is the (4i + r)-th
MOE_WORLD_4 = Reference("moe_world_4", MOE_RECIPE, ("trainer.train_micro_batch_size_per_gpu=2",
                                                    "trainer.gradient_accumulation_steps=8"))
MOE_UNGROUPED_FP32 = Reference("moe_ungrouped", MOE_UNGROUPED)
MOE_UNGROUPED_BF16_MASTER = Reference("moe_ungrouped_bf16_master", (*MOE_UNGROUPED, "precision=bf16_master"))
# the gate's random draws off: inside a compiled block they draw from inductor's generator, not eager torch's
MOE_TOP2 = Reference("moe_top2", ("moe=top2", "moe.num_experts=4", "moe.use_rts=false",
                                  "moe.top2_2nd_expert_sampling=false"))
COMPRESSED = Reference("compressed", (*COMPRESSION_RECIPE, *SAVES_STEP_5))  # also resumed from its own step 5
DATA_EFFICIENCY = Reference("data_efficiency", DATA_EFFICIENCY_RECIPE)
# optimizers whose step is more than elementwise: Muon (Newton-Schulz on the whole matrix, gathered from its shards),
# AdamW with bf16 moments (stochastic rounding by each element's index in the whole tensor)
# Muon's Newton-Schulz in fp32: ns_dtype=auto takes DeepSpeed's choice, fp16 on a CPU with MKLDNN fp16 (this one),
# where the layouts' different fp32 summation orders flip fp16 roundings (3e-5 by step 10) and the row would measure
# fp16 rounding instead of the layout
MUON = Reference("muon", ("optimizer=muon", "optimizer.ns_dtype=float32"))
ADAMW_BF16_STATE = Reference("adamw_bf16_state", ("optimizer.state_dtype=bf16",))
# Hugging Face checkpoints (tests/helpers/hf_models.py: 2 layers of width 64, made once per run): gemma3 runs as the
# transformers module (sandwich norms, scaled embeddings, q/k norms, its own tp_plan), mixtral too (its own router
# and experts, their gradients and Adam state ZeRO-2 sharded), qwen3 on dsrecipes' blocks (model.impl=auto: head_dim
# 32, q/k norms)
HF_GEMMA3 = Reference("hf_gemma3", ("model=hf", "model.path=@hf:gemma3"))
# instruction data: the built-in chat tasks in the plain template, only assistant tokens labelled, whole
# conversations packed into rows of 128 (positions restarting, a causal block each): micro-batches hold different
# numbers of labels, so the loss is the global batch's token mean only if the step weighs them right
SFT_CHAT = Reference("sft_chat", ("data.format=chat", "data.chat_template=plain", "data.packing=documents",
                                  "model.max_seq_len=128", "data.max_bytes=100000"))
HF_MIXTRAL = Reference("hf_mixtral", ("model=hf", "model.path=@hf:mixtral"))
HF_QWEN3 = Reference("hf_qwen3", ("model=hf", "model.path=@hf:qwen3"))
# LoRA (peft=lora, rank 8 on every projection): only the adapters train; qwen3 on dsrecipes' blocks (loaded sharded,
# adapters initialised after the load), gemma3 as the transformers module
LORA_QWEN3 = Reference("lora_qwen3", (*HF_QWEN3.recipe, "peft=lora", "optimizer.lr=3e-3"))
LORA_GEMMA3 = Reference("lora_gemma3", (*HF_GEMMA3.recipe, "peft=lora", "optimizer.lr=3e-3"))
# DPO with LoRA on qwen3: the built-in preference pairs, reference log-probabilities computed once at the start
# (shared out over the ranks) and carried by the checkpoint into the resumed run
# (DPO's loss starts at log 2 = 0.693 and falls slowly: 0.693 -> 0.654 at step 9 here)
DPO_LORA_QWEN3 = Reference("dpo_lora_qwen3", (*LORA_QWEN3.recipe, "data.format=preference", "data.packing=none",
                                              "dpo=dpo", "data.max_bytes=60000"), trained_by=0.005)
# QLoRA-style: the adapted Linears' frozen weights as int8 codes (buffers, replicated), dequantized per call
QLORA_QWEN3 = Reference("qlora_qwen3", (*LORA_QWEN3.recipe, "peft.quantize_base=int8"))
HF_REFERENCES = (HF_GEMMA3, HF_MIXTRAL, HF_QWEN3, LORA_QWEN3, LORA_GEMMA3, DPO_LORA_QWEN3, QLORA_QWEN3)


def world(n: int, micro: int) -> tuple[str, ...]:
    return (f"launcher.nproc_per_node={n}", f"trainer.train_micro_batch_size_per_gpu={micro}")


@dataclass(frozen=True)
class Row:
    """One layout: its run (the reference's recipe + `layout`) matches the reference within `tolerance`.

    resume: its step-5 checkpoint, resumed in one process (the reference's recipe and batch), ends with the
      reference's losses for steps 6-10 and its exported parameters.
    layout_line: fragments the run's own layout line (summary.json) must contain: the run says what it ran.
    metrics: other logged series compared with the reference's, (key, absolute tolerance).
    check: any further assertion, check(run, reference_run).
    """

    id: str
    reference: Reference
    layout: tuple[str, ...]
    tolerance: Tolerance = FP32
    resume: bool = False
    layout_line: tuple[str, ...] = ()
    metrics: tuple[tuple[str, float], ...] = ()
    check: Callable | None = field(default=None, compare=False)
    timeout: int = 400

    @property
    def world_size(self) -> int:
        for override in self.overrides():
            if override.startswith("launcher.nproc_per_node="):
                return int(override.split("=", 1)[1])
        raise AssertionError(f"row {self.id} sets no launcher.nproc_per_node")

    def overrides(self) -> list[str]:
        """COMMON + the reference's recipe + the layout; the layout sets its own batch split (world and micro-batch;
        accumulation 2 unless it says otherwise) for the reference's global batch. A row that resumes saves at step 5."""
        return merged(COMMON, self.reference.recipe, self.layout, SAVES_STEP_5 if self.resume else ())

    def resume_overrides(self, checkpoint) -> list[str]:
        return merged(self.reference.overrides(), (f"trainer.resume={checkpoint}",))


# ------------------------------------------------------------------------------------------------- extra checks
def every_expert_exported(block: int = 0) -> Callable:
    """The export gathers every rank's experts: the expert weights have all 4 experts, as one process's."""
    def check(run, reference) -> None:
        key = f"blocks.{block}.mlp.experts.w_in"
        assert run.params[key].shape == reference.params[key].shape and run.params[key].shape[0] == 4
    return check


def first_step_within(atol: float) -> Callable:
    """The first step's loss (before any update could drift) equals one process's within atol: the global-token
    mean over 2 ranks x 2 micro-batches of different label counts is the whole batch's token mean."""
    def check(run, reference) -> None:
        assert abs(run.losses[0] - reference.losses[0]) <= atol, (run.losses[0], reference.losses[0])
    return check


def lora_exported(run, reference) -> None:
    """The export is the merged model (no adapter tensors in it) and adapter/ holds the PEFT adapter, the same as the
    single process's, which peft loads onto the base checkpoint to the merged model's logits."""
    same_adapters(run, reference)
    assert_peft_loads_adapter(run.run_dir)


def same_adapters(run, reference) -> None:
    """The merged export holds no adapter tensor; export/adapter/ holds the single process's adapters (5e-5)."""
    import torch
    from safetensors.torch import load_file

    assert not any("lora_" in name or "base_layer" in name for name in run.params)
    files = [run.run_dir / "export" / "adapter" / "adapter_model.safetensors",
             reference.run_dir / "export" / "adapter" / "adapter_model.safetensors"]
    mine, theirs = (load_file(str(f)) for f in files)
    assert mine.keys() == theirs.keys() and mine
    for key, tensor in mine.items():
        torch.testing.assert_close(tensor, theirs[key], rtol=0, atol=5e-5, msg=key)


def assert_peft_loads_adapter(run_dir) -> None:
    """peft.PeftModel.from_pretrained(base checkpoint, export/adapter) computes the merged export's logits (1e-5)."""
    import peft
    import torch
    import transformers
    import yaml

    base_path = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["model"]["path"]
    base = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(base, str(run_dir / "export" / "adapter")).eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(run_dir / "export"), dtype=torch.float32).eval()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(adapted(ids).logits, merged(ids).logits, rtol=0, atol=1e-5)


def masters_exported_in_fp32(run, reference) -> None:
    """Master-weight layouts export every stage's fp32 masters."""
    for name, tensor in run.params.items():
        assert tensor.dtype.is_floating_point and tensor.element_size() == 4, name


def every_expert_checkpointed(run, reference) -> None:
    """The full-state checkpoint of an expert-parallel run at stage 0 holds every expert."""
    import torch

    state = torch.load(run.checkpoint(CHECKPOINT_STEP) / "model.pt")
    assert state["blocks.0.mlp.experts.w_in"].shape[0] == 4


PRUNED = [f"blocks.{i}.{name}.weight" for i in range(4) for name in ("mlp.fc_in", "mlp.fc_out", "attn.q_proj",
                                                                      "attn.kv_proj", "attn.out_proj")]


def same_entries_pruned(run, reference) -> None:
    """Every entry the masks prune is exactly zero in the run's export, the same entries as in one process (masks
    and quantization scales come from whole weights, DTensor shards gathered). The float export is compared: the
    int8 codes of export_compressed can differ by one step where a weight sits on a rounding boundary."""
    import torch

    for name in PRUNED:
        zeros, ref_zeros = run.params[name] == 0, reference.params[name] == 0
        assert ref_zeros.float().mean() > 0.2, name
        assert torch.equal(zeros, ref_zeros), name


def exported_for_transformers(run, reference) -> None:
    """A transformers-path run exports its own architecture: every tensor of the checkpoint, under its names."""
    assert run.params.keys() == reference.params.keys() and any(".self_attn." in name for name in run.params)


def evaluated_twice(run, reference) -> None:
    assert len(reference.metric("val/loss")) == 2  # at step 5 and at the end: the schedule re-ran its shapes


# ------------------------------------------------------------------------------------------------- the table
ZERO_STRATEGY = {0: "data parallel: ddp", 1: "data parallel: zero1", 2: "data parallel: zero2",
                 3: "data parallel: fsdp2: FSDP2 (zero.stage=3)"}
PP_STRATEGY = {1: "data parallel: zero1_boundary: ZeRO-1", 2: "data parallel: fsdp2: FSDP2 (zero.stage=2)",
               3: "data parallel: fsdp2: FSDP2 (zero.stage=3)"}
COMPILE_BLOCKS = "compile: 4 block(s) compiled separately"
GEMMA3_MODULE = "model: transformers Gemma3ForCausalLM (gemma3_text; 2 x Gemma3DecoderLayer, attention sdpa)"

ROWS: tuple[Row, ...] = (
    # data parallelism and ZeRO at world 2: the same global batch as 2 ranks x micro 4 x accumulation 2
    *(Row(f"dp2-zero{stage}", GPT, (f"zero.stage={stage}", *world(2, 4)), layout_line=(ZERO_STRATEGY[stage],),
          resume=stage == 3) for stage in (0, 1, 2, 3)),
    Row("dp2-zero3-offload_param", GPT, ("zero.stage=3", "zero.offload_param=cpu", *world(2, 4)), layout_line=(
        "data parallel: fsdp2: FSDP2 (zero.stage=3): parameters, gradients and optimizer state sharded (over 2 ranks), "
        "CPU offload | optimizer: adamw, state 8 B/param | offload: parameters -> cpu |",)),
    Row("dp2-zero3-activation_checkpointing", GPT, ("zero.stage=3", "activation_checkpointing=full", *world(2, 4))),
    # tensor parallelism: matmuls split over the hidden dimension and summed by all-reduce, vocab-parallel lookups
    Row("tp2", GPT, ("parallel.tp=2", *world(2, 8)), resume=True),
    Row("dp2xtp2-zero3", GPT, ("parallel.tp=2", "zero.stage=3", *world(4, 4))),
    # pipeline parallelism: gpt_debug's 4 blocks and tied embedding (the first and last stages hold copies of the
    # one weight and sum their gradients), micro-batches = accumulation steps = 2
    Row("pp2-gpipe", GPT, ("parallel.pp=2", "parallel.pp_schedule=gpipe", *world(2, 8))),
    Row("pp2-1f1b", GPT, ("parallel.pp=2", "parallel.pp_schedule=1f1b", *world(2, 8)), resume=True),
    Row("pp2-interleaved_1f1b", GPT, ("parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b",
                                      "parallel.pp_partition=parameters", *world(2, 8))),
    Row("dp2xpp2", GPT, ("parallel.pp=2", *world(4, 4))),
    *(Row(f"dp2xpp2-zero{stage}", GPT, ("parallel.pp=2", f"zero.stage={stage}", *world(4, 4)),
          layout_line=(PP_STRATEGY[stage],), resume=stage != 2) for stage in (1, 2, 3)),
    # gpt_3d's layout: tensor-parallel stages with sequence-parallel activations between them, the vocab-parallel
    # loss on the last stage, vocab-sharded tied copies, dp 2
    Row("dp2xtp2xpp2", GPT, ("parallel.pp=2", "parallel.tp=2", *world(8, 4)), timeout=500, layout_line=(
        "world 8 = pp 2 x dp 2 (replicate 2 x shard 1) x sp 1 x tp 2; ep 1 | pipeline: ",
        "tensor parallel: sequence-parallel activations", "data parallel: allreduce",
        "precision: fp32 weights and compute")),
    # pipelines with loss scaling and fp32 master weights, against one process of the same precision
    Row("pp2-fp16", GPT_FP16, ("parallel.pp=2", *world(2, 8)), MASTER_WEIGHTS, check=masters_exported_in_fp32),
    Row("dp2xpp2-zero1-bf16_master", GPT_BF16_MASTER, ("parallel.pp=2", "zero.stage=1", *world(4, 4)),
        MASTER_WEIGHTS, check=masters_exported_in_fp32),
    # Ulysses sequence parallelism: both ranks read the same micro-batch, each runs half of every sequence
    Row("sp2", GPT, ("parallel.sp=2", *world(2, 8))),
    Row("sp2-zero3", GPT, ("parallel.sp=2", "zero.stage=3", *world(2, 8)), resume=True),
    # sp x tp: each tp rank holds 2 of the 4 heads, Ulysses splits those over sp; stage 0 with sequence-parallel
    # tp activations (boundary all-reduce over dp x sp), stage 3 with replicated ones (FSDP2 over dp x sp)
    Row("sp2xtp2-zero0", GPT, ("parallel.sp=2", "parallel.tp=2", "zero.stage=0", "parallel.tp_sequence_parallel=true",
                               *world(4, 8))),
    Row("sp2xtp2-zero3-replicated_tp", GPT, ("parallel.sp=2", "parallel.tp=2", "zero.stage=3",
                                             "parallel.tp_sequence_parallel=false", *world(4, 8))),
    # sp x pp: every stage runs this rank's chunk at its true positions; the validation loss matches too
    Row("sp2xpp2", GPT, ("parallel.sp=2", "parallel.pp=2", *world(4, 8)), metrics=(("val/loss", 2e-5),)),
    Row("sp2xtp2xpp2", GPT, ("parallel.sp=2", "parallel.tp=2", "parallel.pp=2", *world(8, 8)), timeout=500),
    Row("sp2xpp2-llama_gqa", LLAMA_GQA, ("parallel.sp=2", "parallel.pp=2", *world(4, 8))),
    # expert parallelism: each rank holds 2 of the 4 experts of every block, tokens travel by all_to_all
    *(Row(f"ep2-zero{stage}", MOE, (f"zero.stage={stage}", "moe.ep_size=2", *world(2, 4)),
          check=every_expert_exported(), layout_line=(
              "world 2 = pp 1 x dp 2 ({}) x sp 1 x tp 1; ep 2 | data parallel: ".format(
                  "replicate 1 x shard 2" if stage == 3 else "replicate 2 x shard 1"),
              {0: "data parallel: ddp", 1: "data parallel: zero1_boundary: ZeRO-1",
               3: "data parallel: fsdp2: FSDP2 (zero.stage=3)"}[stage])) for stage in (0, 1, 3)),
    Row("ep2-ungrouped", MOE_UNGROUPED_FP32, ("moe.ep_size=2", *world(2, 4)), resume=True),
    Row("ep2-bf16_master", MOE_UNGROUPED_BF16_MASTER, ("moe.ep_size=2", "zero.stage=0", *world(2, 4)), BF16_EXPERTS,
        resume=True, check=every_expert_checkpointed),
    # world 4 = 2 expert-data-parallel replicas x ep 2: expert gradients also reduce across the replicas
    Row("dp2xep2", MOE_WORLD_4, ("moe.ep_size=2", *world(4, 2))),
    # MoE under pipelines: each stage adds its MoE layers' auxiliary-loss gradients where they arise
    Row("pp2-moe", MOE, ("parallel.pp=2", *world(2, 4), "trainer.gradient_accumulation_steps=4"),
        metrics=(("train/moe_aux_loss", 1e-6),)),
    Row("dp2xpp2xep2-moe", MOE, ("parallel.pp=2", "moe.ep_size=2", *world(4, 4), "trainer.gradient_accumulation_steps=2"),
        metrics=(("train/moe_aux_loss", 1e-6),)),
    # +experiment=gpt_3d_moe: world 8 = pp 2 x dp 2 x tp 2, 4 experts over ep 2 within each stage, their hidden widths
    # over tp 2; the export gathers each stage's experts over ep and tp. precision=fp32: the experiment's
    # precision=auto is bf16 autocast on CPUs with AMX tiles
    Row("gpt_3d_moe", MOE, ("+experiment=gpt_3d_moe", "trainer.train_batch_size=16", *world(8, 4),
                            "trainer.gradient_accumulation_steps=2", "precision=fp32"), timeout=600,
        check=every_expert_exported(block=3),
        layout_line=("world 8 = pp 2 x dp 2 (replicate 2 x shard 1) x sp 1 x tp 2; ep 2 |",)),
    # expert-tensor parallelism: each expert's hidden width sliced over tp, the partial outputs summed over tp
    Row("tp2-moe", MOE, ("parallel.tp=2", *world(2, 4), "trainer.gradient_accumulation_steps=4"), resume=True,
        check=every_expert_exported(), layout_line=("tp 2",)),
    Row("dp2xtp2xep2-moe", MOE, ("parallel.tp=2", "moe.ep_size=2", "zero.stage=3", *world(4, 4),
                                 "trainer.gradient_accumulation_steps=2"),
        layout_line=("world 4 = pp 1 x dp 2 (replicate 1 x shard 2) x sp 1 x tp 2; ep 2",)),
    # compile=blocks (and full) against the eager single process: inductor's C++ loops, eager names in the export
    Row("compile-blocks", GPT, ("compile=blocks", *world(1, 8)), COMPILED, layout_line=(COMPILE_BLOCKS,), timeout=600),
    Row("compile-blocks-activation_checkpointing", GPT, ("compile=blocks", "activation_checkpointing=full",
                                                         *world(1, 8)), COMPILED, layout_line=(COMPILE_BLOCKS,),
        timeout=600),
    Row("compile-full", GPT, ("compile=full", *world(1, 8)), COMPILED, layout_line=("compile: full model",), timeout=600),
    Row("compile-blocks-dp2-zero0", GPT, ("compile=blocks", "zero.stage=0", *world(2, 4)), COMPILED,
        layout_line=(COMPILE_BLOCKS,), timeout=600),
    Row("compile-blocks-dp2-zero3", GPT, ("compile=blocks", "zero.stage=3", *world(2, 4)), COMPILED,
        layout_line=(COMPILE_BLOCKS,), timeout=600),
    Row("compile-blocks-tp2", GPT, ("compile=blocks", "parallel.tp=2", *world(2, 8)), COMPILED,
        layout_line=(COMPILE_BLOCKS,), timeout=600),
    # MoE blocks (gating, capacity, dispatch, the experts' ModuleList inside the compiled block) against eager MoE
    Row("compile-blocks-moe", MOE_TOP2, ("compile=blocks", *world(1, 8)), COMPILED, layout_line=("compile: 4 block(s)",),
        timeout=600),
    # compression under sharding: masks and scales from whole weights, applied to every copy a strategy holds
    Row("compression-dp2-zero2", COMPRESSED, ("zero.stage=2", *world(2, 4)), check=same_entries_pruned),
    Row("compression-dp2-zero3", COMPRESSED, ("zero.stage=3", *world(2, 4)), resume=True, check=same_entries_pruned),
    Row("compression-tp2", COMPRESSED, ("parallel.tp=2", *world(2, 8)), check=same_entries_pruned),
    Row("compression-dp2xtp2-zero3", COMPRESSED, ("parallel.tp=2", "zero.stage=3", *world(4, 4)),
        check=same_entries_pruned),
    # data efficiency under a pipeline: per-layer random-LTD draws, one schedule per batch shape
    Row("pp2-data_efficiency", DATA_EFFICIENCY, ("parallel.pp=2", *world(2, 8)), metrics=(("val/loss", 2e-5),),
        check=evaluated_twice),
    # Muon over FSDP2 shards (each matrix gathered whole for the iteration, every rank keeping its shard of the result)
    # and over tensor-parallel DTensors; bf16-state AdamW's rounding independent of the sharding
    Row("muon-dp2-zero3", MUON, ("zero.stage=3", *world(2, 4)), resume=True,
        layout_line=("| optimizer: muon, state 4.",)),
    Row("muon-tp2", MUON, ("parallel.tp=2", *world(2, 8))),
    Row("adamw_bf16_state-dp2-zero3", ADAMW_BF16_STATE, ("zero.stage=3", *world(2, 4)),
        layout_line=("| optimizer: adamw, state 4 B/param (bf16 moments, stochastic rounding) |",)),
    # Hugging Face models: the transformers module wrapped per decoder layer (FSDP2 units, checkpointed layers), its
    # own tp_plan on DTensors, Ulysses around its attention interface; dsrecipes' blocks for a native architecture
    Row("hf-gemma3-dp2-zero3-activation_checkpointing", HF_GEMMA3, ("zero.stage=3", "activation_checkpointing=full",
                                                                    *world(2, 4)), resume=True,
        check=exported_for_transformers, layout_line=(GEMMA3_MODULE, ZERO_STRATEGY[3], "activation checkpointing: every block")),
    Row("hf-gemma3-tp2", HF_GEMMA3, ("parallel.tp=2", *world(2, 8)),
        layout_line=(GEMMA3_MODULE, "tensor parallel: the model's own tp plan")),
    Row("hf-gemma3-sp2", HF_GEMMA3, ("parallel.sp=2", *world(2, 8)), layout_line=("sp 2", GEMMA3_MODULE)),
    Row("hf-mixtral-dp2-zero2", HF_MIXTRAL, ("zero.stage=2", *world(2, 4)),
        layout_line=("model: transformers MixtralForCausalLM", ZERO_STRATEGY[2])),
    # LoRA: frozen base weights sharded like any parameter, the adapters' gradients and Adam state only
    Row("lora-dp2-zero3", LORA_QWEN3, ("zero.stage=3", *world(2, 4)), resume=True, check=lora_exported,
        layout_line=("peft: LoRA r 8",)),
    Row("lora-tp2", LORA_QWEN3, ("parallel.tp=2", *world(2, 8)), check=lora_exported,
        layout_line=("peft: LoRA r 8", "tp 2")),
    Row("qlora-int8-dp2-zero2", QLORA_QWEN3, ("zero.stage=2", *world(2, 4)),
        check=lambda run, reference: same_adapters(run, reference), layout_line=("frozen weights in int8",)),
    Row("lora-dp2-zero2", LORA_GEMMA3, ("zero.stage=2", *world(2, 4)), check=lora_exported,
        layout_line=("peft: LoRA r 8", ZERO_STRATEGY[2])),
    Row("dpo-lora-dp2-zero3", DPO_LORA_QWEN3, ("zero.stage=3", *world(2, 4)), resume=True, check=lora_exported,
        metrics=(("train/reward_margin", 2e-5), ("train/reward_accuracy", 1e-6))),
    # instruction data: the global-token mean over ranks and accumulation, per-document attention under FSDP2
    Row("sft-chat-documents-dp2-zero3", SFT_CHAT, ("zero.stage=3", *world(2, 4)), resume=True,
        check=first_step_within(1e-6)),
    Row("hf-qwen3-native-tp2", HF_QWEN3, ("parallel.tp=2", *world(2, 8)),
        layout_line=("model: native dsrecipes llama blocks from qwen3, head_dim 32, q/k norms",)),
)

ROW_IDS = {row.id for row in ROWS}
assert len(ROW_IDS) == len(ROWS), "row ids must be unique"


def row(row_id: str) -> Row:
    (found,) = [r for r in ROWS if r.id == row_id]
    return found
