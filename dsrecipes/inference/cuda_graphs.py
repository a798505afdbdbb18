"""CUDA graphs of the decode step: capture once per KV cache and batch, then replay for every token.

    decoder = CachedDecoder(model, kernels, decode_mode="cuda_graph")   # init_inference(enable_cuda_graph=True)
    logits = decoder.decode(next_ids[:, None], cache)                   # replays the captured step

Why: at small batch a decode step is dozens of small kernels per layer, and on a fast GPU the CPU
time to launch them exceeds the GPU time to run them; a graph launches the whole step at once.
What is captured is `CachedDecoder.decode_static`, whose every input lives at a fixed address: the
token ids buffer, the slot tensor (the only thing that changes between steps, filled before each
replay), the cache's keys/values/start (the engine keeps one cache between calls) and the weights.
A graph is keyed by the cache buffer's address and the batch; a new batch size captures a new one
(at most MAX_GRAPHS kept, oldest dropped). Warm-up runs on a side stream first (Triton compiles,
cuBLAS workspaces); they and the capture write the current slot, which the replay then rewrites.

CUDA only; the engine enables it for single-device dense models (tensor-parallel collectives and
MoE's data-dependent routing are not captured).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from dsrecipes.inference.kv_cache import KVCache

MAX_GRAPHS = 8
WARMUP_STEPS = 2


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [B, 1] input buffer
    slot: torch.Tensor  # [1] long: the cache slot this step writes
    logits: torch.Tensor  # [B, V] output buffer
    cache_tensors: tuple  # the cache's keys, values, start: kept alive while the graph may replay over them


class DecodeGraphs:
    def __init__(self, decoder):
        self.decoder = decoder
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()

    def step(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits [B, V] (the graph's output buffer) of ids [B, 1] at slot cache.length; advances the cache."""
        if cache.length >= cache.capacity:
            raise ValueError(f"KV cache overflow: slot {cache.length} of capacity {cache.capacity}")
        key = (cache.keys.data_ptr(), tuple(cache.keys.shape), cache.start.data_ptr(), tuple(ids.shape))
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(ids, cache)
            self._graphs[key] = entry
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        entry.ids.copy_(ids)
        entry.slot.fill_(cache.length)
        entry.graph.replay()
        cache.advance(1)
        return entry.logits

    def _capture(self, ids: torch.Tensor, cache: KVCache) -> _Graph:
        static_ids = ids.clone()
        slot = torch.full((1,), cache.length, dtype=torch.long, device=ids.device)
        side = torch.cuda.Stream(device=ids.device)
        side.wait_stream(torch.cuda.current_stream(ids.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.decoder.decode_static(static_ids, cache, slot)
        torch.cuda.current_stream(ids.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.decoder.decode_static(static_ids, cache, slot)
        return _Graph(graph, static_ids, slot, logits, (cache.keys, cache.values, cache.start))

    def clear(self) -> None:
        """Drop every graph (and the caches they hold), e.g. when the engine allocates a new cache."""
        self._graphs.clear()

    def __len__(self) -> int:
        return len(self._graphs)
