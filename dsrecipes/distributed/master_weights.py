"""fp32 master weights for a model that computes in bf16/fp16 (DeepSpeed's fp16/bf16 optimizer idea).

`MasterWeights(module, dtype)` gives the module low-precision copies of its fp32 parameters and
keeps the fp32 originals as the masters: the optimizer steps the masters (build it over `view()`,
or over the original parameters before attaching) while forward and backward run in bf16/fp16.
Tied weights stay tied (one copy per master). Each step: low-precision grads -> fp32 master grads,
optimizer step on the masters, masters -> model.

Used by the data-parallel strategies that keep whole parameters on every rank (none, DDP, ZeRO-1,
the pipeline's boundary all-reduce and its ZeRO-1, zero1_boundary); they attach it before wrapping the model, so DDP's reducer
hooks sit on the parameters that actually receive gradients. ZeRO-2 and FSDP2 keep their own fp32
shards as the masters instead.
"""

from __future__ import annotations

import torch
from torch import nn

from dsrecipes.utils.modules import cast_float_buffers, module_view


class MasterWeights:
    def __init__(self, module: nn.Module, dtype: torch.dtype):
        self.dtype = dtype
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []  # (low-precision model param, fp32 master)
        self.names: dict[int, str] = {}  # id(master) -> parameter name in the module
        copies: dict[int, nn.Parameter] = {}
        for module_name, submodule in module.named_modules():
            for name, master in list(submodule.named_parameters(recurse=False)):
                if master.dtype != torch.float32:
                    raise ValueError(
                        f"precision.master_weights needs an fp32 model; parameter {module_name}.{name} is {master.dtype}"
                    )
                if id(master) not in copies:
                    low = nn.Parameter(master.detach().to(dtype), requires_grad=master.requires_grad)
                    copies[id(master)] = low
                    self.pairs.append((low, master))
                    self.names[id(master)] = f"{module_name}.{name}" if module_name else name
                setattr(submodule, name, copies[id(master)])
        cast_float_buffers(module, dtype)
        self._view = module_view(module, {id(low): master for low, master in self.pairs})

    def view(self) -> nn.Module:
        """The module's tree holding the fp32 masters under the model's names (what the optimizer steps)."""
        return self._view

    def grads_to_master(self) -> None:
        """Move the model's low-precision grads onto the fp32 masters (upcast), freeing the former."""
        for low, master in self.pairs:
            if low.grad is not None:
                master.grad = low.grad.float()
                low.grad = None

    @torch.no_grad()
    def master_to_model(self) -> None:
        for low, master in self.pairs:
            low.copy_(master)

    def master_state_dict(self, module: nn.Module) -> dict:
        """The module's state_dict with fp32 master values in place of the low-precision parameters."""
        by_low = {id(low): master for low, master in self.pairs}
        state = {}
        for name, tensor in module.state_dict(keep_vars=True).items():
            master = by_low.get(id(tensor))
            state[name] = (master if master is not None else tensor).detach()
        return state

    @torch.no_grad()
    def load_master_state_dict(self, module: nn.Module, state: dict) -> None:
        """Load fp32 values into the masters (and, rounded, into the model)."""
        by_low = {id(low): master for low, master in self.pairs}
        for name, tensor in module.state_dict(keep_vars=True).items():
            master = by_low.get(id(tensor))
            (master if master is not None else tensor).copy_(state[name])
        self.master_to_model()
