"""MoEConfig: the `moe` config group, DeepSpeed-MoE's knobs as one typed dataclass.

    python -m dsrecipes moe=top2 moe.num_experts=8 moe.ep_size=2 launcher.nproc_per_node=2

num_experts=0 means a dense model (the `none` option). Field names follow `deepspeed.moe.layer.MoE`
(k, capacity_factor, eval_capacity_factor, min_capacity, drop_tokens, use_rts, noisy_gate_policy,
use_residual, ep_size, top2_2nd_expert_sampling); the layer placement keys follow Megatron-DeepSpeed
(`expert_interval`) plus an explicit `layers` list; the loss coefficients are the trainer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dsrecipes.models.config import ModelConfig
from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, check_choice, enum_values
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import COUNT, NON_NEGATIVE, POSITIVE, POSITIVE_INT, at_least, in_range, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts


class NoisyGatePolicy(ConfigEnum):
    """DeepSpeed's noisy_gate_policy (its None / Jitter / RSample): noise on the gate input, or Gumbel top-1."""

    none = "none"
    jitter = "jitter"
    rsample = "rsample"


class DropPolicy(ConfigEnum):
    """top-k (k > 2) over capacity: keep the highest-gate tokens or the first ones."""

    probs = "probs"
    position = "position"


class MoEDispatch(ConfigEnum):
    """How tokens reach their experts: index permute, fused Triton gather kernels, or the dense einsum reference."""

    torch = "torch"
    triton = "triton"
    einsum = "einsum"


NOISY_GATE_POLICIES = enum_values(NoisyGatePolicy)
DROP_POLICIES = enum_values(DropPolicy)
DISPATCH_BACKENDS = enum_values(MoEDispatch)


def _sp_moe(root, dims):
    if dims.sp > 1 and root.moe.enabled:
        return f"parallel.sp={dims.sp} with moe.num_experts={root.moe.num_experts} is not supported yet"
    return None


