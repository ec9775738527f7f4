"""The search of a batch whose frozen prompt parts go through the prompt cache.

``Engine.recommend(..., frozen_lengths=...)`` calls ``run``: the frozen parts are looked up
and reserved on the host (``PromptCache.reserve``: digests of a few kilobytes of tokens),
the value rules sanitise the whole prompts as usual, each prompt is cut to its suffix after
the cached tokens (``suffix_batch``), the suffixes are prefilled against the cached pages
(writing the frozen tokens the cache did not have into its pages), then decode and item
expansion as in ``search``. The reservation is kept only when the batch's verdict passes,
so an invalid or failed batch leaves no entry behind. ``CachedRunner`` runs that search
eagerly, or on CUDA as one captured graph per shape, like ``runner.Runner``: the host work
a hit adds is the digests, the plan and one small copy of its tables (pinned, not waited
for).

The frozen part (``xgr_common.prompt_v2``) must end where every later token may see it and
must not depend on the request's soft vectors: ``prompt_rows`` refuses a ``frozen_lengths``
that breaks either rule, naming the row.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from torch_engine import search
from torch_engine.checks import Arguments, Verdict
from torch_engine.kv_cache import CachedPrefix
from torch_engine.prompt_cache import PromptCache, Reservation
from torch_engine.prompt_cache.cache import PromptRow
from torch_engine.runner import Runner, StaticInputs, collector_paused, rules_for
from torch_engine.search import RequestBatch
from xgr_common.buckets import Bucket, BucketPolicy, next_power_of_two, round_up
from xgr_common.errors import InvalidInputError, require


def prompt_rows(args: Arguments, frozen_lengths, soft_marker: int | None,
                item_start_id: int) -> list[PromptRow]:
    """The rows the cache sees, with ``frozen_lengths`` checked against the prompts (host
    copies of the tokens: a few kilobytes); a causal prompt's segments are counted from its
    ``item_start_id`` tokens. ``InvalidInputError`` names the row and rule."""
    rows = args.token_ids.shape[0]
    frozen = _host_ints("frozen_lengths", frozen_lengths)
    require(frozen.shape == (rows,), InvalidInputError,
            f"frozen_lengths must have shape [{rows}] (one per row of token_ids), got "
            f"{tuple(frozen.shape)}")
    require(args.prefix_embeds is None or soft_marker is not None, InvalidInputError,
            "frozen_lengths needs soft vectors at the prompt's SOFT markers (prompt version "
            "2) or none: version-1 soft vectors come first, so no prompt part before them "
            "could be cached")
    tokens, lengths, segments = _on_host(
        args.token_ids, args.lengths, None if args.causal else args.segment_ids)
    if args.causal:
        segments = np.cumsum(tokens == item_start_id, axis=1)
    out = []
    for row in range(rows):
        n, length = int(frozen[row]), int(lengths[row])
        require(0 <= n < max(min(length, tokens.shape[1]), 1), InvalidInputError,
                f"frozen_lengths[{row}] = {n} must be in [0, lengths[{row}]) = [0, {length}): "
                f"the part after it holds at least the row's last token")
        if n and soft_marker is not None:
            marks = np.nonzero(tokens[row, :n] == soft_marker)[0]
            require(marks.size == 0, InvalidInputError,
                    f"frozen_lengths[{row}] = {n} covers a SOFT marker at column "
                    f"{int(marks[0]) if marks.size else -1}: the frozen part cannot hold the "
                    f"request's soft vectors")
        if n and not args.causal:
            require(segments[row, n - 1] != segments[row, n], InvalidInputError,
                    f"frozen_lengths[{row}] = {n} cuts segment {int(segments[row, n])} "
                    f"(columns {n - 1} and {n} share it): under the item-causal rule a frozen "
                    f"part must end at a segment's end")
        out.append(PromptRow(tokens[row], segments[row], n, length))
    return out


def suffix_groups(suffixes: list[int], policy: BucketPolicy | None,
                  split_tokens: int) -> list[list[int]]:
    """A batch's rows as the runs that serve them best, as the TorchCall runtime splits them
    (``SuffixGroups``): one group (every row, in order) or two, the rows with the shorter
    ``suffixes`` (prompt length less the cached part) first. A run pads every row to its
    longest suffix (and its rows and width to ``policy``'s buckets), so the hits of a batch
    of hits and misses run apart when the prefill work saved exceeds ``split_tokens``."""
    order = sorted(range(len(suffixes)), key=lambda b: suffixes[b])

    def work(lo: int, hi: int) -> int:
        rows, width = hi - lo, max(suffixes[order[hi - 1]], 1)
        if policy is not None:
            rows = next_power_of_two(rows) if policy.pow2_batch else rows
            width = round_up(width, policy.length_multiple)
        return rows * width

    best, cut = work(0, len(order)), 0
    for k in range(1, len(order)):
        split = work(0, k) + work(k, len(order)) + split_tokens
        if split < best:
            best, cut = split, k
    if cut == 0:
        return [list(range(len(suffixes)))]
    return [sorted(order[:cut]), sorted(order[cut:])]


def rows_of(args: Arguments, rows: list[int]) -> Arguments:
    """``args`` restricted to ``rows`` (in that order)."""
    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, torch.tensor(rows, device=t.device))
    return Arguments(pick(args.token_ids), pick(args.lengths), pick(args.segment_ids),
                     pick(args.prefix_embeds), pick(args.exclude_items))


def suffix_batch(batch: RequestBatch, cached: torch.Tensor, width: int) -> RequestBatch:
    """Each row of a sanitised ``batch`` from its column ``cached[b]`` on: ``[B, width]``
    tokens and segments (``width`` covers the longest suffix), lengths less the cached
    tokens; soft vectors and exclusions unchanged (the markers lie in the suffixes)."""
    columns = torch.arange(width, device=cached.device)
    index = (cached[:, None] + columns[None, :]).clamp(max=batch.token_ids.shape[1] - 1)
    return RequestBatch(
        token_ids=batch.token_ids.gather(1, index),
        total_lengths=batch.total_lengths - cached,
        segment_ids=batch.segment_ids.gather(1, index),
        causal=batch.causal, prefix_embeds=batch.prefix_embeds,
        exclude_items=batch.exclude_items, soft_marker=batch.soft_marker)


def search_features_cached(model, catalog, token_ids: torch.Tensor, lengths: torch.Tensor,
                           segment_ids: torch.Tensor | None,
                           prefix_embeds: torch.Tensor | None,
                           exclude_items: torch.Tensor | None, beam_width: int, top_k: int,
                           options: search.SearchOptions, exclusions, soft_marker: int | None,
                           pool: torch.Tensor, block_table: torch.Tensor,
                           cached_lengths: torch.Tensor, write_slots: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``search.search_features`` when the prompts' first tokens come from a prompt cache's
    pool: traceable, for a package whose runtime keeps the cache (TorchCall's): the whole
    prompts are sanitised by the value rules, cut to their suffixes after ``cached_lengths``
    (``[B]`` int64), prefilled against the pages of ``block_table`` (``[B, P]`` int32) in
    ``pool`` (``[layers, 2, pages + 1, page_tokens, Hkv, D]``), whose suffix slots are
    written to ``write_slots`` (``[B, S]`` int64, S the suffix width; the sink for slots not
    kept), then decoded. Returns items, scores and the rules' flags as ``search_features``."""
    batch, flags = search.sanitise_features(model, token_ids, lengths, segment_ids,
                                            prefix_embeds, exclude_items, soft_marker)
    cached = CachedPrefix(pool=pool, block_table=block_table, lengths=cached_lengths,
                          longest=None, write_slots=write_slots)
    suffix = suffix_batch(batch, cached_lengths, write_slots.shape[1])
    state = search.prefill(model, catalog, suffix, options, exclusions, cached)
    items, scores = search.decode(model, catalog, state, beam_width, top_k, options,
                                  exclusions)
    return items, scores, flags


@dataclass(frozen=True)
class CachedShape:
    """The buffers a cached search runs in: the runner's ``bucket``, ``suffix`` token slots
    per row (the longest suffix, rounded up to the length bucket when captured) and
    ``pages`` columns of the block table (enough for the bucket's whole width); ``writes``:
    whether any row writes KV into the pool (a batch of hits alone does not, and its graph
    then has no store: every layer's suffix KV copied to the sink is work for nothing)."""

    bucket: Bucket
    suffix: int
    pages: int
    writes: bool = True


@dataclass(frozen=True)
class CachedInputs:
    """The fixed buffers of one captured cached search: the runner's ``StaticInputs`` and
    the cache's per-row tables, views of one int64 buffer ``tables`` so that a call loads
    them with one copy from its host twin ``staging`` (pinned on CUDA):
    ``cached_lengths [R]``, ``write_slots [R, Ws]`` and ``block_table [R, P]`` (int64 here;
    the search reads it as int32). Rows past a batch read as uncached and write the sink."""

    base: StaticInputs
    tables: torch.Tensor
    staging: torch.Tensor
    cached_lengths: torch.Tensor
    write_slots: torch.Tensor
    block_table: torch.Tensor
    copied: torch.cuda.Event | None = None      # recorded after each copy (CUDA)

    @classmethod
    def allocate(cls, shape: CachedShape, hidden: int, dtype: torch.dtype,
                 device: torch.device) -> "CachedInputs":
        rows, device = shape.bucket.rows, torch.device(device)
        slots, pages = rows * shape.suffix, rows * shape.pages
        tables = torch.zeros((rows + slots + pages,), dtype=torch.int64, device=device)
        staging = torch.zeros(tables.shape, dtype=torch.int64,
                              pin_memory=device.type == "cuda")
        return cls(StaticInputs.allocate(shape.bucket, hidden, dtype, device), tables, staging,
                   tables[:rows], tables[rows:rows + slots].view(rows, shape.suffix),
                   tables[rows + slots:].view(rows, shape.pages),
                   torch.cuda.Event() if device.type == "cuda" else None)

    def load(self, args: Arguments, reservation: Reservation) -> None:
        """Copy the arguments and the reservation's tables in (whole tables, so rows past
        the batch's are reset): the tables in one copy, not waited for."""
        self.base.load(args)
        rows, pages = self.block_table.shape
        width = self.write_slots.shape[1]
        if self.copied is not None:
            self.copied.synchronize()    # the last copy out of the staging buffer is done
        host = self.staging.numpy()
        host[:rows] = reservation.cached_lengths(rows).numpy()
        host[rows:rows + rows * width] = reservation.write_slots(width, rows).numpy().ravel()
        host[rows + rows * width:] = reservation.block_table(rows, pages).numpy().ravel()
        self.tables.copy_(self.staging, non_blocking=True)
        if self.copied is not None:
            self.copied.record()


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: CachedInputs
    items: torch.Tensor
    scores: torch.Tensor
    flags: torch.Tensor
    weights: list


class CachedRunner:
    """Runs cached searches for one ``Runner`` (its model, catalog, options, rules and
    bucket policy) over one ``PromptCache``: eagerly without a bucket policy, else one
    captured graph per (``CachedShape``, beam width, top_k), replayed, least recently used
    dropped past ``max_graphs``. The graphs read the cache's pool at its fixed address and
    the tables through their buffers, so a replay serves any rows of its shape."""

    def __init__(self, runner: Runner, cache: PromptCache, max_graphs: int) -> None:
        self.runner, self.cache, self.max_graphs = runner, cache, max_graphs
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()
        self._pool = torch.cuda.graph_pool_handle() if runner.policy is not None else None

    def __len__(self) -> int:
        return len(self._graphs)

    def last_graph(self) -> torch.cuda.CUDAGraph | None:
        """The graph replayed last, as ``Runner.last_graph``."""
        return next(reversed(self._graphs.values())).graph if self._graphs else None

    def holds(self, shape: CachedShape, beam_width: int, top_k: int) -> bool:
        """Whether the search of ``shape`` is captured (its memory is held already)."""
        return (shape, beam_width, top_k) in self._graphs

    def shape(self, args: Arguments, rows: list[PromptRow], reservation: Reservation
              ) -> CachedShape:
        bucket = self.runner.shape(args)
        longest = max(max(r.length - p.cached for r, p in zip(rows, reservation.plans)), 1)
        pt = self.cache.page_tokens
        policy = self.runner.policy
        if policy is None:
            return CachedShape(bucket, longest, max(len(p.pages) for p in reservation.plans)
                               or 1, reservation.writes)
        suffix = min(round_up(longest, policy.length_multiple), bucket.width)
        return CachedShape(bucket, suffix, max(-(-bucket.width // pt), 1), reservation.writes)

    def run(self, args: Arguments, rows: list[PromptRow], reservation: Reservation,
            beam_width: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor, Verdict]:
        """Items, scores (the first B rows are the batch's) and the unread verdict."""
        runner = self.runner
        shape = self.shape(args, rows, reservation)
        if runner.policy is None:
            device = runner.device
            batch, flags = runner.sanitised(args)
            cached = CachedPrefix(
                pool=self.cache.pool.data, block_table=reservation.block_table().to(device),
                lengths=reservation.cached_lengths().to(device),
                longest=max(p.cached for p in reservation.plans),
                write_slots=(reservation.write_slots(shape.suffix).to(device)
                             if reservation.writes else None))
            items, scores = self._search(batch.to(device), cached, shape, beam_width, top_k)
            return items, scores, runner.verdict_of(args, flags)
        key = (shape, beam_width, top_k)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(shape, args, reservation, beam_width, top_k)
            self._graphs[key] = captured
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        captured.inputs.load(args, reservation)
        captured.graph.replay()
        return (captured.items.clone(), captured.scores.clone(),
                runner.verdict_of(args, captured.flags))

    def _search(self, batch: RequestBatch, cached: CachedPrefix, shape: CachedShape,
                beam_width: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        runner = self.runner
        suffix = suffix_batch(batch, cached.lengths, shape.suffix)
        state = search.prefill(runner.model, runner.catalog, suffix, runner.options,
                               runner.exclusions, cached)
        return search.decode(runner.model, runner.catalog, state, beam_width, top_k,
                             runner.options, runner.exclusions)

    def search_buffers(self, inputs: CachedInputs, shape: CachedShape, beam_width: int,
                       top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a cached graph captures: the rules over the loaded buffers, the suffix
        prefill against the pages (and their writes), decode. Device work only."""
        runner, base = self.runner, inputs.base
        batch, flags = search.sanitise(
            base.token_ids, base.lengths, base.segment_ids, base.prefix_embeds,
            base.exclude_items, runner.model.config.vocab_size, rules_for(runner.device),
            base.extent, soft_marker=runner.soft_marker)
        cached = CachedPrefix(pool=self.cache.pool.data,
                              block_table=inputs.block_table.to(torch.int32),
                              lengths=inputs.cached_lengths,
                              longest=shape.pages * self.cache.page_tokens,
                              write_slots=inputs.write_slots if shape.writes else None)
        items, scores = self._search(batch, cached, shape, beam_width, top_k)
        return items, scores, flags

    def _capture(self, shape: CachedShape, args: Arguments, reservation: Reservation,
                 beam_width: int, top_k: int) -> _Captured:
        runner = self.runner
        buffers = CachedInputs.allocate(shape, runner.model.config.hidden_size, runner.dtype,
                                        runner.device)
        buffers.load(args, reservation)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # Warm-up runs write the batch's own KV into its own slots: the values the replay
        # writes too, so nothing a later request reads changes.
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                self.search_buffers(buffers, shape, beam_width, top_k)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with collector_paused(), torch.cuda.graph(graph, pool=self._pool), torch.no_grad():
            items, scores, flags = self.search_buffers(buffers, shape, beam_width, top_k)
        weights = [layer.fused for layer in runner.model.model.layers]
        return _Captured(graph, buffers, items, scores, flags, weights)


def _on_host(*tensors: torch.Tensor | None) -> list[np.ndarray | None]:
    """Host arrays of ``tensors`` (None stays None): device tensors copied into pinned memory
    without blocking, then one wait for all of them instead of one a tensor."""
    out, streams = [], set()
    for tensor in tensors:
        if tensor is None or tensor.device.type != "cuda":
            out.append(None if tensor is None else tensor.cpu())
            continue
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        streams.add(torch.cuda.current_stream(tensor.device))
        out.append(host)
    for stream in streams:
        stream.synchronize()
    return [None if t is None else t.numpy() for t in out]


def _host_ints(name: str, value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        require(not value.is_floating_point() and not value.is_complex()
                and value.dtype != torch.bool, InvalidInputError,
                f"{name} must be an integer tensor, got {value.dtype}")
        return value.detach().cpu().numpy().astype(np.int64).reshape(value.shape)
    array = np.asarray(value)
    require(array.dtype.kind in "iu" or (array.size == 0), InvalidInputError,
            f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64)
