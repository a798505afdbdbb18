"""parallelize: a model and a recipe in, the model the Engine runs out, every technique applied in one order.

    plan = parallelize(model, dims, cfg, precision, device, micro_batches=gas, transforms=[...])
    plan.module, plan.strategy, plan.pipeline, plan.sequence_parallel, plan.expert_parallel

The order (each step a small function below; a step whose config is off does nothing):

 1. kernel injection        kernels.backend: norms, activations, RoPE, attention, loss -> Triton ops
 2. sparse attention        sparse_attention.mode: the attention function of every attention module
    LoRA adapters           peft=lora: targeted nn.Linear wrapped, the rest frozen (dsrecipes.distributed.lora_adapters)
 3. activation checkpointing  activation_checkpointing.mode: block forwards recomputed in backward
 4. model transforms        the recipe's own (compression, random-LTD), given by the caller
 5. tensor parallel         parallel.tp: Megatron sharding of attention, MLP, embedding and LM head
 6. sequence parallel       parallel.sp: Ulysses all-to-alls around attention
 7. pipeline split          parallel.pp: this rank keeps its stages
 8. expert parallel         moe.ep_size: this rank keeps its experts
 9. float8 linears         fp8.recipe: nn.Linear -> torchao Float8Linear (CUDA only)
10. torch.compile           compile.scope: each block's forward (blocks) or the whole model's (full)
11. data-parallel strategy  zero.*: DDP / ZeRO-1 / ZeRO-2 / FSDP2 ... (dsrecipes.distributed.data_parallel)

Why this order: module-swapping steps (1-4) run on the whole, unsharded model, so tensor
parallelism shards the injected modules' parameters, Ulysses wraps the attention function the
earlier steps chose, and checkpointing wraps the block forwards that token dropping (random-LTD)
then wraps in turn (sampling outside the recomputed region). Tensor parallelism comes before the
pipeline split because stages keep the sharded blocks. Compilation comes after every step that
changes what a block computes (so the compiled code includes checkpointing, token dropping, the
sharded matmuls and the expert all-to-alls) and before data parallelism, whose hooks then stay outside
the compiled blocks. Data parallelism comes last, over whatever parameters the earlier steps left on
this rank (torchtitan's order).

Both entry paths go through here: the recipe Trainer (a dsrecipes GPT) and `dsrecipes.initialize` (any
nn.Module). A step that cannot apply to the module it is given says so: a warning naming the group
when it would only be a missed optimisation (kernels, sparse attention, activation checkpointing,
moe), a ValueError when running without it would change what is computed (tp, sp, pp).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from dsrecipes.distributed.activation_checkpoint import apply_activation_checkpointing
from dsrecipes.distributed.data_parallel import DataParallelStrategy, GradientLayout, build_strategy
from dsrecipes.distributed.expert_parallel import ExpertParallel, setup_expert_parallel
from dsrecipes.distributed.float8 import apply_float8, float8_post_step_hooks
from dsrecipes.distributed.hf_sequence_parallel import install_hf_ulysses
from dsrecipes.distributed.hf_tensor_parallel import apply_hf_tensor_parallel
from dsrecipes.distributed.lora_adapters import adapter_seed, apply_recipe_lora, lora_materialize
from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.pipeline_parallel import PipelineParallel
from dsrecipes.distributed.sequence_parallel import SequenceParallel
from dsrecipes.distributed.tensor_parallel import apply_tensor_parallel
from dsrecipes.distributed.torch_compile import apply_compile
from dsrecipes.models.decoder_layers import transformers_model
from dsrecipes.models.kernel_injection import inject_kernels
from dsrecipes.models.layers import CausalSelfAttention
from dsrecipes.models.moe import MoELayer
from dsrecipes.models.sparse_attention import apply_sparse_attention

log = logging.getLogger("dsrecipes")

ModelTransform = Callable[[nn.Module], nn.Module]


@dataclass
class ParallelPlan:
    """What parallelize produced: the module to run, its data-parallel strategy and the model-parallel parts."""

    module: nn.Module
    dims: ParallelDims
    strategy: DataParallelStrategy
    pipeline: PipelineParallel | None = None
    sequence_parallel: SequenceParallel | None = None
    expert_parallel: ExpertParallel | None = None
    applied: list[str] = field(default_factory=list)  # one line per step that changed the model
    # what the engine calls after each optimizer step a step of the plan needs (fp8's scale precompute)
    post_step_hooks: list[Callable[[], object]] = field(default_factory=list)
    # the parts a step adds to the run's layout line (dsrecipes.training.layout), after the kernels part (fp8's line)
    layout_parts: list[str] = field(default_factory=list)
    # the layout line's model part: which way a Hugging Face checkpoint runs (native blocks or the transformers module)
    model_description: str | None = None
    # tensor parallelism from a Hugging Face module's own tp plan (which gathers its logits), not dsrecipes' GPT's
    own_tp_plan: bool = False

    @property
    def loss_parallel(self) -> bool:
        """Tensor parallelism of dsrecipes' GPT keeps the logits vocab-sharded: forward and backward run under
        loss_parallel (a Hugging Face module's own plan gathers its logits: a plain loss)."""
        return self.dims.tp > 1 and not self.own_tp_plan

    # The layout questions the rest of the code asks, answered here so that no caller checks pp / ep itself.
    @property
    def holds_every_parameter(self) -> bool:
        """Whether this rank's module has every parameter of the model: not when pipeline stages or experts live on
        other ranks (an optimizer rebuilt by name, or whole-model weights loaded, must then allow missing names)."""
        return self.pipeline is None and self.expert_parallel is None

    @property
    def separate_forward_backward(self) -> bool:
        """Whether a step runs one forward phase and then one backward phase that a profiler can time apart; a
        pipeline schedule interleaves the micro-batches' forwards and backwards."""
        return self.pipeline is None

    def describe_model_parallel(self, tp_sequence_parallel: bool) -> list[str]:
        """The layout line's model-parallel parts (dsrecipes.training.layout): the pipeline's schedule, and how tensor
        parallelism holds the activations between blocks (tp_sequence_parallel: parallel.tp_sequence_parallel)."""
        parts = [self.pipeline.describe()] if self.pipeline is not None else []
        if self.dims.tp > 1 and self.own_tp_plan:
            parts.append("tensor parallel: the model's own tp plan, replicated activations")
        elif self.dims.tp > 1:
            parts.append(f"tensor parallel: {'sequence-parallel' if tp_sequence_parallel else 'replicated'} activations")
        return parts

    @property
    def holds_every_layer(self) -> bool:
        """Whether this rank's module has every layer: not under pipeline parallelism, where a stage loads its own
        part of a checkpoint that holds the whole model."""
        return self.pipeline is None

    def full_model_state(self) -> dict:
        """The whole model's weights at full precision on CPU, under the single-process model's names.

        A collective where parameters are sharded or split (FSDP2, experts, pipeline stages): every rank calls it.
        """
        strategy, experts = self.strategy, self.expert_parallel
        if self.pipeline is not None:  # every stage's tensors (fp32 masters where kept; experts gathered first)
            masters = strategy.masters
            local = masters.master_state_dict(strategy.unwrapped) if masters is not None else None
            gather = (lambda state: experts.gather_full(state, strategy.unwrapped)) if experts is not None else None
            return self.pipeline.full_state_dict(local, gather_local=gather)
        with strategy.states_in_memory(writes=False):
            state = strategy.full_state_dict()
        if experts is not None:
            state = experts.gather_full(state, strategy.unwrapped)
        return state

    def to_checkpoint(self, model_state: dict, optimizer_state: dict) -> tuple[dict, dict]:
        """(model, optimizer) state dicts under the names and shapes a sharded (DCP) checkpoint stores: experts as
        global DTensor views of this rank's shards (any stored expert-parallel degree loads); unchanged otherwise."""
        if self.expert_parallel is not None:
            return self.expert_parallel.to_checkpoint(model_state, optimizer_state)
        return model_state, optimizer_state

    def outside_shape_inference(self, context_factory: Callable) -> None:
        """Run `context_factory()` around every forward that only infers shapes (a pipeline schedule's metadata
        pass), so that it takes no random draw or step; nothing to do without a pipeline."""
        if self.pipeline is not None:
            self.pipeline.metadata_pass_contexts.append(context_factory)


def parallelize(model: nn.Module, dims: ParallelDims, cfg, precision, device: torch.device, micro_batches: int = 1,
                transforms: list[ModelTransform] | tuple = (), materialize=None) -> ParallelPlan:
    """Apply every configured technique to `model` (already on `device`) in the documented order.

    cfg: the RootConfig (its kernels, sparse_attention, activation_checkpointing, parallel, moe and
    zero groups are read); precision: the run's Precision (compute dtype, master weights);
    micro_batches: gradient accumulation steps (the pipeline's micro-batches);
    materialize: for a model whose parameters are on the meta device, materialize(model, device) gives them
    storage and their values (dsrecipes.models.hf_loading): called after the data-parallel wrap where the
    strategy shards meta parameters (FSDP2: each rank then holds only its shards), else just before it.
    """
    applied: list[str] = []
    _inject_kernels(model, cfg.kernels.backend, applied)
    _sparse_attention(model, cfg.sparse_attention, applied)
    if getattr(cfg, "peft", None) is not None and cfg.peft.enabled:
        apply_recipe_lora(model, cfg, applied)
        if materialize is not None:
            materialize = lora_materialize(materialize, adapter_seed(cfg), cfg.peft)
    _activation_checkpointing(model, cfg.activation_checkpointing, applied)
    for transform in transforms:
        model = transform(model)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    own_tp_plan = _tensor_parallel(model, dims, cfg.parallel, applied)
    _keep_frozen(model, frozen)
    sequence_parallel = _sequence_parallel(model, dims, applied)
    pipeline = None
    if dims.pp > 1:
        pipeline = _pipeline_split(model, dims, cfg.parallel, micro_batches, device, sequence_parallel)
        model = pipeline.local_module(model)
        applied.append(f"pipeline: {dims.pp} ranks, schedule {cfg.parallel.pp_schedule}, this rank's blocks "
                       f"{[list(r) for r in pipeline.block_ranges]}")
    expert_parallel = _expert_parallel(model, dims, cfg.moe, applied)
    float8 = apply_float8(model, cfg.fp8)  # float8 linears: before FSDP2 (float8 all-gather) and compile
    applied.extend(float8)
    _compile(model, cfg, applied)
    layout = GradientLayout(expert_parallel=expert_parallel, pipeline=pipeline)
    strategy = build_strategy(cfg.zero, dims, precision, device, layout, optimizer=_optimizer_name(cfg))
    ignored = expert_parallel.ignored_params if expert_parallel is not None else None
    sharded_load = materialize is not None and strategy.wraps_meta_parameters
    if materialize is not None and not sharded_load:
        materialize(model, strategy.parameter_device)
    module = strategy.wrap(model, ignored_params=ignored)
    if sharded_load:
        materialize(model, strategy.parameter_device)  # FSDP2 shards wrap the model in place
    for line in applied:
        log.info(line)
    return ParallelPlan(module, dims, strategy, pipeline, sequence_parallel, expert_parallel, applied,
                        post_step_hooks=float8_post_step_hooks(module, cfg.fp8), layout_parts=float8[:1],
                        own_tp_plan=own_tp_plan)


def _keep_frozen(model: nn.Module, frozen: set[str]) -> None:
    """Parameters frozen before tensor parallelism stay frozen: torch's SequenceParallel style (norms) re-creates
    its module's parameters as replicated DTensors that require grad, which would train a LoRA run's frozen norms."""
    for name, param in model.named_parameters():
        if name in frozen and param.requires_grad:
            param.requires_grad_(False)


def _optimizer_name(cfg) -> str | None:
    """The optimizer option's name (the onebit strategy is chosen by it), if the config has one."""
    optimizer = getattr(cfg, "optimizer", None)
    return getattr(optimizer, "name", None)


# ---------------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------------


def _inject_kernels(model: nn.Module, backend: str, applied: list[str]) -> None:
    lines = inject_kernels(model, str(backend))
    replaced = [line for line in lines if line.startswith("replaced")]
    if str(backend) == "triton" and not replaced:
        warnings.warn(f"kernels.backend=triton changed nothing in {type(model).__name__}: it has no nn.LayerNorm, "
                      "dsrecipes RMSNorm, GeluMLP, SwiGLUMLP, CausalSelfAttention or GPT loss to swap", stacklevel=3)
    applied.extend(f"kernels: {line}" for line in lines)


def _attention_modules(model: nn.Module) -> list[CausalSelfAttention]:
    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


def _sparse_attention(model: nn.Module, sa_cfg, applied: list[str]) -> None:
    if str(sa_cfg.mode) == "none":
        return
    attention = _attention_modules(model)
    if not attention:
        warnings.warn(f"sparse_attention.mode={sa_cfg.mode} is ignored: {type(model).__name__} has no dsrecipes "
                      "CausalSelfAttention module to route through block-sparse attention", stacklevel=3)
        return
    count = apply_sparse_attention(model, sa_cfg, attention[0].n_head)
    applied.append(f"sparse attention: {sa_cfg.mode} layout, block {sa_cfg.block}, impl {sa_cfg.impl}, "
                   f"{count} attention module(s)")


def _activation_checkpointing(model: nn.Module, ac_cfg, applied: list[str]) -> None:
    if str(ac_cfg.mode) == "none":
        return
    count = apply_activation_checkpointing(model, ac_cfg)
    if count == 0:
        warnings.warn(f"activation_checkpointing.mode={ac_cfg.mode} is ignored: {type(model).__name__} has no "
                      "nn.ModuleList of blocks to checkpoint", stacklevel=3)
        return
    offload = ", saved tensors on CPU" if ac_cfg.cpu_offload else ""
    applied.append(f"activation checkpointing: {ac_cfg.mode}, {count} block(s){offload}")


def _require_gpt(model: nn.Module, key: str, value) -> None:
    from dsrecipes.models.gpt import GPT

    if not isinstance(model, GPT):
        raise ValueError(f"{key}={value} needs a dsrecipes GPT (its sharding plan names the GPT's modules); "
                         f"got {type(model).__name__}. Use {key}=1 for your own module")


def _tensor_parallel(model: nn.Module, dims: ParallelDims, par_cfg, applied: list[str]) -> bool:
    """Shard the model over tp; whether by a Hugging Face module's own plan (else dsrecipes' GPT plan, whose logits
    stay vocab-sharded for a vocab-parallel loss)."""
    if dims.tp == 1:
        return False
    hf = transformers_model(model)
    if hf is not None:  # a Hugging Face module: its own base_model_tp_plan
        count = apply_hf_tensor_parallel(hf, dims.get_mesh("tp"))
        applied.append(f"tensor parallel: tp {dims.tp}, {type(hf).__name__}'s own plan on {count} module(s), "
                       "replicated activations")
        return True
    _require_gpt(model, "parallel.tp", dims.tp)
    apply_tensor_parallel(model, dims.get_mesh("tp"), sequence_parallel=par_cfg.tp_sequence_parallel)
    activations = "sequence-parallel" if par_cfg.tp_sequence_parallel else "replicated"
    applied.append(f"tensor parallel: tp {dims.tp}, {activations} activations, vocab-parallel loss")
    return False


def _sequence_parallel(model: nn.Module, dims: ParallelDims, applied: list[str]) -> SequenceParallel | None:
    if dims.sp == 1:
        return None
    hf = transformers_model(model)
    if hf is not None and getattr(model, "hf", None) is hf:  # the recipe's HFCausalLM passes the chunk's positions
        sequence_parallel = SequenceParallel(dims.get_mesh("sp").get_group())
        count = install_hf_ulysses(hf, sequence_parallel.group)
        applied.append(f"sequence parallel (Ulysses): sp {dims.sp}, each rank holds 1/{dims.sp} of every sequence, "
                       f"{count} attention module(s) through transformers' attention registry")
        return sequence_parallel
    if not _attention_modules(model):
        raise ValueError(f"parallel.sp={dims.sp} needs dsrecipes CausalSelfAttention modules to wrap in Ulysses "
                         f"all-to-alls; {type(model).__name__} has none. Use parallel.sp=1 for your own module")
    sequence_parallel = SequenceParallel(dims.get_mesh("sp").get_group())
    sequence_parallel.install(model)
    applied.append(f"sequence parallel (Ulysses): sp {dims.sp}, each rank holds 1/{dims.sp} of every sequence")
    return sequence_parallel


def _pipeline_split(model: nn.Module, dims: ParallelDims, par_cfg, micro_batches: int, device: torch.device,
                    sequence_parallel: SequenceParallel | None = None) -> PipelineParallel:
    _require_gpt(model, "parallel.pp", dims.pp)
    all_pipelines = dims.world_mesh.mesh.reshape(dims.pp, -1).t().tolist()
    return PipelineParallel(model, dims.get_mesh("pp").get_group(), par_cfg.pp_schedule, micro_batches,
                            par_cfg.pp_partition, device, all_pipelines=all_pipelines,
                            sequence_parallel=sequence_parallel)


def _compile(model: nn.Module, cfg, applied: list[str]) -> None:
    compile_cfg = getattr(cfg, "compile", None)
    if compile_cfg is None or str(compile_cfg.scope) == "none":
        return
    lines = apply_compile(model, compile_cfg)
    if not lines:
        warnings.warn(f"compile={compile_cfg.scope} is ignored: {type(model).__name__} has no nn.ModuleList of blocks "
                      "to compile (use compile=full for the whole module)", stacklevel=3)
    applied.extend(lines)


def _expert_parallel(model: nn.Module, dims: ParallelDims, moe_cfg, applied: list[str]) -> ExpertParallel | None:
    if moe_cfg.enabled and not any(isinstance(m, MoELayer) for m in model.modules()):
        warnings.warn(f"moe.num_experts={moe_cfg.num_experts} is ignored: {type(model).__name__} has no dsrecipes "
                      "MoELayer (the moe group shapes the GPT the recipe builds)", stacklevel=3)
        return None
    expert_parallel = setup_expert_parallel(model, dims)
    if expert_parallel is not None:
        applied.append(f"expert parallel: ep {dims.ep}, {len(expert_parallel.params)} expert tensor(s) on this rank")
    return expert_parallel
