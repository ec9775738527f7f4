"""The search as plain functions: a sanitised prompt batch in, the top-k catalog items out.

``search`` = ``decode(prefill(...))``: prefill packs the prompts and runs them once (the shared
KV), decode runs one step per further code level with one constrained selection per level
(``select``) and ends with the item expansion (``expand``). Each takes the model, the catalog
tables (``Catalog`` and, for the fused selection, its ``ExclusionTables``), the beam width,
top_k and the resolved backends (``SearchOptions``) as arguments: no engine, no captured
graphs, no checks. Device work only: with ``static_shapes`` no value reaches the host, so a
search captures in a CUDA graph (``runner``) and traces with ``torch.export``, where the
tables stay inputs of the traced call rather than state of a closure.

``sanitise`` turns raw inputs into a ``RequestBatch`` by the value rules
(``xgr_common.value_rules``; computed by ``reference.input_rules`` or its one-launch kernel),
whatever the values: the search never indexes out of bounds, and the rules' flags say whether
the result may be used. ``search_features`` is that plus ``search`` on the feature graph's raw
tensors: the entry an exported program calls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from torch_engine import attention as attn
from torch_engine import beam_search as bs
from torch_engine.catalog import Catalog
from torch_engine.kv_cache import BeamKV, CachedPrefix, PackedPrompt, SharedKV
from torch_engine.model import Model
from torch_engine.reference.input_rules import input_rules as reference_input_rules
from xgr_common.errors import ConfigError, require
from xgr_common.layout import MaskMode

BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class SearchOptions:
    """The resolved backends of a search.

    attention: "torch" or "triton" (``attention.resolve_backend``); selection: "torch" or
    "triton", the fused ``xgr::constrained_topk`` (``beam_search.resolve_selection``);
    static_shapes: pack prompts request-major into ``B * Lmax`` rows (``kv_cache.PackedPrompt``
    with ``static=True``): no host wait, every shape follows the input shapes, padding slots
    computed. Off, packing selects the valid slots (a data-dependent size: one host wait).
    """

    attention: str = "torch"
    selection: str = "torch"
    static_shapes: bool = False

    def __post_init__(self) -> None:
        for name in ("attention", "selection"):
            require(getattr(self, name) in BACKENDS, ConfigError,
                    f"SearchOptions.{name} must be one of {BACKENDS} (resolved), got "
                    f"{getattr(self, name)!r}")
        require(isinstance(self.static_shapes, bool), ConfigError,
                f"SearchOptions.static_shapes must be a bool, got {self.static_shapes!r}")

    @property
    def fused(self) -> bool:
        """The fused selection (and its exclusion and item-expansion kernels)."""
        return self.selection == "triton"


@dataclass(frozen=True)
class RequestBatch:
    """Sanitised inputs of a search, on one device.

    token_ids: ``[B, L]`` int64 (padding slots 0); total_lengths: ``[B]`` int64 = S + lengths;
    segment_ids: ``[B, L]`` int32 (zeros when ``causal``); prefix_embeds: ``[B, S, hidden]`` in
    the model dtype or None; exclude_items: ``[B, X]`` int64, X >= 1, -1 = padding.
    soft_marker: None, the soft vectors come before the tokens (prompt contract v1); a token
    id, they replace the row's tokens of that id in order (v2: ``xgr_common.prompt_v2``; the
    S markers are counted in the lengths, so total_lengths = lengths).
    """

    token_ids: torch.Tensor
    total_lengths: torch.Tensor
    segment_ids: torch.Tensor
    causal: bool
    prefix_embeds: torch.Tensor | None
    exclude_items: torch.Tensor
    soft_marker: int | None = None

    def to(self, device: torch.device) -> "RequestBatch":
        """The batch on ``device`` (no copy for tensors already there)."""
        return RequestBatch(
            token_ids=self.token_ids.to(device), total_lengths=self.total_lengths.to(device),
            segment_ids=self.segment_ids.to(device), causal=self.causal,
            prefix_embeds=None if self.prefix_embeds is None else self.prefix_embeds.to(device),
            exclude_items=self.exclude_items.to(device), soft_marker=self.soft_marker)


@dataclass(frozen=True)
class PrefillState:
    """What decoding needs from prefill: the packed layout, the shared KV (per layer
    ``[T, Hkv, D]``), each request's last hidden ``[B, hidden]`` and its excluded item rows
    ``[B, X]`` (see ``beam_search.excluded_rows``); cached: the prompts' first tokens in the
    prompt cache (``prompt`` then holds the suffixes), or None."""

    prompt: PackedPrompt
    shared: SharedKV
    last_hidden: torch.Tensor
    excluded: torch.Tensor
    cached: CachedPrefix | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` tokens of each whole prompt (cached part included)."""
        if self.cached is None:
            return self.prompt.lengths
        return self.prompt.lengths + self.cached.lengths


