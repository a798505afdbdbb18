"""Preallocated key/value cache for autoregressive decoding.

    cache = KVCache.allocate(n_layer=4, batch=2, n_kv_head=4, capacity=96, head_dim=32, dtype=torch.float32)
    k_all, v_all = cache.write(layer, k_new, v_new)   # k_new [B, Hkv, T, D] lands at [length, length+T)
    cache.advance(T)                                   # after every layer wrote its T tokens

Why preallocated: growing the cache with torch.cat per token reallocates and copies the whole cache
every step (quadratic traffic); here each step writes its new keys/values in place and attention
reads a view of the first `length` slots. Rows are left padded: row b's valid keys are the slots
[start[b], length), so one `length` serves the whole batch and decode writes one column per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    keys: torch.Tensor  # [n_layer, B, Hkv, capacity, D]
    values: torch.Tensor  # [n_layer, B, Hkv, capacity, D]
    start: torch.Tensor  # [B] long: first valid slot of each row (its count of left padding)
    length: int = 0  # slots written so far (the same for every row)

    @classmethod
    def allocate(cls, n_layer: int, batch: int, n_kv_head: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> KVCache:
        shape = (n_layer, batch, n_kv_head, capacity, head_dim)
        return cls(
            keys=torch.zeros(shape, dtype=dtype, device=device),
            values=torch.zeros(shape, dtype=dtype, device=device),
            start=torch.zeros(batch, dtype=torch.long, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def batch(self) -> int:
        return self.keys.shape[1]

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2

    def fits(self, n_layer: int, batch: int, n_kv_head: int, capacity: int, head_dim: int, dtype, device) -> bool:
        """True when this cache can serve a request of that shape (so it is reused, not reallocated)."""
        k = self.keys
        return (k.shape[0] == n_layer and k.shape[1] >= batch and k.shape[2] == n_kv_head and k.shape[3] >= capacity
                and k.shape[4] == head_dim and k.dtype == dtype and k.device == torch.device(device))

    def view(self, batch: int) -> KVCache:
        """The first `batch` rows of this cache, reset to empty (shares the storage: no allocation)."""
        return KVCache(self.keys[:, :batch], self.values[:, :batch], self.start[:batch].zero_(), 0)

    def reset(self, start: torch.Tensor | None = None) -> None:
        self.length = 0
        self.start.zero_()
        if start is not None:
            self.start.copy_(start)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, Hkv, T, D] at slots [length, length+T) of `layer`; return the keys and values
        of slots [0, length+T) (views, no copy)."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: {end} slots needed, capacity {self.capacity}")
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, n: int) -> None:
        self.length += n
