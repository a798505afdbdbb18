"""The two runs of a verify: the candidate (the recipe as configured) and its reference, as override lists.

Both runs get the same forced keys (verify.steps steps, every step logged to metrics.jsonl, no evaluation, no text
sample or loss-curve PNG, the final export written) and the same alignment of what is random by design (dropout,
MoE gate noise, random-LTD at data-parallel world > 1): `Plan.adjustments` says each one. The default reference is
the recipe in one process: every layout key reset (world 1, ZeRO 0 without offload, tp = pp = sp = ep = 1, no
compile), fp32 unless verify.reference_precision=same, and the same global batch at the candidate's micro-batch
size, the accumulation grown by the data-parallel world (rank r's i-th micro-batch at dp N is the one process's
(N*i + r)-th, so MoE gating and capacity see the same token groups), as the layout table's references do.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from dsrecipes.verify.config import COMPILED, FP32, SIXTEEN_BIT, Tolerance, VerifyConfig

# Test-only: overrides appended to the candidate run alone, standing in for a layout that computes something else
# (tests/integration/test_verify.py). Not a user feature: a user who wants another reference sets verify.reference.
INJECT_ENV = "DSRECIPES_VERIFY_TEST_INJECT"

# every key of a layout: what the single-process reference resets
SINGLE_PROCESS = (
    "launcher.nproc_per_node=1", "launcher.nnodes=1", "zero.stage=0", "zero.offload_optimizer=none",
    "zero.offload_param=none", "zero.hybrid_shard_size=0", "zero.zero_quantized_weights=false",
    "zero.zero_quantized_gradients=false", "zero.zero_hpz_partition_size=1", "parallel.tp=1", "parallel.pp=1",
    "parallel.sp=1", "moe.ep_size=1", "compile=none",
)


@dataclass
class Plan:
    candidate: list[str]
    reference: list[str]
    candidate_world: int
    reference_world: int
    tolerance: Tolerance
    tolerance_reason: str
    adjustments: list[str] = field(default_factory=list)  # one line per key verify changed, and why
    logger: dict = field(default_factory=dict)  # the recipe's own sinks (tensorboard, wandb, ...) for verify's report
    name: str = "gpt"


def merged(*parts) -> list[str]:
    """Override lists joined left to right; a later value of a key replaces the earlier one in place."""
    out: dict[str, str] = {}
    for part in parts:
        for override in part:
            key = override.split("=", 1)[0].lstrip("+~")
            out.pop(key, None) if override.startswith("~") else out.__setitem__(key, override)
    return list(out.values())


def forced(steps: int) -> list[str]:
    """What both runs set so that the comparison has every step and the final weights (and nothing else is paid)."""
    return [f"trainer.max_steps={steps}", "trainer.log_interval=1", "trainer.eval_interval=0",
            "trainer.sample_tokens=0", "trainer.loss_curve=false", "trainer.progress_bar=false", "trainer.resume=null",
            "checkpoint.interval=0", "checkpoint.save_final=false", "checkpoint.export_safetensors=true",
            "logger.jsonl=true", "logger.tensorboard=false", "logger.wandb=false"]


def aligned(cfg, dp_world: int) -> tuple[list[str], list[str]]:
    """Known-expected differences switched off in both runs: (overrides, one explanation per override)."""
    keys, said = [], []
    if float(cfg.model.dropout) > 0:
        keys.append("model.dropout=0.0")
        said.append(f"model.dropout={cfg.model.dropout} -> 0 in both runs: each rank draws its own dropout masks "
                    "(embedding, attention and residual dropout), so masks differ with the layout")
    moe = cfg.moe
    if int(moe.num_experts) > 0:
        if str(moe.noisy_gate_policy) != "none":
            keys.append("moe.noisy_gate_policy=none")
            said.append(f"moe.noisy_gate_policy={moe.noisy_gate_policy} -> none in both runs: gate noise is drawn "
                        "per rank")
        if int(moe.k) == 2 and bool(moe.top2_2nd_expert_sampling):
            keys.append("moe.top2_2nd_expert_sampling=false")
            said.append("moe.top2_2nd_expert_sampling=true -> false in both runs: the second expert's Gumbel noise "
                        "is drawn per rank")
        if int(moe.k) == 1 and bool(moe.use_rts):
            keys.append("moe.use_rts=false")
            said.append("moe.use_rts=true -> false in both runs: random token selection draws per rank")
    ltd = cfg.data_efficiency.get("random_ltd") if "data_efficiency" in cfg else None
    if ltd is not None and bool(ltd.get("enabled", False)):
        if dp_world > 1:
            keys.append("data_efficiency.random_ltd.enabled=false")
            said.append(f"data_efficiency.random_ltd -> off in both runs: its token draws are seeded by data-parallel "
                        f"rank, and the candidate has {dp_world} data-parallel ranks where the reference has 1")
        else:
            said.append("data_efficiency.random_ltd kept: at data-parallel world 1 its draws are seeded by (seed, "
                        "step, layer) alike in both runs (pipeline and tensor-parallel peers draw the same)")
    if str(cfg.compile.scope) != "none":
        said.append(f"compile={cfg.compile.scope}: compiled code draws random numbers from inductor's generator, not "
                    "eager torch's; with dropout and gate noise off nothing random is left, and the tolerance is "
                    "the compiled one (inductor sums in another order)")
    return keys, said


def tolerance_for(candidate_cfg, reference_precision: str, config: VerifyConfig) -> tuple[Tolerance, str]:
    dtype = str(candidate_cfg.precision.dtype)
    compiled = str(candidate_cfg.compile.scope) != "none"
    if reference_precision == "fp32" or dtype == "fp32":
        base, why = (COMPILED, "compiled against eager fp32") if compiled else (FP32, "fp32 reference")
        if dtype != "fp32":
            why += f" (the candidate's precision={dtype} is held to it: 16-bit rounding counts as a difference; " \
                   "verify.reference_precision=same checks the layout alone)"
    else:
        base, why = SIXTEEN_BIT, f"{dtype} in both runs"
    if config.loss_atol is not None or config.params_atol is not None:
        base = Tolerance(base.loss if config.loss_atol is None else config.loss_atol,
                         base.params if config.params_atol is None else config.params_atol)
        why += ", overridden by verify.loss_atol / verify.params_atol"
    return base, why


def shrunk(cfg) -> tuple[list[str], str]:
    """A smaller model of the same family that keeps every axis of the layout valid: (overrides, what changed).

    n_head (and n_kv_head) stay, so tp x sp still divides them; the head dimension drops to at most 16; the layers
    drop to what the pipeline (two stages per rank when interleaved) and the MoE placement need."""
    model, par, moe = cfg.model, cfg.parallel, cfg.moe
    if model.get("path"):
        raise ValueError(f"verify.shrink=true with model.path={model.path}: pretrained weights have their shape; "
                         "verify the recipe's own model (verify.shrink=false)")
    stages = int(par.pp) * (2 if str(par.pp_schedule) == "interleaved_1f1b" else 1)
    layers = max(2, stages)
    if int(moe.num_experts) > 0:
        needed = (max(moe.layers) + 1) if moe.layers else int(moe.expert_interval)
        layers = max(layers, needed)
    layers = -(-layers // stages) * stages
    n_layer = min(int(model.n_layer), layers)
    n_head = int(model.n_head)
    head_dim = min(int(model.d_model) // n_head, 16)
    d_model = n_head * head_dim
    out = [f"model.n_layer={n_layer}", f"model.d_model={d_model}"]
    if model.d_ff:
        out.append(f"model.d_ff={min(int(model.d_ff), 4 * d_model)}")
    if int(moe.num_experts) > 0 and moe.d_ff:
        out.append(f"moe.d_ff={min(int(moe.d_ff), 4 * d_model)}")
    said = (f"shrink: model.n_layer {model.n_layer} -> {n_layer}, model.d_model {model.d_model} -> {d_model} "
            f"(n_head {n_head} kept: tp {par.tp} x sp {par.sp} still divide it; pipeline stages {stages})")
    return out, said


def build_plan(recipe: list[str], config: VerifyConfig, compose, check_train_job) -> Plan:
    """The candidate's and the reference's overrides. compose(overrides) -> DictConfig and check_train_job(cfg) ->
    (root, batch, nproc, joined) are the training CLI's (passed in so the unit tests run without torch's launcher)."""
    cfg = compose(recipe)
    _, batch, nproc, _ = check_train_job(cfg)  # a refused layout: the training CLI's ValueError, before any work
    adjustments = []
    base = list(recipe)
    if config.shrink:
        keys, said = shrunk(cfg)
        base = merged(base, keys)
        adjustments.append(said)
        cfg = compose(base)
        _, batch, nproc, _ = check_train_job(cfg)
    keys, said = aligned(cfg, batch.dp_world_size)
    adjustments += said
    candidate = merged(base, forced(config.steps), keys)
    injected = shlex.split(os.environ.get(INJECT_ENV, ""))
    if injected:
        candidate = merged(candidate, injected)
        adjustments.append(f"test hook {INJECT_ENV}: the candidate alone also runs {' '.join(injected)}")
    precision_keys: list[str] = []
    if config.reference_precision == "fp32":
        precision_keys = ["precision=fp32"]
    if config.reference == "single":
        layout = [*SINGLE_PROCESS, *precision_keys, f"trainer.train_batch_size={batch.train_batch_size}",
                  f"trainer.train_micro_batch_size_per_gpu={batch.micro_batch_size}",
                  f"trainer.gradient_accumulation_steps={batch.gradient_accumulation_steps * batch.dp_world_size}"]
    else:
        layout = [*precision_keys, *shlex.split(config.reference)]
    # the recipe's own precision.* / compile.* keys would win over the groups the reference selects
    reset = ("precision.", "compile.") if config.reference == "single" and precision_keys else \
        ("compile.",) if config.reference == "single" else ()
    kept = [o for o in base if not o.lstrip("+").startswith(reset)] if reset else base
    reference = merged(kept, forced(config.steps), keys, layout)
    reference_cfg = compose(reference)
    _, _, reference_nproc, _ = check_train_job(reference_cfg)
    tolerance, why = tolerance_for(cfg, config.reference_precision, config)
    if str(reference_cfg.precision.dtype) != "fp32" and config.reference_precision == "fp32":
        raise ValueError(f"verify.reference={config.reference!r} sets a precision; use verify.reference_precision")
    sinks = {key: bool(cfg.logger.get(key)) for key in ("tensorboard", "wandb")}
    return Plan(candidate, reference, int(nproc), int(reference_nproc), tolerance, why, adjustments,
                {**sinks, "config": cfg.logger}, str(cfg.name))
