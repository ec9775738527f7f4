"""Package ``Engine.recommend`` with the prompt-KV cache for TorchCall, whose runtime keeps the
cache (``custom_ops/cc/torch_call/torch/prompt_cache.h``).

The program is ``torch_engine.cached_search.search_features_cached``: the same search as the
plain engine package (``engine_package``), whose prompts' first tokens come from a paged pool
the runtime holds on the package's device. Callers (the SavedModel's TF graph) send the engine
inputs plus ``frozen_lengths`` (the version 2 feature graph's) and ``user_keys``; the runtime
looks the frozen parts up, passes the program the rows' cached lengths, pages and write slots
and the pool, and keeps what a successful run wrote. The contract's ``cache`` line tells the
runtime the pool's geometry, where the prompts are, the mask rule and the scope the entries
belong to (this model, its token layout and mask): a package of another model never reads
them.
"""

from __future__ import annotations

import hashlib
import os

import torch

from torch_engine.cached_search import search_features_cached
from torch_engine.prompt_cache.keys import model_fingerprint
from xgr_common.errors import ConfigError, require
from xgr_common.layout import MaskMode
from xgr_export import torch_package
from xgr_export.config import EngineExportConfig
from xgr_export.engine_package import (MAX_POOL_PAGES, RecommendProgram, bounded_dim,
                                       check_engine_for_export, dynamic_inputs, engine_replay,
                                       engine_rules, example_inputs, require_served_sizes,
                                       require_widths_traced, tables_file, token_bound,
                                       write_tables)

PAGE_TOKENS = 64
CACHE_INPUTS = ("cached_lengths", "block_table", "write_slots", "pool")
# A cached package's buckets: the suffix width takes as many shapes as the prompt's.
GRAPHS_PER_PROMPT_BUCKET = 4


class CachedRecommendProgram(RecommendProgram):
    """``RecommendProgram`` whose prompts' first tokens come from the prompt cache's pool.

    Inputs: the five engine inputs, ``beam_slots`` (or None), then the cache's: cached_lengths
    int64 [B], block_table int32 [B, P], write_slots int64 [B, S] (S the suffix width) and the
    pool [layers, 2, pages, page_tokens, Hkv, D] in the engine's dtype, written in place; then
    the tables with a catalog capacity."""

    def forward(self, token_ids, lengths, segment_ids, profile_embeds, exclude_items,
                beam_slots, cached_lengths, block_table, write_slots, pool, tables=None):
        engine = self.engine
        segment_ids, width, catalog, exclusions = self.search_arguments(
            segment_ids, beam_slots, tables)
        item_ids, scores, _ = search_features_cached(
            self.model, catalog, token_ids, lengths, segment_ids, profile_embeds,
            exclude_items, width, self.top_k, engine.options, exclusions,
            engine.config.soft_marker, pool, block_table, cached_lengths, write_slots)
        return item_ids, scores.to(torch.float32)


def cache_scope(engine, spec, prefill_mask: MaskMode) -> str:
    """What the cached KV belongs to, as one hex token: the model's weights (their
    fingerprint), the token layout (the code space) and the mask rule. A catalog-only version
    reuses the package and keeps its entries; any other model misses them."""
    h = hashlib.blake2b(digest_size=16)
    for part in (model_fingerprint(engine.model), repr(spec.layout), prefill_mask.value):
        h.update(len(part.encode()).to_bytes(4, "little"))
        h.update(part.encode())
    return h.hexdigest()


def cache_line(engine, spec, prefill_mask: MaskMode, runtime: int,
               page_tokens: int = PAGE_TOKENS) -> str:
    """The contract's ``cache`` line (``custom_ops/cc/torch_call/torch/signature.h``)."""
    cfg = engine.model.config
    dtype = str(engine.dtype).removeprefix("torch.")
    layout = spec.layout
    return (f"cache runtime={runtime} page_tokens={page_tokens} layers={cfg.num_layers} "
            f"kv_heads={cfg.num_kv_heads} head_dim={cfg.head_dim} dtype={dtype} tokens=0 "
            f"lengths=1 segments=2 mode={prefill_mask.value} soft={layout.soft_id} "
            f"item_start={layout.item_start_id} scope={cache_scope(engine, spec, prefill_mask)}")