Rules = Callable[..., tuple[torch.Tensor, ...]]


def sanitise(token_ids: torch.Tensor, lengths: torch.Tensor, segment_ids: torch.Tensor | None,
             prefix_embeds: torch.Tensor | None, exclude_items: torch.Tensor | None,
             vocab_size: int, rules: Rules = reference_input_rules,
             extent: torch.Tensor | None = None,
             soft_marker: int | None = None) -> tuple[RequestBatch, torch.Tensor]:
    """The batch the search runs on and the flags of the value rules, on the tokens' device.

    token_ids ``[B, L]`` and lengths ``[B]`` integer; segment_ids ``[B, L]`` int32, or None for
    a causal prompt; prefix_embeds ``[B, S, hidden]`` (used as given) or None; exclude_items
    ``[B, X]`` int64 (-1 = padding) or None; rules: ``reference.input_rules.input_rules`` or
    the kernel of the same signature; extent: for a captured search's padded buffers
    (``reference.input_rules``); soft_marker: see ``RequestBatch`` (the soft vectors then take
    no positions of their own). Returns the ``RequestBatch`` and flags ``[FLAG_COUNT]``
    int64 in ``VALUE_RULES`` order (``checks.Verdict`` reads them). Device ops only.
    """
    causal = segment_ids is None
    soft = 0 if prefix_embeds is None or soft_marker is not None else prefix_embeds.shape[1]
    if exclude_items is None:
        exclude_items = torch.full((token_ids.shape[0], 1), -1, dtype=torch.int64,
                                   device=token_ids.device)
    # Contiguous rows for the kernel (a no-op for the usual inputs).
    flags, tokens, total, segments, exclude = rules(
        token_ids.contiguous(), lengths.contiguous(),
        None if causal else segment_ids.contiguous(), exclude_items.contiguous(),
        vocab_size, soft, causal, extent)
    batch = RequestBatch(token_ids=tokens, total_lengths=total, segment_ids=segments,
                         causal=causal, prefix_embeds=prefix_embeds, exclude_items=exclude,
                         soft_marker=soft_marker)
    return batch, flags


