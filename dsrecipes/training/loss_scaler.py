"""Loss scaling for fp16 with DeepSpeed's exact rules (deepspeed/runtime/fp16/loss_scaler.py semantics).

Dynamic scaling (fp16.loss_scale=0): start at 2**initial_scale_power; on an overflow either spend
one unit of hysteresis (scale unchanged) or, when hysteresis is exhausted, halve the scale (not
below min_loss_scale); after loss_scale_window consecutive clean iterations since the last overflow,
double it (refilling hysteresis). consecutive_hysteresis refills hysteresis on every clean
iteration. Every overflowing step is skipped by the engine, whether or not the scale moved.
Static scaling (loss_scale>0) never changes. Unlike DeepSpeed, hitting the minimum scale can be
configured to warn and keep going instead of raising.
"""

from __future__ import annotations

import warnings


class LossScaleAtMinimumError(FloatingPointError):
    """An overflow with the loss scale already at min_loss_scale (and raising configured)."""


class StaticLossScaler:
    dynamic = False

    def __init__(self, scale: float):
        self.cur_scale = float(scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        """A static scale never moves; overflowing steps are still skipped by the engine."""

    def state_dict(self) -> dict:
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, state: dict) -> None:
        self.cur_scale = state["cur_scale"]


class DynamicLossScaler:
    dynamic = True

    def __init__(
        self,
        init_scale: float = 2.0**16,
        scale_window: int = 1000,
        min_scale: float = 1.0,
        delayed_shift: int = 2,
        consecutive_hysteresis: bool = False,
        raise_error_at_min_scale: bool = True,
        scale_factor: float = 2.0,
    ):
        self.cur_scale = float(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = float(min_scale)
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        """Advance one iteration (called once per optimizer step, overflowing or not)."""
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    message = (
                        f"fp16 loss scale is already at its minimum ({self.min_scale}) and gradients still "
                        "overflow; the model or learning rate is likely diverging (lower the lr, use bf16, "
                        "or set precision.raise_error_at_min_scale=false to keep skipping steps)"
                    )
                    if self.raise_error_at_min_scale:
                        raise LossScaleAtMinimumError(message)
                    warnings.warn(message, stacklevel=2)
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if stable_interval > 0 and stable_interval % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def state_dict(self) -> dict:
        keys = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def build_loss_scaler(cfg) -> StaticLossScaler | DynamicLossScaler | None:
    """The scaler for precision config `cfg`: fp16 only (bf16 and fp32 need none)."""
    if cfg.dtype != "fp16":
        return None
    if cfg.loss_scale > 0:
        return StaticLossScaler(cfg.loss_scale)
    return DynamicLossScaler(
        init_scale=2.0**cfg.initial_scale_power,
        scale_window=cfg.loss_scale_window,
        min_scale=cfg.min_loss_scale,
        delayed_shift=cfg.hysteresis,
        consecutive_hysteresis=cfg.consecutive_hysteresis,
        raise_error_at_min_scale=cfg.raise_error_at_min_scale,
    )