@dataclass
class MoEConfig:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, moe: not moe.enabled, lambda root, path: "moe is off (moe.num_experts=0); choose an moe "
                 "option (e.g. moe=top2) or set moe.num_experts", but=("num_experts",)),
    )

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("sp with MoE", "not implemented yet", _sp_moe),
        Supported("moe.ep_size > 1 x dp, any zero.stage", "supported (stage 1: zero1_boundary, experts partitioned "
                  "over their expert-data-parallel group)", ("ep2-zero0", "ep2-zero1", "ep2-zero3", "ep2-ungrouped",
                                                              "dp2xep2")),
        Supported("moe.ep_size > 1 with fp32 master weights at zero.stage 0", "supported: full-state checkpoints and "
                  "exports gather every rank's experts (fp32 masters and optimizer moments)", ("ep2-bf16_master",)),
        Supported("tp with MoE (dp = 1, or tp x dp at zero.stage 2/3, ep over dp)", "supported: expert-tensor parallelism "
                  "(each expert's hidden width sliced over tp, ep groups within one tp rank)",
                  ("tp2-moe", "dp2xtp2xep2-moe")),
        Supported("pp with MoE (any moe.ep_size, with or without tp)", "supported: each stage adds its MoE layers' "
                  "auxiliary-loss gradients where they arise; expert groups within each stage; the layout of "
                  "`+experiment=gpt_3d_moe`", ("pp2-moe", "dp2xpp2xep2-moe", "gpt_3d_moe")),
    )

    num_experts: int = ranged(0, COUNT)  # 0 = dense model, no MoE layers
    k: int = ranged(1, POSITIVE_INT)  # experts per token: 1 (Switch), 2 (GShard), or more (top-k)
    capacity_factor: float = ranged(1.0, POSITIVE)  # training capacity per expert = ceil(tokens/E * capacity_factor * k)
    eval_capacity_factor: float = ranged(1.0, POSITIVE)  # the same at evaluation
    min_capacity: int = ranged(4, COUNT)  # capacity never below this (DeepSpeed's MoE passes 4)
    drop_tokens: bool = True  # false: capacity = the busiest expert's load, nothing is dropped
    use_rts: bool = True  # top-1: random token selection decides who is dropped (else: first come)
    drop_policy: DropPolicy = DropPolicy.probs  # top-k (k>2): keep the highest-gate tokens ("probs") or the first ("position")
    top2_2nd_expert_sampling: bool = True  # top-2: pick the second expert with Gumbel noise while training
    # none | jitter (noise on the gate input) | rsample (Gumbel, top-1 only)
    noisy_gate_policy: NoisyGatePolicy = NoisyGatePolicy.none
    use_residual: bool = False  # PR-MoE: dense MLP + experts mixed by a learned coefficient
    expert_interval: int = ranged(1, POSITIVE_INT)  # MoE in every k-th block (blocks k-1, 2k-1, ...); 1 = every block
    layers: list[int] = field(default_factory=list, metadata=in_range(COUNT))  # explicit block indices; overrides expert_interval
    # expert hidden size; None = the model's MLP size
    d_ff: int | None = ranged(None, at_least(1, nullable=True, null_means="the model's MLP size"))
    aux_loss_coef: float = ranged(0.01, NON_NEGATIVE)  # load-balancing loss coefficient (added to the LM loss by the trainer)
    z_loss_coef: float = ranged(0.0, NON_NEGATIVE)  # router z-loss coefficient (ST-MoE); 0 = off
    ep_size: int = ranged(1, POSITIVE_INT)  # expert-parallel degree: experts sharded over this many ranks
    dispatch: MoEDispatch = MoEDispatch.torch  # torch (index permute) | triton (fused gather kernels) | einsum (dense reference)

    @property
    def enabled(self) -> bool:
        return self.num_experts > 0

    def moe_layer_ids(self, n_layer: int) -> list[int]:
        """Indices of the blocks whose MLP is an MoE layer."""
        if not self.enabled:
            return []
        if self.layers:
            return sorted(set(self.layers))
        return [i for i in range(n_layer) if (i + 1) % self.expert_interval == 0]

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks, against the model and the world size."""
        validate_moe_config(self, facts.root.model, facts.world)


def validate_moe_config(cfg: MoEConfig, model: ModelConfig, world_size: int = 1, prefix: str = "moe") -> None:
    """Raise ValueError naming the key, its value and what would be valid (before any work starts)."""
    if cfg.num_experts < 0:
        raise ValueError(f"{prefix}.num_experts={cfg.num_experts} must be >= 0 (0 = dense model)")
    if not cfg.enabled:
        return
    if not 1 <= cfg.k <= cfg.num_experts:
        raise ValueError(f"{prefix}.k={cfg.k} must be between 1 and {prefix}.num_experts={cfg.num_experts}")
    for key in ("capacity_factor", "eval_capacity_factor"):
        if getattr(cfg, key) <= 0:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} must be > 0")
    if cfg.min_capacity < 0:
        raise ValueError(f"{prefix}.min_capacity={cfg.min_capacity} must be >= 0")
    check_choice(f"{prefix}.noisy_gate_policy", cfg.noisy_gate_policy, NOISY_GATE_POLICIES)
    check_choice(f"{prefix}.drop_policy", cfg.drop_policy, DROP_POLICIES)
    check_choice(f"{prefix}.dispatch", cfg.dispatch, DISPATCH_BACKENDS)
    if cfg.noisy_gate_policy == "rsample" and cfg.k != 1:
        raise ValueError(
            f"{prefix}.noisy_gate_policy=rsample applies to top-1 gating only (k={cfg.k}); "
            "use jitter, or none (top-2 samples its second expert with top2_2nd_expert_sampling)"
        )
    if cfg.expert_interval < 1:
        raise ValueError(f"{prefix}.expert_interval={cfg.expert_interval} must be >= 1")
    bad = [i for i in cfg.layers if not 0 <= i < model.n_layer]
    if bad:
        raise ValueError(f"{prefix}.layers={list(cfg.layers)} has {bad} outside the model's blocks 0..{model.n_layer - 1}")
    if not cfg.moe_layer_ids(model.n_layer):
        raise ValueError(
            f"{prefix}.expert_interval={cfg.expert_interval} places no MoE layer in a {model.n_layer}-block model"
        )
    if cfg.d_ff is not None and cfg.d_ff <= 0:
        raise ValueError(f"{prefix}.d_ff={cfg.d_ff} must be > 0 (or null: the model's MLP size)")
    for key in ("aux_loss_coef", "z_loss_coef"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} must be >= 0")
    if cfg.ep_size < 1:
        raise ValueError(f"{prefix}.ep_size={cfg.ep_size} must be >= 1")
    if cfg.num_experts % cfg.ep_size:
        raise ValueError(
            f"{prefix}.num_experts={cfg.num_experts} is not divisible by {prefix}.ep_size={cfg.ep_size}: "
            "every expert-parallel rank holds num_experts/ep_size experts"
        )
    if world_size % cfg.ep_size:
        raise ValueError(
            f"{prefix}.ep_size={cfg.ep_size} must divide the world size {world_size} "
            f"(valid: {', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)})"
        )
