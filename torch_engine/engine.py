"""The generative-retrieval engine: prompt batch in, top-k catalog items out.

``Engine.recommend`` = ``checks.check_arguments`` (shapes on the host), the memory check of a
shape not captured yet (``capacity``), one ``runner.Runner.run`` (the value rules and the
search, on the device: eagerly, or one replay of the bucket's captured graph), then one read
of the rules' ``Verdict``: one host synchronisation per batch, at the end
(``InvalidInputError`` then, and the batch's results are dropped). The search itself is plain
functions (``torch_engine.search``).

With a ``PromptCache`` and ``frozen_lengths``, each request's frozen prompt part is read from
the cache (or computed once and kept) and only the rest is prefilled
(``torch_engine.cached_search``: eager on the CPU, one graph replay per shape on CUDA).
"""

from __future__ import annotations

import torch

from torch_engine import beam_search as bs
from torch_engine.attention import resolve_backend
from torch_engine import cached_search
from torch_engine.capacity import Footprint, check_capacity, run_contained
from torch_engine.catalog import Catalog
from torch_engine.checks import ArgumentLimits, check_arguments
from torch_engine.config import EngineConfig
from torch_engine.model import Model
from torch_engine.prompt_cache import KVGeometry, PromptCache, scope_of
from torch_engine.runner import Runner
from torch_engine.search import SearchOptions
from xgr_common.errors import CapacityError, ConfigError, InvalidInputError, require
from xgr_common.layout import MaskMode