def cache_examples(engine, spec, inputs: tuple, page_tokens: int = PAGE_TOKENS) -> tuple:
    """Example cache inputs for ``inputs`` (``example_inputs``): each row's long-term part
    cached (BOS, the intro and the long-term items), the suffix slots written to the sink, a
    pool with room for every row. The suffix width and page count differ from the prompt's
    length, so the trace keeps them their own symbols."""
    cfg, dtype = engine.model.config, engine.dtype
    tokens = inputs[0]
    rows, width = tokens.shape
    cached = spec.prompt_v2.split.long_term_items * (spec.layout.levels + 1) + 1 + len(
        spec.prompt_v2.spans.intro)
    cached = max(1, min(cached, width - 2))
    # Two spare pages a row: a table one page wide would make the trace specialise its width.
    pages = -(-width // page_tokens) + 2
    cached_lengths = torch.full((rows,), cached, dtype=torch.int64)
    block_table = (torch.arange(rows * pages, dtype=torch.int32).reshape(rows, pages) + 1)
    write_slots = torch.zeros((rows, width - cached), dtype=torch.int64)
    pool = torch.zeros((cfg.num_layers, 2, rows * pages + 1, page_tokens, cfg.num_kv_heads,
                        cfg.head_dim), dtype=dtype)
    return cached_lengths, block_table, write_slots, pool


def export_cached_engine(engine, spec, out_path: str | os.PathLike,
                         config: EngineExportConfig = EngineExportConfig(),
                         cache_dir: str | os.PathLike | None = None,
                         prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL,
                         layer_kernels: bool = False, capacity=None,
                         page_tokens: int = PAGE_TOKENS) -> torch_package.Package:
    """``export_engine`` of a package whose runtime keeps a prompt-KV cache for the version 2
    prompt's frozen long-term part (``ConfigError`` for a version 1 model: nothing comes
    before its soft vectors, so no part of its prompts can be cached)."""
    require(spec.version == 2, ConfigError,
            f"the prompt cache keeps the frozen long-term part of the version 2 prompt; this "
            f"model's card says prompt version {spec.version}, whose soft vectors come first "
            f"(re-fit it with prompt version 2, or export it without the cache)")
    check_engine_for_export(engine, spec, config)
    program = CachedRecommendProgram(engine, config.beam_width, config.top_k, prefill_mask,
                                     layer_kernels, capacity)
    inputs = example_inputs(engine, spec)
    widest = token_bound(engine)
    dynamic = dynamic_inputs(spec, config, widest)
    if config.beam_widths:
        inputs += (torch.zeros(config.beam_width, dtype=torch.int8),)
        dynamic += ({0: torch.export.Dim.DYNAMIC},)
    else:
        inputs, dynamic = inputs + (None,), dynamic + (None,)
    runtime = len([t for t in inputs if t is not None])
    batch = dynamic[0][0]
    inputs += cache_examples(engine, spec, inputs, page_tokens)
    dynamic += ({0: batch}, {0: batch, 1: bounded_dim(widest)},
                {0: batch, 1: bounded_dim(widest)}, {2: bounded_dim(MAX_POOL_PAGES)})
    if capacity is not None:
        tables = tuple(program.tables.tensors().values())
        inputs += (tables,)
        dynamic += (tuple(None for _ in tables),)
    exported = torch_package.export_program(program, inputs, dynamic, config.device)
    if config.beam_widths:
        require_widths_traced(exported, config.beam_widths)
    replay = engine_replay(engine, spec)
    if replay.graphs:
        replay = torch_package.Replay(replay.buckets, replay.pads,
                                      replay.graphs * GRAPHS_PER_PROMPT_BUCKET)
    package = torch_package.package_aoti(
        exported, out_path, config.device, cache_dir, same_dims=[((0, 1), (2, 1))],
        rules=engine_rules(engine, program.prefill_mask), replay=replay,
        tables=tuple(program.tables.names) if capacity is not None else (),
        extra=(cache_line(engine, spec, program.prefill_mask, runtime, page_tokens),))
    require_served_sizes(package, spec, config)
    if capacity is not None:
        write_tables(tables_file(out_path), program.tables.tensors(), capacity, engine.catalog)
    return package
