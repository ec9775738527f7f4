"""CUDA graphs of the decode loop: one capture per batch shape, replayed for every later batch.

Eager decode is bound by kernel launches on the host (tens of small ops per layer and level),
so ``Engine`` replays a captured ``Engine.decode`` instead. A graph reads fixed buffers: each
call copies its prefill state (packed shared KV, prompt layout, last hidden states, excluded
rows) into them, replays, and clones the results out.

Key: (batch, padded prompt width Lmax, beam width, top_k, exclude width). The shared KV
buffers hold ``batch * Lmax`` rows, the most any batch of that key can pack; rows past a
batch's ``T`` are never read (gathers stay below ``T`` and ``cu_seqlens[-1] == T``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from torch_engine.kv_cache import SharedKV

if TYPE_CHECKING:
    from torch_engine.engine import Engine, PrefillState


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    state: "PrefillState"            # the fixed input buffers the graph reads
    items: torch.Tensor              # [B, top_k] int64 output buffer
    scores: torch.Tensor             # [B, top_k] float32 output buffer


def _copy_state(dst: "PrefillState", src: "PrefillState") -> None:
    """Load ``src`` into the graph's buffers ``dst`` (same key, T <= capacity)."""
    for name in ("lengths", "cu_seqlens", "gather", "valid"):
        getattr(dst.prompt, name).copy_(getattr(src.prompt, name))
    total = src.shared.keys[0].shape[0]
    for buffers, tensors in ((dst.shared.keys, src.shared.keys),
                             (dst.shared.values, src.shared.values)):
        for buffer, tensor in zip(buffers, tensors):
            buffer[:total].copy_(tensor)
    dst.last_hidden.copy_(src.last_hidden)
    dst.excluded.copy_(src.excluded)


def _buffers_like(state: "PrefillState") -> "PrefillState":
    """Fresh buffers shaped like ``state``, shared KV at full capacity ``B * Lmax`` rows."""
    prompt = state.prompt
    capacity = prompt.valid.numel()
    keys = [torch.zeros((capacity, *k.shape[1:]), dtype=k.dtype, device=k.device)
            for k in state.shared.keys]
    values = [torch.zeros_like(k) for k in keys]
    static_prompt = replace(prompt, lengths=prompt.lengths.clone(),
                            cu_seqlens=prompt.cu_seqlens.clone(), gather=prompt.gather.clone(),
                            valid=prompt.valid.clone())
    return replace(state, prompt=static_prompt, shared=SharedKV(keys, values),
                   last_hidden=state.last_hidden.clone(), excluded=state.excluded.clone())


class DecodeGraphs:
    """Captured decode loops of one engine, least recently used dropped past ``limit``."""

    def __init__(self, engine: "Engine", limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()

    def __len__(self) -> int:
        """Number of captured shapes held."""
        return len(self._graphs)

    def run(self, state: "PrefillState", beam_width: int, top_k: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``engine.decode(state, beam_width, top_k)`` by graph replay (capturing if new)."""
        key = (*state.prompt.valid.shape, beam_width, top_k, state.excluded.shape[1])
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(state, beam_width, top_k)
            self._graphs[key] = captured
            while len(self._graphs) > self.limit:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        _copy_state(captured.state, state)
        captured.graph.replay()
        return captured.items.clone(), captured.scores.clone()

    def _capture(self, state: "PrefillState", beam_width: int, top_k: int) -> _Captured:
        static = _buffers_like(state)
        _copy_state(static, state)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: kernel compilation and allocator state
                self.engine.decode(static, beam_width, top_k)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            items, scores = self.engine.decode(static, beam_width, top_k)
        return _Captured(graph, static, items, scores)