class Engine:
    """Serves one model over one catalog.

    model: a ``Model`` whose vocabulary holds the catalog layout's code tokens (its dtype is
    changed to ``config.dtype`` when given; its layers get fused projection copies, see
    ``Model.fuse_projections``); catalog: moved to the model's device.

    On CUDA with ``cuda_graphs`` (the default) the whole search of a batch is one captured
    graph per bucketed shape (``EngineConfig.static_shapes``, ``bucket_policy``): one replay
    and no host wait between the input copy and the result.

    prompt_cache: a ``PromptCache`` for this model's KV on its device (``PromptCache.
    for_model`` after the dtype change), which ``recommend``'s ``frozen_lengths`` use; it may
    outlive the engine and serve the next one of the same model. model_version: the name its
    entries are scoped by (``prompt_cache.keys``); None: a fingerprint of the weights.

    Attributes: ``options`` (the resolved backends), ``runner`` (buffers, buckets and captured
    graphs; ``len(runner)`` graphs held), ``limits`` (what the arguments are checked
    against), ``footprint`` (what the memory estimate reads), ``prompt_cache``.
    """

    def __init__(self, model: Model, catalog: Catalog, config: EngineConfig = EngineConfig(),
                 prompt_cache: PromptCache | None = None, model_version: str | None = None):
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
        graphed = config.cuda_graphs and self.device.type == "cuda"
        static = graphed if config.static_shapes is None else config.static_shapes
        self.options = SearchOptions(
            attention=resolve_backend(config.attention_backend, self.device),
            selection=bs.resolve_selection(config.selection_backend, self.device),
            static_shapes=static)
        # The fused selection also takes the exclusions and the item expansion through its
        # kernels (three launches instead of ~100 small torch kernels a search).
        exclusions = (bs.fused_exclusion_tables(self.catalog) if self.options.fused
                      else None)
        require(config.soft_marker in (None, layout.soft_id), ConfigError,
                f"EngineConfig.soft_marker must be None (prompt version 1) or the layout's "
                f"SOFT token id {layout.soft_id} (prompt version 2), got {config.soft_marker}")
        self.runner = Runner(self.model, self.catalog, self.options,
                             config.bucket_policy if graphed and static else None,
                             config.max_graphs, exclusions, config.soft_marker)
        cfg = self.model.config
        self.limits = ArgumentLimits(self.catalog, cfg.hidden_size, config.max_beam_width,
                                     config.max_exclude, self.device, self.dtype)
        self.footprint = Footprint(cfg, self.dtype.itemsize, self.catalog.levels,
                                   layout.codebook_size, self.options.attention,
                                   self.options.selection)
        self.prompt_cache = prompt_cache
        self.cached_runner = None
        self._scopes = {}
        if prompt_cache is not None:
            want = KVGeometry.of_model(cfg, self.dtype)
            require(prompt_cache.geometry == want and prompt_cache.device == self.device,
                    ConfigError,
                    f"the prompt cache holds {prompt_cache.geometry} on "
                    f"{prompt_cache.device}; this engine's KV is {want} on {self.device}")
            self._scopes = {mode: scope_of(self.model, layout, mode, model_version)
                            for mode in (MaskMode.CAUSAL, MaskMode.ITEM_CAUSAL)}
            self.cached_runner = cached_search.CachedRunner(self.runner, prompt_cache,
                                                            config.max_graphs)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def recommend(self, token_ids, lengths, segment_ids=None, beam_width: int = 256,
                  top_k: int = 300, prefix_embeds=None, exclude_items=None,
                  frozen_lengths=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k items for each request of a batch.

        token_ids: ``[B, L]`` int, right-padded prompts (see ``xgr_common.prompt_spec``);
        lengths: ``[B]`` int, tokens of each row (1..L); segment_ids: ``[B, L]`` int32 hybrid
        mask layout (prefill mask ``ITEM_CAUSAL``), or None for a causal prompt;
        prefix_embeds: ``[B, S, hidden]`` float soft tokens placed before ``token_ids``
        (segment 0), or with ``EngineConfig.soft_marker`` at each row's SOFT markers;
        exclude_items: ``[B, X]`` int64 padded with -1, or a list of B 1-D int tensors:
        those items are never returned, and at every level a prefix all of whose items are
        excluded never takes a beam. Generated codes attend the whole prompt and the
        earlier codes. frozen_lengths: ``[B]`` int, each row's frozen part
        (``xgr_common.prompt_v2``; 0: none), read from and kept in the engine's
        ``prompt_cache``; the results equal those without it within the tolerance table.

        Returns item ids ``[B, top_k]`` int64 and scores ``[B, top_k]`` float32 (the path's
        log-probability, each level normalised over the codes the catalog allows), best first;
        when the final beams reach fewer than ``top_k`` items, the tail holds -1 and -inf.

        Raises ``InvalidInputError`` naming the argument and the rule: for shapes and dtypes
        before any work, for values (``xgr_common.value_rules``) after the search, when their
        verdict is read (the search ran on a sanitised copy; its results are dropped), so a
        valid batch costs one host synchronisation, at the end.
        Raises ``CapacityError`` before any work when the estimated memory
        (``capacity.estimate_request``) exceeds what is free (not asked again for a shape
        whose graph is captured: its memory is already held), and when the device runs out
        of memory during the batch (the batch is dropped; the next call runs normally). An
        invalid input's ``InvalidInputError`` outranks either.
        """
        args = check_arguments(self.limits, token_ids, lengths, segment_ids, beam_width, top_k,
                               prefix_embeds, exclude_items)
        if frozen_lengths is not None:
            return self._recommend_cached(args, frozen_lengths, beam_width, top_k)
        rows = args.token_ids.shape[0]
        runner = self.runner
        with torch.no_grad():
            try:
                shape = runner.shape(args)
                if not runner.holds(shape, beam_width, top_k):
                    check_capacity(self.footprint, shape, beam_width, top_k, self.device,
                                   self.config.memory_budget)
                items, scores, verdict = run_contained(
                    lambda: runner.run(args, beam_width, top_k, shape), self.device,
                    f"a batch of {rows} requests")
            except CapacityError:
                runner.verdict(args).raise_if_invalid()     # an invalid input outranks it
                raise
        verdict.raise_if_invalid()             # the batch's one host synchronisation
        if items.shape[0] != rows:             # a bucket's padding rows
            items, scores = items[:rows], scores[:rows]
        return items, scores

    def _recommend_cached(self, args, frozen_lengths, beam_width: int, top_k: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """``recommend`` through the prompt cache: reserve, search, keep what the batch wrote
        only when its verdict passes. A batch of hits and misses runs as two searches
        (``cached_search.suffix_groups``): one pads every row to its longest suffix."""
        require(self.prompt_cache is not None, ConfigError,
                "frozen_lengths needs an Engine made with a prompt_cache")
        rows = cached_search.prompt_rows(args, frozen_lengths, self.config.soft_marker,
                                         self.catalog.layout.item_start_id)
        cache = self.prompt_cache
        mode = MaskMode.CAUSAL if args.causal else MaskMode.ITEM_CAUSAL
        reservation = cache.reserve(self._scopes[mode], rows)
        kept = False
        try:
            groups = cached_search.suffix_groups(
                [r.length - p.cached for r, p in zip(rows, reservation.plans)],
                self.runner.policy, cache.config.split_run_tokens)
            if len(groups) == 1:
                items, scores = self._search_cached(args, rows, reservation, beam_width, top_k)
            else:
                items = scores = None
                for group in groups:
                    part = reservation.rows(group)
                    got, got_scores = self._search_cached(
                        cached_search.rows_of(args, group), [rows[b] for b in group], part,
                        beam_width, top_k, whole=args)
                    if items is None:
                        items = got.new_empty((len(rows), *got.shape[1:]))
                        scores = got_scores.new_empty((len(rows), *got_scores.shape[1:]))
                    index = torch.tensor(group, device=got.device)
                    items.index_copy_(0, index, got)
                    scores.index_copy_(0, index, got_scores)
            kept = True
        finally:
            cache.finish(reservation, keep=kept)
        return items, scores

    def _search_cached(self, args, rows, reservation, beam_width: int, top_k: int,
                       whole=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One cached search of ``rows`` (their ``args``, planned in ``reservation``), its
        verdict read; ``whole``: the batch these rows are part of, whose verdict names a
        broken rule by the batch's row."""
        runner = self.runner
        with torch.no_grad():
            try:
                cached_shape = self.cached_runner.shape(args, rows, reservation)
                if not self.cached_runner.holds(cached_shape, beam_width, top_k):
                    check_capacity(self.footprint, cached_shape.bucket, beam_width, top_k,
                                   self.device, self.config.memory_budget)
                items, scores, verdict = run_contained(
                    lambda: self.cached_runner.run(args, rows, reservation, beam_width,
                                                   top_k),
                    self.device, f"a batch of {len(rows)} requests")
            except CapacityError:
                runner.verdict(args if whole is None else whole).raise_if_invalid()
                raise
        try:
            verdict.raise_if_invalid()
        except InvalidInputError:
            if whole is not None:             # the message names the batch's values
                runner.verdict(whole).raise_if_invalid()
            raise
        if items.shape[0] != len(rows):          # a bucket's padding rows
            items, scores = items[:len(rows)], scores[:len(rows)]
        return items, scores
