"""CUDA graphs of the search: captured once per shape, replayed for every later batch.

Eager search is bound by kernel launches on the host (tens of small ops per layer and level),
so on CUDA ``Engine`` replays captured work. A graph reads fixed buffers: each call copies its
inputs into them, replays, and clones the results out. Two granularities:

* ``DecodeGraphs`` (default): the decode loop only. Prefill runs eagerly with dynamic packing;
  its state (packed shared KV, prompt layout, last hidden states, excluded rows) is copied into
  buffers whose shared KV holds ``B * Lmax`` rows, the most a batch of that shape can pack;
  rows past a batch's ``T`` are never read (gathers stay below ``T``, ``cu_seqlens[-1] == T``).
  Key: (B, Lmax, beam width, top_k, exclude width).
* ``SearchGraphs`` (``EngineConfig.static_shapes``): the input rules, prefill and decode
  together, which static packing (``kv_cache.PackedPrompt``, ``static=True``) makes
  shape-static. They read the buffers of one bucketed shape (``padded_inputs``), so requests
  of nearby shapes share a graph and a replay costs the host a copy per argument, one fill and
  the launch. Key: the bucket, beam width and top_k.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import torch

from torch_engine.kv_cache import SharedKV
from torch_engine.padded_inputs import (Bucket, PaddedInputs, arguments_of, bucket_of,
                                        search_padded)

if TYPE_CHECKING:
    from torch_engine.engine import Engine, PrefillState
    from torch_engine.inputs import Arguments, RequestBatch


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Any                      # the fixed input buffers the graph reads
    items: torch.Tensor              # [B, top_k] int64 output buffer
    scores: torch.Tensor             # [B, top_k] float32 output buffer
    flags: torch.Tensor | None       # [6] int64 input-rule flags (whole-search graphs)
    weights: list                    # the fused weight copies the graph reads (kept alive)


@contextmanager
def _collector_paused():
    """Collect garbage now and keep Python's collector off until the block ends: a captured
    graph that the collector frees while another is being captured (an engine dropped earlier,
    kept in a reference cycle) destroys its executable graph mid-capture, which CUDA forbids
    and which invalidates the capture (torch's ``graph`` no longer collects by default)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Items and scores (cloned) and the flags buffer (read it before the next replay)."""
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(make_buffers(inputs), load, inputs, work)
            self._graphs[key] = captured
            while len(self._graphs) > self.limit:
                self._graphs.popitem(last=False)
        return self._run(key, captured, inputs, load)

    def _run(self, key: tuple, captured: _Captured, inputs: Any,
             load: Callable[[Any, Any], None]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        self._graphs.move_to_end(key)
        load(captured.inputs, inputs)
        captured.graph.replay()
        return captured.items.clone(), captured.scores.clone(), captured.flags

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
        with _collector_paused(), torch.cuda.graph(graph, pool=self.pool), torch.no_grad():
            items, scores, *flags = work(buffers)
        # A graph reads addresses: keep the fused projection copies it read alive even if the
        # model's weights change and the layers get new copies.
        weights = [layer.fused for layer in self.engine.model.model.layers]
        return _Captured(graph, buffers, items, scores, flags[0] if flags else None, weights)


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
        items, scores, _ = self._replay(key, state, _state_buffers, _load_state,
                                        lambda s: self.engine.decode(s, beam_width, top_k))
        return items, scores


class SearchGraphs(_GraphCache):
    """Captured input rules + prefill + decode over padded buffers (needs the engine's static
    packing)."""

    def bucket(self, args: "Arguments") -> Bucket:
        """The buffer shape ``args`` replay in (the engine's ``length_bucket`` and
        ``batch_buckets``)."""
        config = self.engine.config
        return bucket_of(args, config.length_bucket, config.batch_buckets)

    def key(self, args: "Arguments", beam_width: int, top_k: int) -> tuple:
        return (self.bucket(args), beam_width, top_k)

    def replay_held(self, args: "Arguments", beam_width: int, top_k: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``run`` when this bucket is captured (one key lookup: the serving path), else
        None. A held bucket's replay allocates nothing but the results (every intermediate
        lives in the graph's pool), so it needs no memory check."""
        key = self.key(args, beam_width, top_k)
        captured = self._graphs.get(key)
        return None if captured is None else self._run(key, captured, args, PaddedInputs.load)

    def run(self, args: "Arguments", beam_width: int, top_k: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Items ``[R, top_k]`` and scores of the bucket's R rows (the first B are the
        request's) and the ``[6]`` flags of its input rules (``inputs.Verdict``; read them
        before the next replay), by graph replay (capturing if new)."""
        key = self.key(args, beam_width, top_k)
        engine = self.engine
        return self._replay(
            key, args,
            lambda a: PaddedInputs.allocate(key[0], engine.model.config.hidden_size,
                                            engine.dtype, engine.device),
            PaddedInputs.load, lambda p: search_padded(engine, p, beam_width, top_k))

    def run_checked(self, batch: "RequestBatch", beam_width: int, top_k: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``engine.decode(engine.prefill(batch), ...)`` of an already sanitised batch, by
        replay of its bucket's graph."""
        items, scores, _ = self.run(arguments_of(batch), beam_width, top_k)
        rows = batch.token_ids.shape[0]
        return items[:rows], scores[:rows]
