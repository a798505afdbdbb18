"""Moving tokens into expert capacity buffers and back (permute / unpermute), from a sparse Routing.

    buffer = dispatch(tokens [S, M], routing)        # [E, C, M], empty slots zero
    out = combine(expert_out [E, C, M], routing)      # [S, M] = sum_j weight[s, j] * out[slot(s, j)]

Both are index gathers (O(S*k*M) data moved, no dense [S, E, C] one-hot einsum): dispatch inverts the
route->slot map into a slot->token map and gathers rows; combine gathers each token's k slots and
sums them weighted in fp32. Autograd flows through the gathers (to the tokens and the expert
outputs) and through the weights (to the router). `backend="triton"` runs the same gathers as fused
Triton kernels (dsrecipes.kernels.moe_permute); `einsum_dispatch` / `einsum_combine` are DeepSpeed's
dense formulation, kept as the reference the tests compare against.
"""

from __future__ import annotations

import torch

from dsrecipes.models.moe_gating import Routing


def slot_sources(routing: Routing, num_tokens: int) -> torch.Tensor:
    """[E * C] token index feeding each buffer slot; num_tokens (a zero pad row) for empty slots."""
    slots = routing.flat_slots().reshape(-1)
    tokens = torch.arange(num_tokens, device=slots.device).repeat_interleave(routing.expert.shape[1])
    source = torch.full((routing.num_experts * routing.capacity + 1,), num_tokens, dtype=torch.long, device=slots.device)
    source.scatter_(0, slots, tokens)  # dropped routes all land on the scratch entry, discarded below
    return source[:-1]


def dispatch(tokens: torch.Tensor, routing: Routing, backend: str = "torch") -> torch.Tensor:
    """[S, M] tokens -> [E, C, M] expert buffers."""
    num_tokens, d_model = tokens.shape
    source = slot_sources(routing, num_tokens)
    if backend == "triton":
        from dsrecipes.kernels.moe_permute import permute_rows

        buffer = permute_rows(tokens, source, routing.flat_slots())
    else:
        padded = torch.cat([tokens, tokens.new_zeros(1, d_model)])
        buffer = padded.index_select(0, source)
    return buffer.view(routing.num_experts, routing.capacity, d_model)


def combine(expert_out: torch.Tensor, routing: Routing, backend: str = "torch") -> torch.Tensor:
    """[E, C, M] expert outputs -> [S, M] tokens: the weighted sum of each token's kept routes (fp32 sum)."""
    d_model = expert_out.shape[-1]
    flat = expert_out.reshape(-1, d_model)
    slots = routing.flat_slots()
    if backend == "triton":
        from dsrecipes.kernels.moe_permute import unpermute_rows

        return unpermute_rows(flat, slots, routing.weight, slot_sources(routing, slots.shape[0]))
    padded = torch.cat([flat, flat.new_zeros(1, d_model)])
    routed = padded.index_select(0, slots.reshape(-1)).view(*slots.shape, d_model)
    return (routed.float() * routing.weight.unsqueeze(-1)).sum(1).to(expert_out.dtype)


def combine_weights(routing: Routing) -> torch.Tensor:
    """DeepSpeed's dense [S, E, C] combine tensor (reference only: O(S * E * C) memory)."""
    num_tokens, k = routing.expert.shape
    dense = routing.weight.new_zeros(num_tokens, routing.num_experts * routing.capacity + 1)
    dense = dense.scatter_add(1, routing.flat_slots(), routing.weight)
    return dense[:, :-1].view(num_tokens, routing.num_experts, routing.capacity)


def einsum_dispatch(tokens: torch.Tensor, routing: Routing) -> torch.Tensor:
    mask = (combine_weights(routing) != 0).to(tokens.dtype)
    return torch.einsum("sec,sm->ecm", mask, tokens)


def einsum_combine(expert_out: torch.Tensor, routing: Routing) -> torch.Tensor:
    return torch.einsum("sec,ecm->sm", combine_weights(routing), expert_out.float()).to(expert_out.dtype)
