"""CUDA graphs of the whole search: one capture per input shape, replayed for later batches.

Eager search is bound by kernel launches on the host (tens of small ops per layer and level),
so on CUDA ``Engine`` replays a captured prefill + decode instead. That needs every shape fixed
by the inputs' shapes, which static packing gives (``kv_cache.PackedPrompt``, ``static=True``):
the graph reads fixed input buffers, each call copies its checked inputs into them, replays,
and clones the results out.

Key: the shapes of the checked inputs (token_ids, prefix_embeds, exclude_items), whether the
prompt is causal, beam width and top_k. Serving pads prompts to a fixed width, so few keys.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch_engine.engine import Engine
    from torch_engine.inputs import RequestBatch


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    batch: "RequestBatch"            # the fixed input buffers the graph reads
    items: torch.Tensor              # [B, top_k] int64 output buffer
    scores: torch.Tensor             # [B, top_k] float32 output buffer


def _tensors(batch: "RequestBatch") -> dict[str, torch.Tensor]:
    return {f.name: getattr(batch, f.name) for f in fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)}


def _key(batch: "RequestBatch", beam_width: int, top_k: int) -> tuple:
    shapes = tuple((name, tuple(t.shape), t.dtype) for name, t in _tensors(batch).items())
    return shapes, batch.causal, beam_width, top_k


class SearchGraphs:
    """Captured searches of one engine, least recently used dropped past ``limit``."""

    def __init__(self, engine: "Engine", limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()

    def __len__(self) -> int:
        """Number of captured shapes held."""
        return len(self._graphs)

    def run(self, batch: "RequestBatch", beam_width: int, top_k: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``engine.decode(engine.prefill(batch), ...)`` by graph replay (capturing if new)."""
        key = _key(batch, beam_width, top_k)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(batch, beam_width, top_k)
            self._graphs[key] = captured
            while len(self._graphs) > self.limit:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        for name, tensor in _tensors(batch).items():
            getattr(captured.batch, name).copy_(tensor)
        captured.graph.replay()
        return captured.items.clone(), captured.scores.clone()

    def _capture(self, batch: "RequestBatch", beam_width: int, top_k: int) -> _Captured:
        engine = self.engine
        static = replace(batch, **{name: t.clone() for name, t in _tensors(batch).items()})
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):  # warm-up: kernel compilation and allocator state
                engine.decode(engine.prefill(static), beam_width, top_k)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.no_grad():
            items, scores = engine.decode(engine.prefill(static), beam_width, top_k)
        return _Captured(graph, static, items, scores)
