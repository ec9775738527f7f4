"""CUDA graphs of the search: captured once per shape, replayed for every later batch.

Eager search is bound by kernel launches on the host (tens of small ops per layer and level),
so on CUDA ``Engine`` replays captured work. A graph reads fixed buffers: each call copies its
inputs into them, replays, and clones the results out. Two granularities:

* ``DecodeGraphs`` (default): the decode loop only. Prefill runs eagerly with dynamic packing;
  its state (packed shared KV, prompt layout, last hidden states, excluded rows) is copied into
  buffers whose shared KV holds ``B * Lmax`` rows, the most a batch of that shape can pack;
  rows past a batch's ``T`` are never read (gathers stay below ``T``, ``cu_seqlens[-1] == T``).
  Key: (B, Lmax, beam width, top_k, exclude width).
* ``SearchGraphs`` (``EngineConfig.static_shapes``): prefill and decode together, which static
  packing (``kv_cache.PackedPrompt``, ``static=True``) makes shape-static. Key: the shapes of
  the checked inputs, whether the prompt is causal, beam width and top_k.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Callable

import torch

from torch_engine.kv_cache import SharedKV

if TYPE_CHECKING:
    from torch_engine.engine import Engine, PrefillState
    from torch_engine.inputs import RequestBatch


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Any                      # the fixed input buffers the graph reads
    items: torch.Tensor              # [B, top_k] int64 output buffer
    scores: torch.Tensor             # [B, top_k] float32 output buffer
    weights: list                    # the fused weight copies the graph reads (kept alive)


class _GraphCache:
    """Captured graphs by key, least recently used dropped past ``limit``; one memory pool."""

    def __init__(self, engine: "Engine", limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()

    def __len__(self) -> int:
        """Number of captured shapes held."""
        return len(self._graphs)

    def _replay(self, key: tuple, inputs: Any, make_buffers: Callable[[Any], Any],
                load: Callable[[Any, Any], None], work: Callable[[Any], tuple]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(make_buffers(inputs), load, inputs, work)
            self._graphs[key] = captured
            while len(self._graphs) > self.limit:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        load(captured.inputs, inputs)
        captured.graph.replay()
        return captured.items.clone(), captured.scores.clone()

    def _capture(self, buffers: Any, load: Callable[[Any, Any], None], inputs: Any,
                 work: Callable[[Any], tuple]) -> _Captured:
        load(buffers, inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):  # warm-up: kernel compilation and allocator state
                work(buffers)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.no_grad():
            items, scores = work(buffers)
        # A graph reads addresses: keep the fused projection copies it read alive even if the
        # model's weights change and the layers get new copies.
        weights = [layer.fused for layer in self.engine.model.model.layers]
        return _Captured(graph, buffers, items, scores, weights)


def _state_buffers(state: "PrefillState") -> "PrefillState":
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


def _load_state(dst: "PrefillState", src: "PrefillState") -> None:
    """Copy what decoding reads of ``src`` into the buffers ``dst`` (T <= capacity)."""
    for name in ("lengths", "cu_seqlens", "gather", "valid"):
        getattr(dst.prompt, name).copy_(getattr(src.prompt, name))
    total = src.shared.keys[0].shape[0]
    for buffers, tensors in ((dst.shared.keys, src.shared.keys),
                             (dst.shared.values, src.shared.values)):
        for buffer, tensor in zip(buffers, tensors):
            buffer[:total].copy_(tensor)
    dst.last_hidden.copy_(src.last_hidden)
    dst.excluded.copy_(src.excluded)


class DecodeGraphs(_GraphCache):
    """Captured decode loops (prefill stays eager)."""

    def run(self, state: "PrefillState", beam_width: int, top_k: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``engine.decode(state, beam_width, top_k)`` by graph replay (capturing if new)."""
        key = (*state.prompt.valid.shape, beam_width, top_k, state.excluded.shape[1])
        return self._replay(key, state, _state_buffers, _load_state,
                            lambda s: self.engine.decode(s, beam_width, top_k))


def _batch_tensors(batch: "RequestBatch") -> dict[str, torch.Tensor]:
    return {f.name: getattr(batch, f.name) for f in fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)}


def _load_batch(dst: "RequestBatch", src: "RequestBatch") -> None:
    for name, tensor in _batch_tensors(src).items():
        getattr(dst, name).copy_(tensor)


class SearchGraphs(_GraphCache):
    """Captured prefill + decode (needs the engine's static packing)."""

    @staticmethod
    def key(batch: "RequestBatch", beam_width: int, top_k: int) -> tuple:
        shapes = tuple((n, tuple(t.shape), t.dtype) for n, t in _batch_tensors(batch).items())
        return (shapes, batch.causal, beam_width, top_k)

    def holds(self, batch: "RequestBatch", beam_width: int, top_k: int) -> bool:
        """True when this shape is captured: its replay allocates nothing but the results
        (every intermediate lives in the graph's pool), so it needs no memory check."""
        return self.key(batch, beam_width, top_k) in self._graphs

    def run(self, batch: "RequestBatch", beam_width: int, top_k: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``engine.decode(engine.prefill(batch), ...)`` by graph replay (capturing if new)."""
        key = self.key(batch, beam_width, top_k)
        engine = self.engine
        return self._replay(
            key, batch,
            lambda b: replace(b, **{n: t.clone() for n, t in _batch_tensors(b).items()}),
            _load_batch, lambda b: engine.decode(engine.prefill(b), beam_width, top_k))
