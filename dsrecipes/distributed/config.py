"""Schema of the `zero` config group (DeepSpeed's zero_optimization).

Single-process runs accept every stage and shard nothing; the distributed work maps each stage onto
PyTorch-native sharding (see ARCHITECTURE.md section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

ZERO_STAGES = (0, 1, 2, 3)


@dataclass
class ZeroConfig:
    """stage 0: replicate; 1: shard optimizer states; 2: + gradients; 3: + parameters."""

    stage: int = 0


def validate_zero_config(cfg: ZeroConfig, prefix: str = "zero") -> None:
    if cfg.stage not in ZERO_STAGES:
        raise ValueError(f"{prefix}.stage={cfg.stage} is not valid; choose one of: {', '.join(map(str, ZERO_STAGES))}")
