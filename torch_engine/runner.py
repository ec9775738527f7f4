"""One search's runner: the value rules and the search of checked arguments, eager or replayed.

Eager search on CUDA is bound by kernel launches on the host (tens of small ops per layer and
level), so on CUDA the runner captures the whole search of a bucketed shape, the value rules
included, in one CUDA graph and replays it for every later request of that bucket. A graph
reads fixed addresses, so it reads fixed buffers (``StaticInputs``) of its bucket
(``xgr_common.buckets``: rows up to a power of two, the prompt width with the soft prefix up
to a multiple of the length bucket, exclusion columns up to a power of two). Each call:

* ``StaticInputs.load`` copies the checked arguments into the buffers' top-left corners (one
  copy each, converting dtypes on the way) and writes the packed extent (rows, width,
  exclusion columns) with one fill: no host-to-device staging that a later call could
  overwrite before the device has read it;
* inside the graph, the value rules run with that extent: entries outside the corner hold
  stale values of earlier calls and are read as padding (one-token rows that raise no flag,
  empty slots, -1 exclusions), so nothing is cleared between calls; then prefill and decode.

On the host a replayed batch costs those copies, one fill, the graph launch and the result
clones. Graphs are kept per (bucket, beam width, top_k), least recently used dropped past
``max_graphs``, all in one memory pool. Without a bucket policy (the CPU, or CUDA graphs off)
the runner runs the rules and the search eagerly on the arguments' own shapes.

The runner is built from the model, the catalog tables, the resolved options and the bucket
policy; it never sees ``Engine``.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from torch_engine import search
from torch_engine.catalog import Catalog
from torch_engine.checks import Arguments, Verdict
from torch_engine.model import Model
from torch_engine.reference.input_rules import input_rules as reference_input_rules
from torch_engine.search import SearchOptions
from xgr_common.buckets import Bucket, BucketPolicy, bucket_of, pack_extent
from xgr_common.errors import ConfigError, require
from xgr_common.import_order import triton_importable


def rules_for(device: torch.device) -> search.Rules:
    """The function computing the value rules' flags and the sanitised copy on ``device``
    (the signature of ``reference.input_rules.input_rules``): on CUDA the one-launch Triton
    kernel, unless Triton cannot be imported (not installed, or TensorFlow loaded first: see
    ``xgr_common.import_order``); the plain torch reference elsewhere."""
    if device.type == "cuda" and triton_importable():
        try:
            from torch_engine.kernels.input_rules import input_rules
        except ImportError:
            return reference_input_rules
        return input_rules
    return reference_input_rules


@dataclass(frozen=True)
class StaticInputs:
    """The fixed input buffers of one bucket, on the runner's device; see the module's
    docstring.

    token_ids ``[R, W]`` int64, lengths ``[R]`` int64, segment_ids ``[R, W]`` int32 or None
    (causal), prefix_embeds ``[R, S, hidden]`` or None, exclude_items ``[R, X]`` int64,
    extent ``[1]`` int64 (``xgr_common.buckets.pack_extent``).
    """

    token_ids: torch.Tensor
    lengths: torch.Tensor
    segment_ids: torch.Tensor | None
    prefix_embeds: torch.Tensor | None
    exclude_items: torch.Tensor
    extent: torch.Tensor

    @classmethod
    def allocate(cls, bucket: Bucket, hidden: int, dtype: torch.dtype, device: torch.device
                 ) -> "StaticInputs":
        """Buffers that read as all padding until the first ``load``."""
        rows, width = bucket.rows, bucket.width
        return cls(
            token_ids=torch.zeros((rows, width), dtype=torch.int64, device=device),
            lengths=torch.ones((rows,), dtype=torch.int64, device=device),
            segment_ids=None if bucket.causal else torch.zeros((rows, width),
                                                               dtype=torch.int32,
                                                               device=device),
            prefix_embeds=None if not bucket.soft else torch.zeros(
                (rows, bucket.soft, hidden), dtype=dtype, device=device),
            exclude_items=torch.full((rows, bucket.excluded), -1, dtype=torch.int64,
                                     device=device),
            extent=torch.full((1,), pack_extent(0, 0, 0), dtype=torch.int64, device=device))

    def load(self, args: Arguments) -> None:
        """Copy ``args`` (of this bucket) into the corners and write the extent; device work
        only, no host wait."""
        rows, width = args.token_ids.shape
        self.token_ids[:rows, :width].copy_(args.token_ids)
        self.lengths[:rows].copy_(args.lengths)
        if self.segment_ids is not None:
            self.segment_ids[:rows, :width].copy_(args.segment_ids)
        if self.prefix_embeds is not None:
            self.prefix_embeds[:rows].copy_(args.prefix_embeds)
        if args.exclude_items is not None:
            self.exclude_items[:rows, :args.excluded].copy_(args.exclude_items)
        self.extent.fill_(pack_extent(rows, width, args.excluded))


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: StaticInputs             # the fixed input buffers the graph reads
    items: torch.Tensor              # [R, top_k] int64 output buffer
    scores: torch.Tensor             # [R, top_k] float32 output buffer
    flags: torch.Tensor              # [FLAG_COUNT] int64 value-rule flags
    weights: list                    # the fused weight copies the graph reads (kept alive)


@contextmanager
def collector_paused():
    """Collect garbage now and keep Python's collector off until the block ends: a captured
    graph that the collector frees while another is being captured (a runner dropped earlier,
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


class Runner:
    """Runs one model's search over one catalog on checked arguments.

    model: the served ``Model`` (projections fused, on its device); catalog: its tables on
    the model's device; options: the resolved backends; policy: the bucket policy of
    captured whole-search graphs (CUDA and ``options.static_shapes`` only), or None to run
    every call eagerly; max_graphs: captured shapes kept; exclusions: the catalog's
    ``ExclusionTables`` for the fused selection, or None; soft_marker: where the soft vectors
    go (``EngineConfig.soft_marker``).
    """

    def __init__(self, model: Model, catalog: Catalog, options: SearchOptions,
                 policy: BucketPolicy | None = None, max_graphs: int = 8,
                 exclusions=None, soft_marker: int | None = None) -> None:
        self.model, self.catalog, self.options = model, catalog, options
        self.policy, self.max_graphs, self.exclusions = policy, max_graphs, exclusions
        self.soft_marker = soft_marker
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        if policy is not None:
            require(self.device.type == "cuda" and options.static_shapes, ConfigError,
                    f"captured searches need CUDA and static shapes (device {self.device}, "
                    f"static_shapes {options.static_shapes})")
            self._pool = torch.cuda.graph_pool_handle()
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()

    def __len__(self) -> int:
        """Number of captured shapes held."""
        return len(self._graphs)

    def last_graph(self) -> torch.cuda.CUDAGraph | None:
        """The graph replayed last (None when none is held): benchmarks time a replay alone,
        apart from the host work of a call."""
        return next(reversed(self._graphs.values())).graph if self._graphs else None

    def shape(self, args: Arguments) -> Bucket:
        """The shape ``args`` run in: their bucket when searches are captured, else their own
        shape (one exclusion column at least)."""
        rows, width = args.token_ids.shape
        if self.policy is None:
            return Bucket(rows=rows, width=width, soft=args.soft,
                          excluded=max(args.excluded, 1), causal=args.causal)
        return bucket_of(rows, width, args.soft, args.excluded, args.causal, self.policy)

    def holds(self, shape: Bucket, beam_width: int, top_k: int) -> bool:
        """Whether the search of ``shape`` is captured: its replay allocates nothing but the
        results (every intermediate lives in the graph's pool)."""
        return (shape, beam_width, top_k) in self._graphs

    def run(self, args: Arguments, beam_width: int, top_k: int, shape: Bucket | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, Verdict]:
        """Items ``[R, top_k]`` int64 and scores float32 of the ``R`` rows of ``shape(args)``
        (the first B are the request's, the rest padding), and the value rules' ``Verdict``,
        not yet read (a replay's flags live in its graph's buffer: read them before the next
        call). ``shape``: ``shape(args)`` when the caller has it already. Device work only
        (besides a first capture), no host wait.
        """
        if self.policy is None:
            # The rules run where the tokens are; the search on the model's device.
            batch, flags = self.sanitised(args)
            items, scores = search.search(self.model, self.catalog, batch.to(self.device),
                                          beam_width, top_k, self.options, self.exclusions)
            return items, scores, self.verdict_of(args, flags)
        key = (shape or self.shape(args), beam_width, top_k)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(key[0], args, beam_width, top_k)
            self._graphs[key] = captured
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        captured.inputs.load(args)
        captured.graph.replay()
        return (captured.items.clone(), captured.scores.clone(),
                self.verdict_of(args, captured.flags))

    def verdict(self, args: Arguments) -> Verdict:
        """The value rules of ``args`` alone, computed eagerly: the verdict of a batch whose
        search did not finish (an invalid input outranks its capacity error)."""
        return self.verdict_of(args, self.sanitised(args)[1])

    def sanitised(self, args: Arguments) -> tuple[search.RequestBatch, torch.Tensor]:
        """``search.sanitise`` of the arguments where their tokens are (eager)."""
        return search.sanitise(args.token_ids, args.lengths, args.segment_ids,
                               args.prefix_embeds, args.exclude_items,
                               self.model.config.vocab_size, rules_for(args.token_ids.device),
                               soft_marker=self.soft_marker)

    def verdict_of(self, args: Arguments, flags: torch.Tensor) -> Verdict:
        cfg = self.model.config
        return Verdict.of(args, flags, cfg.vocab_size, self.catalog.levels, cfg.max_position)

    def _search_buffers(self, inputs: StaticInputs, beam_width: int, top_k: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a whole-search graph captures: the rules over the loaded buffers, prefill and
        decode. Items and scores ``[R, top_k]`` and the request's flags."""
        batch, flags = search.sanitise(
            inputs.token_ids, inputs.lengths, inputs.segment_ids, inputs.prefix_embeds,
            inputs.exclude_items, self.model.config.vocab_size, rules_for(self.device),
            inputs.extent, soft_marker=self.soft_marker)
        items, scores = search.search(self.model, self.catalog, batch, beam_width, top_k,
                                      self.options, self.exclusions)
        return items, scores, flags

    def _capture(self, bucket: Bucket, args: Arguments, beam_width: int, top_k: int
                 ) -> _Captured:
        buffers = StaticInputs.allocate(bucket, self.model.config.hidden_size, self.dtype,
                                        self.device)
        buffers.load(args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):  # warm-up: kernel compilation and allocator state
                self._search_buffers(buffers, beam_width, top_k)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with collector_paused(), torch.cuda.graph(graph, pool=self._pool), torch.no_grad():
            items, scores, flags = self._search_buffers(buffers, beam_width, top_k)
        # A graph reads addresses: keep the fused projection copies it read alive even if the
        # model's weights change and the layers get new copies.
        weights = [layer.fused for layer in self.model.model.layers]
        return _Captured(graph, buffers, items, scores, flags, weights)
