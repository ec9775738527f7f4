"""The generative-retrieval engine: prompt batch in, top-k catalog items out.

``Engine.recommend`` = ``check_arguments`` (shapes checked on the host), the value rules
computed on the device, then ``search`` (device only: prefill once, one decode step per further
code level, constrained beam selection, item expansion; no host synchronisation, traceable with
``torch.export``), then one read of the value rules' verdict: one host synchronisation per
batch, at the end (``InvalidInputError`` then, and the batch's results are dropped). With
whole-search CUDA graphs the rules run inside the graph (``padded_inputs``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from torch_engine import attention as attn
from torch_engine import beam_search as bs
from torch_engine.attention import resolve_backend
from torch_engine.capacity import check_request, check_shape, run_contained
from torch_engine.catalog import Catalog
from torch_engine.config import EngineConfig
from xgr_common.errors import ConfigError, XgrError, require
from torch_engine.graphs import DecodeGraphs, SearchGraphs
from torch_engine.inputs import (RequestBatch, Verdict, apply_rules, check_arguments,
                                 verdict_of)
from torch_engine.kv_cache import BeamKV, PackedPrompt, SharedKV
from xgr_common.layout import MaskMode
from torch_engine.model import Model


@dataclass(frozen=True)
class PrefillState:
    """What decoding needs from prefill: the packed layout, the shared KV (per layer
    ``[T, Hkv, D]``), each request's last hidden ``[B, hidden]`` and its excluded item rows
    ``[B, X]`` (see ``beam_search.excluded_rows``)."""

    prompt: PackedPrompt
    shared: SharedKV
    last_hidden: torch.Tensor
    excluded: torch.Tensor


@contextmanager
def _inputs_first(verdict: Verdict):
    """When the work fails (capacity, out of memory), an invalid input is the error to report:
    the verdict is read first and its ``InvalidInputError`` replaces the failure."""
    try:
        yield
    except XgrError:
        verdict.raise_if_invalid()
        raise


class Engine:
    """Serves one model over one catalog.

    model: a ``Model`` whose vocabulary holds the catalog layout's code tokens (its dtype is
    changed to ``config.dtype`` when given; its layers get fused projection copies, see
    ``Model.fuse_projections``); catalog: moved to the model's device.

    On CUDA with ``cuda_graphs`` (the default) the whole search of a batch is one captured
    graph per bucketed shape (``EngineConfig.static_shapes``, ``length_bucket``,
    ``batch_buckets``): one replay and no host wait between the input copy and the result.
    """

    def __init__(self, model: Model, catalog: Catalog, config: EngineConfig = EngineConfig()):
        layout = catalog.layout
        require(model.config.vocab_size >= layout.code_end, ConfigError,
                f"model vocab_size {model.config.vocab_size} must cover the catalog's code "
                f"tokens (code_end = {layout.code_end})")
        if config.dtype is not None:
            model = model.to(getattr(torch, config.dtype))
        self.model = model.eval()
        self.model.fuse_projections(config.layer_kernels)
        self.config = config
        self.device = next(model.parameters()).device
        self.catalog = catalog.to(self.device)
        self.backend = resolve_backend(config.attention_backend, self.device)
        self.selection = bs.resolve_selection(config.selection_backend, self.device)
        # The fused selection also takes the exclusions and the item expansion through its
        # kernels (three launches instead of ~100 small torch kernels a search).
        self.exclusion_tables = (bs.fused_exclusion_tables(self.catalog)
                                 if self.selection == "triton" else None)
        graphed = config.cuda_graphs and self.device.type == "cuda"
        self.static_shapes = graphed if config.static_shapes is None else config.static_shapes
        self.graphs: DecodeGraphs | SearchGraphs | None = None
        if graphed:
            kind = SearchGraphs if self.static_shapes else DecodeGraphs
            self.graphs = kind(self, config.max_graphs)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def recommend(self, token_ids, lengths, segment_ids=None, beam_width: int = 256,
                  top_k: int = 300, prefix_embeds=None, exclude_items=None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k items for each request of a batch.

        token_ids: ``[B, L]`` int, right-padded prompts (see ``xgr_common.prompt_spec``);
        lengths: ``[B]`` int, tokens of each row (1..L); segment_ids: ``[B, L]`` int32 hybrid
        mask layout (prefill mask ``ITEM_CAUSAL``), or None for a causal prompt;
        prefix_embeds: ``[B, S, hidden]`` float soft tokens placed before ``token_ids``
        (segment 0); exclude_items: ``[B, X]`` int64 padded with -1, or a list of B 1-D int
        tensors: those items are never returned, and at every level a prefix all of whose
        items are excluded never takes a beam. Generated codes attend the whole prompt and the
        earlier codes.

        Returns item ids ``[B, top_k]`` int64 and scores ``[B, top_k]`` float32 (the path's
        log-probability, each level normalised over the codes the catalog allows), best first;
        when the final beams reach fewer than ``top_k`` items, the tail holds -1 and -inf.

        Raises ``InvalidInputError`` naming the argument and the rule: for shapes and dtypes
        before any work, for values (lengths, ids, segment order, prompt length) after the
        search, when their verdict is read (the search ran on a sanitised copy; its results
        are dropped), so a valid batch costs one host synchronisation, at the end.
        Raises ``CapacityError`` before any work when the estimated memory
        (``capacity.estimate_request``) exceeds what is free (not asked again for a shape
        whose graph is captured: its memory is already held), and when the device runs out
        of memory during the batch (the batch is dropped; the next call runs normally).
        """
        args = check_arguments(self, token_ids, lengths, segment_ids, beam_width, top_k,
                               prefix_embeds, exclude_items)
        rows = args.token_ids.shape[0]
        graphs = self.graphs
        what = f"a batch of {rows} requests"
        held = None
        if isinstance(graphs, SearchGraphs):
            # The serving path: copies into the bucket's buffers, one replay (rules included).
            with torch.no_grad():
                held = run_contained(lambda: graphs.replay_held(args, beam_width, top_k),
                                     self.device, what)
        if held is not None:
            items, scores, flags = held
            verdict = verdict_of(self, args, flags)
        else:
            # Rules first (their verdict outranks a capacity error), the memory check, then
            # the search, which captures a whole-search graph for this bucket when graphed.
            batch, verdict = apply_rules(self, args)
            with _inputs_first(verdict):
                if isinstance(graphs, SearchGraphs):
                    bucket = graphs.bucket(args)
                    check_shape(self, bucket.rows, bucket.soft + bucket.width, bucket.excluded,
                                beam_width, top_k)
                    search = lambda: graphs.run(args, beam_width, top_k)[:2]  # noqa: E731
                else:
                    check_request(self, batch, beam_width, top_k)
                    search = lambda: self.search(batch, beam_width, top_k)  # noqa: E731
                with torch.no_grad():
                    items, scores = run_contained(search, self.device, what)
        verdict.raise_if_invalid()             # the batch's one host synchronisation
        if items.shape[0] != rows:             # a bucket's padding rows
            items, scores = items[:rows], scores[:rows]
        return items, scores

    def search(self, batch: RequestBatch, beam_width: int, top_k: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The device part of ``recommend`` on checked inputs (see ``inputs.check_inputs``);
        on CUDA it replays captured graphs (decode, or with static shapes the whole search)
        unless ``config.cuda_graphs`` is off.

        It traces (``torch.export``; the graphs are skipped while tracing); with
        ``static_shapes=True`` every shape follows the input shapes (no unbacked sizes).
        """
        # Under torch.export / torch.compile the eager path is traced; graphs are for serving.
        graphs = None if torch.compiler.is_compiling() else self.graphs
        if isinstance(graphs, SearchGraphs):
            return graphs.run_checked(batch, beam_width, top_k)
        state = self.prefill(batch)
        if isinstance(graphs, DecodeGraphs):
            return graphs.run(state, beam_width, top_k)
        return self.decode(state, beam_width, top_k)

    def prefill(self, batch: RequestBatch) -> PrefillState:
        """Pack the prompts and run them once, writing the shared KV.

        Unless ``static_shapes``, packing selects the valid slots (a data-dependent size
        ``T``): the one place where the host waits for the device.
        """
        prompt, embeds = self._pack(batch)
        last_hidden, shared = self.model.prefill(prompt.pack(embeds), prompt, self.backend)
        excluded = bs.excluded_rows_of(batch.exclude_items, self.catalog,
                                       self.exclusion_tables)
        return PrefillState(prompt, shared, last_hidden, excluded)

    def decode(self, state: PrefillState, beam_width: int, top_k: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Constrained beam search over the code levels, then item expansion.

        No host synchronisation: shapes depend only on the batch, ``beam_width``, ``top_k``
        and the catalog, and the loop runs a fixed ``levels`` times.
        """
        model, catalog, layout = self.model, self.catalog, self.catalog.layout
        width, levels, cfg = beam_width, layout.levels, model.config
        rows = state.last_hidden.shape[0]
        # One live beam (the prompt), then level 0 works like any level. Dead beams pad it to
        # the ceil(W / C) beams whose C candidates each can fill W slots: they only tie at
        # -inf after the live one, so more of them would change no pick, only cost W x C.
        first = -(-width // layout.codebook_size)
        scores = torch.full((rows, first), bs.NEG_INF, device=self.device)
        scores[:, 0].fill_(0.0)
        prefixes = torch.zeros((rows, first), dtype=torch.int64, device=self.device)
        hidden = state.last_hidden[:, None, :]
        beams = BeamKV(cfg.num_layers, rows, width, levels - 1, cfg.num_kv_heads,
                       cfg.head_dim, hidden.dtype, self.device)
        tokens = prefixes
        fused = self.selection == "triton"
        # Every decode step has one shape: its attention launches share one counter fill.
        counters = attn.split_counters(rows, width, cfg.num_heads, cfg.num_kv_heads,
                                       state.shared.keys[0].shape[0], cfg.head_dim,
                                       self.device, self.backend)
        if fused:
            blocked = bs.blocked_prefixes(state.excluded, catalog, self.exclusion_tables)
        for level in range(levels):
            if level > 0:
                hidden = model.decode_step(tokens, state.prompt.lengths + (level - 1),
                                           state.shared, state.prompt, beams, slot=level - 1,
                                           backend=self.backend, counters=counters)
            start, end = layout.level_range(level)
            # The fused selection widens the logits to float32 as it loads them.
            logits = model.level_logits(hidden, start, end, widen=not fused).expand(
                *scores.shape, -1)
            if fused:
                parents, codes, prefixes, scores = bs.select_fused(
                    logits, scores, prefixes, catalog, level, width, blocked[level])
            else:
                logp, child = bs.constrain(logits, prefixes, catalog, level)
                # At every level: a prefix whose items are all excluded never takes a beam.
                logp = bs.drop_exhausted(logp, child, state.excluded, catalog, level)
                if catalog.num_prefixes[level + 1] <= width:
                    parents, codes, prefixes, scores = bs.keep_all(scores, logp, catalog,
                                                                   level, width)
                else:
                    parents, codes, prefixes, scores = bs.rank(scores, logp, child, width)
            if 0 < level < levels - 1:
                beams.reorder(parents, used_slots=level)
            tokens = codes + start
        return bs.expand_items_of(scores, prefixes, state.excluded, catalog, top_k,
                                  self.exclusion_tables)

    def _pack(self, batch: RequestBatch) -> tuple[PackedPrompt, torch.Tensor]:
        """Padded input vectors ``[B, S+L, hidden]`` and their packed description."""
        embeds = self.model.embed(batch.token_ids)
        segments = batch.segment_ids
        if batch.prefix_embeds is not None:
            soft = batch.prefix_embeds
            embeds = torch.cat([soft, embeds], dim=1)
            segments = torch.cat([torch.zeros(soft.shape[:2], dtype=segments.dtype,
                                              device=segments.device), segments], dim=1)
        slots = torch.arange(embeds.shape[1], device=self.device)
        valid = slots[None, :] < batch.total_lengths[:, None]
        mode = MaskMode.CAUSAL if batch.causal else MaskMode.ITEM_CAUSAL
        return PackedPrompt.from_padded(valid, segments, mode, self.static_shapes), embeds