def prefill(model: Model, catalog: Catalog, batch: RequestBatch, options: SearchOptions,
            exclusions=None, cached: CachedPrefix | None = None) -> PrefillState:
    """Pack the prompts and run them once, writing the shared KV; the excluded item rows.

    exclusions: the catalog's ``ExclusionTables`` for the fused selection's kernels, or None
    (plain torch). Unless ``options.static_shapes``, packing selects the valid slots (a
    data-dependent size ``T``): the one place where the host waits for the device.
    cached: each request's first tokens from the prompt cache (``batch`` then holds each
    prompt's suffix: ``cached_search.suffix_batch``); the suffix rows that
    ``cached.write_slots`` keeps are copied into the cache's pages.
    """
    prompt, embeds = _pack(model, batch, options.static_shapes)
    if cached is not None:
        width = prompt.valid.shape[1]
        positions = prompt.positions + cached.lengths[prompt.rows // width]
        prompt = dataclasses.replace(prompt, positions=positions)
    last_hidden, shared = model.prefill(prompt.pack(embeds), prompt, options.attention, cached)
    if cached is not None and cached.write_slots is not None:
        cached.store(shared, prompt.pack(cached.write_slots))
    excluded = bs.excluded_rows_of(batch.exclude_items, catalog, exclusions)
    return PrefillState(prompt, shared, last_hidden, excluded, cached)


def decode(model: Model, catalog: Catalog, state: PrefillState, beam_width: int, top_k: int,
           options: SearchOptions, exclusions=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Constrained beam search over the code levels, then item expansion.

    Returns item ids ``[B, top_k]`` int64 and scores ``[B, top_k]`` float32, best first (-1
    and -inf past the reachable items). No host synchronisation: shapes depend only on the
    batch, ``beam_width``, ``top_k`` and the catalog, and the loop runs a fixed ``levels``
    times.
    """
    layout, cfg = catalog.layout, model.config
    levels, device = layout.levels, state.last_hidden.device
    rows = state.last_hidden.shape[0]
    # One live beam (the prompt), then level 0 works like any level. Dead beams pad it to
    # the ceil(W / C) beams whose C candidates each can fill W slots: they only tie at
    # -inf after the live one, so more of them would change no pick, only cost W x C.
    first = -(-beam_width // layout.codebook_size)
    scores = torch.full((rows, first), bs.NEG_INF, device=device)
    scores[:, 0].fill_(0.0)
    prefixes = torch.zeros((rows, first), dtype=torch.int64, device=device)
    hidden = state.last_hidden[:, None, :]
    beams = BeamKV(cfg.num_layers, rows, beam_width, levels - 1, cfg.num_kv_heads,
                   cfg.head_dim, hidden.dtype, device)
    tokens = prefixes
    fused = options.fused
    # Every decode step has one shape: its attention launches share one counter fill.
    counters = attn.split_counters(rows, beam_width, cfg.num_heads, cfg.num_kv_heads,
                                   state.shared.keys[0].shape[0], cfg.head_dim, device,
                                   options.attention, state.cached)
    blocked = (bs.blocked_prefixes(state.excluded, catalog, exclusions) if fused
               else (None,) * levels)
    for level in range(levels):
        if level > 0:
            hidden = model.decode_step(tokens, state.lengths + (level - 1),
                                       state.shared, state.prompt, beams, slot=level - 1,
                                       backend=options.attention, counters=counters,
                                       cached=state.cached)
        start, _ = layout.level_range(level)
        parents, codes, prefixes, scores = select(
            model, hidden, scores, prefixes, catalog, level, beam_width, state.excluded,
            blocked[level], fused)
        if 0 < level < levels - 1:
            beams.reorder(parents, used_slots=level)
        tokens = codes + start
    return expand(scores, prefixes, state.excluded, catalog, top_k, exclusions)


def select(model: Model, hidden: torch.Tensor, scores: torch.Tensor, prefixes: torch.Tensor,
           catalog: Catalog, level: int, beam_width: int, excluded: torch.Tensor,
           blocked: torch.Tensor | None, fused: bool
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One level's constrained selection: the level's logits of ``hidden [B, W0, hidden]``,
    normalised over the codes the catalog allows after each beam's prefix, and the best
    ``beam_width`` continuations, never into a prefix all of whose items are excluded.

    scores, prefixes: ``[B, W0]`` beam state; excluded: ``[B, X]`` sorted item rows (the torch
    path reads them); blocked: that level's exhausted prefixes (``beam_search.
    blocked_prefixes``, the fused path reads them); fused: the ``xgr::constrained_topk`` op.
    Returns parents, codes, new prefixes and new scores, each ``[B, beam_width]``.
    """
    start, end = catalog.layout.level_range(level)
    # The fused selection widens the logits to float32 as it loads them.
    logits = model.level_logits(hidden, start, end, widen=not fused).expand(*scores.shape, -1)
    if fused:
        return bs.select_fused(logits, scores, prefixes, catalog, level, beam_width, blocked)
    logp, child = bs.constrain(logits, prefixes, catalog, level)
    # At every level: a prefix whose items are all excluded never takes a beam.
    logp = bs.drop_exhausted(logp, child, excluded, catalog, level)
    if catalog.num_prefixes[level + 1] <= beam_width:
        return bs.keep_all(scores, logp, catalog, level, beam_width)
    return bs.rank(scores, logp, child, beam_width)


def expand(scores: torch.Tensor, prefixes: torch.Tensor, excluded: torch.Tensor,
           catalog: Catalog, top_k: int, exclusions=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The final item expansion: the ``top_k`` best items ``[B, top_k]`` (int64, float32
    scores) of the final beams ``scores, prefixes [B, W]``, excluded rows skipped; one kernel
    launch with the fused selection's ``exclusions`` tables."""
    return bs.expand_items_of(scores, prefixes, excluded, catalog, top_k, exclusions)


def search(model: Model, catalog: Catalog, batch: RequestBatch, beam_width: int, top_k: int,
           options: SearchOptions = SearchOptions(), exclusions=None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``decode(prefill(batch))``: items ``[B, top_k]`` int64 and scores float32 of a
    sanitised batch (see ``prefill`` and ``decode``)."""
    state = prefill(model, catalog, batch, options, exclusions)
    return decode(model, catalog, state, beam_width, top_k, options, exclusions)


def search_features(model: Model, catalog: Catalog, token_ids: torch.Tensor,
                    lengths: torch.Tensor, segment_ids: torch.Tensor | None,
                    prefix_embeds: torch.Tensor | None, exclude_items: torch.Tensor | None,
                    beam_width: int, top_k: int, options: SearchOptions = SearchOptions(),
                    exclusions=None, soft_marker: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The traceable search of raw feature tensors: ``sanitise`` by the value rules (plain
    torch, so it traces), then ``search``.

    token_ids ``[B, L]`` and lengths ``[B]`` integer; segment_ids ``[B, L]`` integer or None
    (causal); prefix_embeds ``[B, S, hidden]`` float or None (cast to the model's dtype);
    exclude_items ``[B, X]`` integer (-1 = padding) or None; soft_marker: see
    ``RequestBatch``. Returns items ``[B, top_k]``
    int64, scores ``[B, top_k]`` float32 and the rules' flags ``[FLAG_COUNT]`` int64
    (``VALUE_RULES`` order): on inputs that break a rule the results are of the sanitised
    copy.
    """
    batch, flags = sanitise_features(model, token_ids, lengths, segment_ids, prefix_embeds,
                                     exclude_items, soft_marker)
    items, scores = search(model, catalog, batch, beam_width, top_k, options, exclusions)
    return items, scores, flags


def sanitise_features(model: Model, token_ids: torch.Tensor, lengths: torch.Tensor,
                      segment_ids: torch.Tensor | None, prefix_embeds: torch.Tensor | None,
                      exclude_items: torch.Tensor | None, soft_marker: int | None
                      ) -> tuple[RequestBatch, torch.Tensor]:
    """``sanitise`` of raw feature tensors (soft vectors in the model's dtype, segments
    int32, exclusions int64): the start of every traced search."""
    if prefix_embeds is not None:
        prefix_embeds = prefix_embeds.to(model.lm_head.weight.dtype)
    if segment_ids is not None:
        segment_ids = segment_ids.to(torch.int32)
    if exclude_items is not None:
        exclude_items = exclude_items.to(torch.int64)
    return sanitise(token_ids, lengths, segment_ids, prefix_embeds, exclude_items,
                    model.config.vocab_size, soft_marker=soft_marker)


def place_soft_vectors(embeds: torch.Tensor, marked: torch.Tensor, soft: torch.Tensor
                       ) -> torch.Tensor:
    """``embeds [B, L, hidden]`` with the k-th ``marked [B, L]`` slot of each row replaced by
    ``soft[:, k]`` (``soft [B, S, hidden]``; marks past the S-th take the last vector). Static
    shapes: a gather and a select, no host read."""
    order = (torch.cumsum(marked.to(torch.int64), dim=1) - 1).clamp(0, soft.shape[1] - 1)
    placed = soft.gather(1, order[..., None].expand(-1, -1, soft.shape[2]))
    return torch.where(marked[..., None], placed.to(embeds.dtype), embeds)


def _pack(model: Model, batch: RequestBatch, static: bool
          ) -> tuple[PackedPrompt, torch.Tensor]:
    """Padded input vectors ``[B, S+L, hidden]`` (``[B, L, hidden]`` with a soft marker) and
    their packed description."""
    embeds = model.embed(batch.token_ids)
    segments = batch.segment_ids
    if batch.prefix_embeds is not None and batch.soft_marker is not None:
        embeds = place_soft_vectors(embeds, batch.token_ids == batch.soft_marker,
                                    batch.prefix_embeds)
    elif batch.prefix_embeds is not None:
        soft = batch.prefix_embeds
        embeds = torch.cat([soft, embeds], dim=1)
        segments = torch.cat([torch.zeros(soft.shape[:2], dtype=segments.dtype,
                                          device=segments.device), segments], dim=1)
    slots = torch.arange(embeds.shape[1], device=embeds.device)
    valid = slots[None, :] < batch.total_lengths[:, None]
    mode = MaskMode.CAUSAL if batch.causal else MaskMode.ITEM_CAUSAL
    return PackedPrompt.from_padded(valid, segments, mode, static), embeds
