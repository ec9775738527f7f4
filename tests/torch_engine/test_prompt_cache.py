"""The prompt-KV cache in the engine (fp32, the CPU): every cached search equals the full
recompute (items exactly, scores within the tolerance table) under both prefill masks, with
soft vectors and exclusions; hits, partial hits after a block closes, changed blocks,
eviction under a small budget, the host tier, concurrent requests, invalid requests that
leave nothing behind, and the model scope of entries."""

import threading
from typing import NamedTuple

import pytest
import torch

from tests.torch_engine.engine_worlds import small_world, v2_prompts
from torch_engine import cached_search
from torch_engine.catalog import Catalog
from torch_engine.checks import check_arguments
from torch_engine.config import EngineConfig, preset
from torch_engine.engine import Engine
from torch_engine.model import Model
from torch_engine.prompt_cache import KVGeometry, PromptCache, PromptCacheConfig
from xgr_common.errors import ConfigError, InvalidInputError
from xgr_common.buckets import BucketPolicy, bucket_of
from xgr_common.layout import MaskMode, TokenLayout
from xgr_common.tolerances import RANKED_LIST_RULE, scores_tied, tolerance_for

LAYOUT = TokenLayout()
SOFT = 2
FP32 = tolerance_for(torch.float32)
MASKS = ["causal", "item_causal"]


@pytest.fixture(scope="module")
def model():
    return Model.from_preset("tiny", seed=5)


@pytest.fixture(scope="module")
def catalog():
    return Catalog.from_arrays(*small_world(seed=1, n=300, used_codes=12))


@pytest.fixture(scope="module")
def plain(model, catalog):
    """The engine without a cache: the reference of every comparison."""
    return Engine(model, catalog, _config())


def _config():
    return EngineConfig(soft_marker=LAYOUT.soft_id)


def _cached_engine(model, catalog, pages=64, host_pages=0, version="tiny-v1", page_tokens=16,
                   split_run_tokens=512):
    geometry = KVGeometry.of_model(model.config, torch.float32)
    page = geometry.page_bytes(page_tokens)
    cache = PromptCache(geometry, PromptCacheConfig(device_bytes=pages * page,
                                                    host_bytes=host_pages * page,
                                                    page_tokens=page_tokens,
                                                    split_run_tokens=split_run_tokens), "cpu")
    return Engine(model, catalog, _config(), prompt_cache=cache, model_version=version)


class Prompt(NamedTuple):
    token_ids: torch.Tensor
    lengths: torch.Tensor
    segment_ids: torch.Tensor
    frozen_lengths: torch.Tensor


def _batch(users, seed=0):
    """A v2 prompt batch of ``users``: (long-term items, recent items, context token) each,
    with soft vectors."""
    prompt = Prompt(*v2_prompts(users, LAYOUT, soft_tokens=SOFT))
    gen = torch.Generator().manual_seed(seed)
    soft = torch.randn(len(users), SOFT, 64, generator=gen)
    return prompt, soft


def _recommend(engine, prompt, soft, mask, exclude=None, cached=True, width=24, top_k=30):
    segments = None if mask == "causal" else prompt.segment_ids
    return engine.recommend(prompt.token_ids, prompt.lengths, segments, beam_width=width,
                            top_k=top_k, prefix_embeds=soft, exclude_items=exclude,
                            frozen_lengths=prompt.frozen_lengths if cached else None)


def _assert_same(got, want, what):
    items, scores = got
    ref_items, ref_scores = want
    assert torch.equal(items, ref_items), f"{what}: items differ\n{items}\n{ref_items}"
    finite = torch.isfinite(ref_scores)
    assert torch.equal(torch.isfinite(scores), finite), f"{what}: reachable items differ"
    torch.testing.assert_close(scores[finite], ref_scores[finite], atol=FP32.atol,
                               rtol=FP32.rtol, msg=what)


USERS = [([3, 4, 8, 9, 11], [5, 6], 1), ([12, 13, 14, 15, 16, 17, 18], [2], 3),
         ([21], [22, 23, 24], 0)]


@pytest.fixture
def excluded(plain):
    """Each row excludes its first reference results (the exclusion kernels' input)."""
    return torch.tensor([[1000 + 20 * k for k in range(4)], [-1, -1, -1, -1],
                         [1040, -1, -1, -1]])


@pytest.mark.parametrize("mask", MASKS)
def test_a_miss_then_a_hit_equal_the_full_recompute(model, catalog, plain, mask):
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch(USERS)
    reference = _recommend(plain, prompt, soft, mask, cached=False)
    exclude = reference[0][:, :5].clone()          # the best items, excluded on the way
    reference_ex = _recommend(plain, prompt, soft, mask, exclude, cached=False)
    _assert_same(_recommend(engine, prompt, soft, mask, exclude), reference_ex, "miss")
    first = engine.prompt_cache.stats()
    assert (first.misses, first.device_hits, first.entries) == (3, 0, 3)
    assert first.tokens_written == int(prompt.frozen_lengths.sum())
    _assert_same(_recommend(engine, prompt, soft, mask, exclude), reference_ex, "hit")
    _assert_same(_recommend(engine, prompt, soft, mask), reference, "hit, no exclusions")
    after = engine.prompt_cache.stats()
    assert (after.misses, after.device_hits, after.entries) == (3, 6, 3)
    assert after.tokens_reused == 2 * first.tokens_written


# Model shapes beside the tiny preset's (Qwen2, 4 query heads on 2 KV heads, head 16): a
# Qwen3 block (head norms, no bias, heads * head_dim wider than the model), plain multi-head
# attention, and a KV group of 3, which no power-of-two tile holds whole.
SHAPES = {
    "qwen3-style": dict(qk_norm=True, attention_bias=False, head_dim=32),
    "multi-head": dict(num_heads=4, num_kv_heads=4, head_dim=16),
    "group-of-3": dict(num_heads=6, num_kv_heads=2, head_dim=8),
}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_other_model_shapes_hit_as_the_full_recompute(catalog, mask, shape):
    model = Model.from_config(preset("tiny").replace(**SHAPES[shape]), seed=7)
    plain = Engine(model, catalog, _config())
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch(USERS)
    reference = _recommend(plain, prompt, soft, mask, cached=False)
    _assert_same(_recommend(engine, prompt, soft, mask), reference, f"{shape} miss")
    _assert_same(_recommend(engine, prompt, soft, mask), reference, f"{shape} hit")
    stats = engine.prompt_cache.stats()
    assert (stats.misses, stats.device_hits) == (3, 3)


@pytest.mark.parametrize("mask", MASKS)
def test_other_soft_vectors_and_recent_items_reuse_the_frozen_part(model, catalog, plain,
                                                                   mask):
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch(USERS, seed=0)
    _recommend(engine, prompt, soft, mask)
    later = [(long, recent + [30], context + 1) for long, recent, context in USERS]
    prompt2, soft2 = _batch(later, seed=7)
    assert torch.equal(prompt2.frozen_lengths, prompt.frozen_lengths)
    _assert_same(_recommend(engine, prompt2, soft2, mask),
                 _recommend(plain, prompt2, soft2, mask, cached=False), "later request")
    assert engine.prompt_cache.stats().device_hits == 3


@pytest.mark.parametrize("mask", MASKS)
def test_a_closed_block_appends_in_place(model, catalog, plain, mask):
    engine = _cached_engine(model, catalog)
    user = USERS[0]
    prompt, soft = _batch([user])
    _recommend(engine, prompt, soft, mask)
    grown = ([*user[0], 40, 41, 42, 43, 44, 45], user[1], user[2])
    prompt2, soft2 = _batch([grown])
    _assert_same(_recommend(engine, prompt2, soft2, mask),
                 _recommend(plain, prompt2, soft2, mask, cached=False), "appended")
    stats = engine.prompt_cache.stats()
    assert (stats.partial_hits, stats.entries) == (1, 1)        # grew in place
    assert stats.tokens_reused == int(prompt.frozen_lengths[0])
    # Both lengths are served by the one entry afterwards.
    for p, s in ((prompt, soft), (prompt2, soft2)):
        _assert_same(_recommend(engine, p, s, mask), _recommend(plain, p, s, mask,
                                                                  cached=False), "reread")
    assert engine.prompt_cache.stats().device_hits == 3


@pytest.mark.parametrize("mask", MASKS)
def test_two_continuations_of_one_prefix_share_its_pages(model, catalog, plain, mask):
    engine = _cached_engine(model, catalog)
    base = list(range(50, 58))
    for tail in ([60, 61], [70, 71, 72]):
        prompt, soft = _batch([(base, [5], 1)])
        _recommend(engine, prompt, soft, mask)
        prompt, soft = _batch([(base + tail, [5], 1)])
        _assert_same(_recommend(engine, prompt, soft, mask),
                     _recommend(plain, prompt, soft, mask, cached=False), f"tail {tail}")
    stats = engine.prompt_cache.stats()
    assert stats.entries == 2 and stats.partial_hits == 2


@pytest.mark.parametrize("mask", MASKS)
def test_a_changed_long_term_block_is_never_served_from_the_old_entry(model, catalog, plain,
                                                                     mask):
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch([([3, 4, 8, 9, 11], [5], 1)])
    _recommend(engine, prompt, soft, mask)
    changed, soft2 = _batch([([3, 4, 7, 9, 11], [5], 1)])      # the third item differs
    _assert_same(_recommend(engine, changed, soft2, mask),
                 _recommend(plain, changed, soft2, mask, cached=False), "changed")
    stats = engine.prompt_cache.stats()
    # At most the part before the changed item came from the cache.
    start_of_third = int(torch.nonzero(changed.token_ids[0] != prompt.token_ids[0])[0])
    assert stats.tokens_reused <= start_of_third
    assert stats.device_hits <= 1 and stats.entries == 2


@pytest.mark.parametrize("mask", MASKS)
def test_eviction_under_a_small_budget_keeps_results(model, catalog, plain, mask):
    engine = _cached_engine(model, catalog, pages=5)
    users = [(list(range(100 + 9 * u, 108 + 9 * u)), [5], u) for u in range(6)]
    for round_ in range(2):
        for user in users:
            prompt, soft = _batch([user], seed=round_)
            _assert_same(_recommend(engine, prompt, soft, mask),
                         _recommend(plain, prompt, soft, mask, cached=False), f"user {user}")
    stats = engine.prompt_cache.stats()
    assert stats.evictions > 0
    assert stats.device_bytes <= engine.prompt_cache.config.device_bytes


def test_the_host_tier_brings_evicted_entries_back(model, catalog, plain):
    engine = _cached_engine(model, catalog, pages=3, host_pages=64)
    users = [(list(range(100 + 9 * u, 108 + 9 * u)), [5], u) for u in range(4)]
    for round_ in range(2):
        for user in users:
            prompt, soft = _batch([user], seed=round_)
            _assert_same(_recommend(engine, prompt, soft, "item_causal"),
                         _recommend(plain, prompt, soft, "item_causal", cached=False),
                         f"round {round_}")
    stats = engine.prompt_cache.stats()
    assert stats.host_spills > 0 and stats.host_hits > 0


def test_a_pool_too_small_for_a_frozen_part_runs_uncached(model, catalog, plain):
    engine = _cached_engine(model, catalog, pages=1)
    prompt, soft = _batch([USERS[1]])                  # its frozen part needs 2 pages
    _assert_same(_recommend(engine, prompt, soft, "item_causal"),
                 _recommend(plain, prompt, soft, "item_causal", cached=False), "uncached")
    stats = engine.prompt_cache.stats()
    assert (stats.uncached, stats.entries) == (1, 0)


def test_one_users_concurrent_requests(model, catalog, plain):
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch([USERS[0]])
    want = _recommend(plain, prompt, soft, "item_causal", cached=False)
    results, errors = [], []

    def call():
        try:
            results.append(_recommend(engine, prompt, soft, "item_causal"))
        except Exception as error:          # surfaced below with the thread's error
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for got in results:
        _assert_same(got, want, "concurrent")
    stats = engine.prompt_cache.stats()
    assert stats.entries == 1
    assert stats.device_bytes == 2 * engine.prompt_cache.geometry.page_bytes(16)


@pytest.mark.parametrize("bad_id", [lambda vocab: vocab + 5, lambda vocab: 2 ** 40],
                         ids=["past-vocab", "past-int32"])
def test_an_invalid_request_leaves_nothing_behind(model, catalog, plain, bad_id):
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch(USERS)
    tokens = prompt.token_ids.clone().long()         # int64: room for an id past int32
    tokens[1, int(prompt.frozen_lengths[1]) - 2] = bad_id(model.config.vocab_size)
    with pytest.raises(InvalidInputError, match="token"):
        engine.recommend(tokens, prompt.lengths, prompt.segment_ids, beam_width=8, top_k=10,
                         prefix_embeds=soft, frozen_lengths=prompt.frozen_lengths)
    stats = engine.prompt_cache.stats()
    assert (stats.entries, stats.device_bytes) == (0, 0)
    _assert_same(_recommend(engine, prompt, soft, "item_causal"),
                 _recommend(plain, prompt, soft, "item_causal", cached=False), "next request")


def test_suffix_groups_run_the_short_suffixes_apart_when_that_pays():
    policy = BucketPolicy(length_multiple=256, pow2_batch=True)
    groups = cached_search.suffix_groups
    assert groups([5000, 1000, 5000, 1000], policy, 512) == [[1, 3], [0, 2]]
    assert groups([1000, 1000, 990, 1000], policy, 0) == [[0, 1, 2, 3]]    # one width
    assert groups([5000, 1000], policy, 10 ** 6) == [[0, 1]]        # a second run too dear
    assert groups([5000, 4990, 100], policy, 512) == [[2], [0, 1]]
    assert groups([7], None, 0) == [[0]]
    assert groups([40, 8, 40], None, 0) == [[1], [0, 2]]            # unbucketed: exact work


def _spy_runs(engine, monkeypatch) -> list:
    """Each cached search's rows, as whether each writes KV (a row that reads its whole
    frozen part writes none; a new user reads at most the shared intro)."""
    runs, run = [], engine.cached_runner.run

    def spy(args, rows, reservation, *more):
        runs.append([p.written > p.cached for p in reservation.plans])
        return run(args, rows, reservation, *more)
    monkeypatch.setattr(engine.cached_runner, "run", spy)
    return runs


@pytest.mark.parametrize("mask", MASKS)
def test_a_batch_of_hits_and_misses_runs_the_hits_apart(model, catalog, plain, mask,
                                                        monkeypatch):
    """A returning user between two new ones: with a second search priced at nothing, the hit
    runs apart from the misses, and every row's items are the full recompute's, in place."""
    engine = _cached_engine(model, catalog, split_run_tokens=0)
    _recommend(engine, *_batch(USERS[1:2], seed=3), mask)             # user 1's entry
    runs = _spy_runs(engine, monkeypatch)
    prompt, soft = _batch(USERS)
    _assert_same(_recommend(engine, prompt, soft, mask),
                 _recommend(plain, prompt, soft, mask, cached=False), "split batch")
    assert runs == [[False], [True, True]]
    stats = engine.prompt_cache.stats()
    assert stats.entries == 3 and stats.partial_hits == 2     # the new users share the intro
    runs.clear()
    _recommend(_cached_engine(model, catalog), prompt, soft, mask)   # the default price
    assert runs == []                        # (the spy watches the first engine only)


def test_a_broken_rule_in_a_split_batch_names_the_batch_and_keeps_nothing(model, catalog,
                                                                         plain, monkeypatch):
    engine = _cached_engine(model, catalog, split_run_tokens=0)
    _recommend(engine, *_batch(USERS[1:2], seed=3), "item_causal")
    runs = _spy_runs(engine, monkeypatch)
    prompt, soft = _batch(USERS)
    lengths = prompt.lengths.clone()
    lengths[2] = prompt.token_ids.shape[1] + 1          # row 2, in the second search
    every = ", ".join(str(int(n)) for n in lengths)      # the batch's lengths, not a part's
    with pytest.raises(InvalidInputError, match=rf"got \[{every}\]"):
        engine.recommend(prompt.token_ids, lengths, prompt.segment_ids, beam_width=8,
                         top_k=10, prefix_embeds=soft, frozen_lengths=prompt.frozen_lengths)
    assert len(runs) == 2                               # the batch was split
    assert engine.prompt_cache.stats().entries == 1     # the misses' parts were not kept
    _assert_same(_recommend(engine, prompt, soft, "item_causal"),
                 _recommend(plain, prompt, soft, "item_causal", cached=False), "next request")


@pytest.mark.parametrize("change, match", [
    (lambda p: p.frozen_lengths[:1], r"frozen_lengths must have shape \[3\]"),
    (lambda p: p.lengths, r"frozen_lengths\[0\] = \d+ must be in \[0, lengths"),
    (lambda p: p.frozen_lengths - 1, r"cuts segment"),
    (lambda p: p.frozen_lengths + 3, r"covers a SOFT marker"),
    (lambda p: p.frozen_lengths.float(), r"integer"),
])
def test_bad_frozen_lengths_are_refused_by_name(model, catalog, change, match):
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch(USERS)
    with pytest.raises(InvalidInputError, match=match):
        engine.recommend(prompt.token_ids, prompt.lengths, prompt.segment_ids, beam_width=8,
                         top_k=10, prefix_embeds=soft, frozen_lengths=change(prompt))
    assert engine.prompt_cache.stats().lookups == 0


def test_version_one_soft_vectors_and_engines_without_a_cache_are_refused(model, catalog,
                                                                          plain):
    prompt, soft = _batch(USERS)
    with pytest.raises(ConfigError, match="prompt_cache"):
        _recommend(plain, prompt, soft, "item_causal")
    cache = _cached_engine(model, catalog).prompt_cache
    v1 = Engine(model, catalog, EngineConfig(), prompt_cache=cache)
    with pytest.raises(InvalidInputError, match="version-1 soft vectors"):
        v1.recommend(prompt.token_ids, prompt.lengths, prompt.segment_ids, beam_width=8,
                     top_k=10, prefix_embeds=soft, frozen_lengths=prompt.frozen_lengths)


def test_entries_survive_a_catalog_version_and_die_with_a_model_version(model, catalog):
    engine = _cached_engine(model, catalog)
    prompt, soft = _batch(USERS)
    _recommend(engine, prompt, soft, "item_causal")
    cache = engine.prompt_cache
    bigger = Catalog.from_arrays(*small_world(seed=1, n=340, used_codes=12))
    refreshed = Engine(model, bigger, _config(), prompt_cache=cache, model_version="tiny-v1")
    _assert_same(_recommend(refreshed, prompt, soft, "item_causal"),
                 _recommend(Engine(model, bigger, _config()), prompt, soft, "item_causal",
                            cached=False), "new catalog")
    assert cache.stats().device_hits == 3
    retrained = Model.from_preset("tiny", seed=6)
    other = Engine(retrained, catalog, _config(), prompt_cache=cache)   # weights fingerprint
    _assert_same(_recommend(other, prompt, soft, "item_causal"),
                 _recommend(Engine(retrained, catalog, _config()), prompt, soft,
                            "item_causal", cached=False), "new model")
    assert cache.stats().misses == 6


def test_a_cache_of_another_geometry_is_refused(model, catalog):
    cache = PromptCache(KVGeometry(1, 1, 16, torch.float32), PromptCacheConfig(1 << 20), "cpu")
    with pytest.raises(ConfigError, match="prompt cache holds"):
        Engine(model, catalog, _config(), prompt_cache=cache)


def _ranked_break(got, want, dtype):
    """The first (row, position) where ``got`` breaks ``RANKED_LIST_RULE`` against ``want``."""
    for row, (gi, gs, wi, ws) in enumerate(zip(*got, *want)):
        gi, gs, wi, ws = gi.tolist(), gs.tolist(), wi.tolist(), ws.tolist()
        listed = {item: k for k, item in enumerate(wi) if item >= 0}
        kept = [s for item, s in zip(wi, ws) if item >= 0]
        last = kept[-1] if kept else float("-inf")
        for k, (item, ref) in enumerate(zip(gi, wi)):
            if (item < 0) != (ref < 0):
                return row, k
            if ref < 0:
                continue
            if not scores_tied(gs[k], ws[k], dtype):
                return row, k
            j = listed.get(item)
            if item != ref and not (scores_tied(ws[j], ws[k], dtype) if j is not None
                                    else scores_tied(ws[k], last, dtype)):
                return row, k
    return None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mask", MASKS)
def test_cuda_bf16_cached_search_equals_the_uncached_engine(catalog, mask):
    """The paged kernels in the engine: bf16 on CUDA, a miss, a hit and an append (each a
    captured graph's replay), each under the ranked-list rule against the uncached engine's
    graph replay."""
    model = Model.from_preset("tiny", seed=5).cuda()
    config = EngineConfig(soft_marker=LAYOUT.soft_id, dtype="bfloat16")
    plain = Engine(model, catalog, config)
    engine = Engine(Model.from_preset("tiny", seed=5).cuda(), catalog, config,
                    prompt_cache=PromptCache(
                        KVGeometry.of_model(model.config, torch.bfloat16),
                        PromptCacheConfig(device_bytes=1 << 24), "cuda"),
                    model_version="tiny-v1")
    assert engine.options.attention == "triton"
    grown = [(long + [60, 61], recent, context) for long, recent, context in USERS]
    for users in (USERS, USERS, grown):
        prompt, soft = _batch(users)
        prompt = type(prompt)(*(t.cuda() for t in prompt))
        soft = soft.cuda().bfloat16()
        want = _recommend(plain, prompt, soft, mask, cached=False)
        got = _recommend(engine, prompt, soft, mask)
        assert _ranked_break(got, want, "bfloat16") is None, RANKED_LIST_RULE
    stats = engine.prompt_cache.stats()
    assert (stats.misses, stats.device_hits, stats.partial_hits) == (3, 6, 3)
    assert len(engine.cached_runner) >= 1           # the hits replayed captured graphs


@pytest.mark.parametrize("mask", MASKS)
def test_the_captured_formulation_on_padded_buffers_equals_the_full_recompute(model, catalog,
                                                                              plain, mask):
    """What a CUDA graph of a cached search runs, here eagerly on the CPU: request-major
    packing, a bucket of 4 rows for a batch of 3, the prompt width and the suffix rounded up,
    the block table as wide as the bucket. A miss writes the pages, then a hit reads them
    and writes nothing."""
    engine = Engine(model, catalog, EngineConfig(soft_marker=LAYOUT.soft_id,
                                                 static_shapes=True),
                    prompt_cache=_cached_engine(model, catalog).prompt_cache,
                    model_version="tiny-v1")
    prompt, soft = _batch(USERS)
    segments = None if mask == "causal" else prompt.segment_ids
    want = _recommend(plain, prompt, soft, mask, cached=False)
    runner, cached = engine.runner, engine.cached_runner
    args = check_arguments(engine.limits, prompt.token_ids, prompt.lengths, segments, 24, 30,
                           soft, None)
    policy = BucketPolicy(length_multiple=16)
    for call in ("miss", "hit"):
        rows = cached_search.prompt_rows(args, prompt.frozen_lengths, LAYOUT.soft_id,
                                         LAYOUT.item_start_id)
        mode = MaskMode.CAUSAL if segments is None else MaskMode.ITEM_CAUSAL
        reservation = engine.prompt_cache.reserve(engine._scopes[mode], rows)
        bucket = bucket_of(3, args.token_ids.shape[1], args.soft, 0, segments is None, policy)
        longest = max(r.length - p.cached for r, p in zip(rows, reservation.plans))
        shape = cached_search.CachedShape(bucket, -(-longest // 16) * 16,
                                          -(-bucket.width // 16), reservation.writes)
        assert shape.writes == (call == "miss")
        inputs = cached_search.CachedInputs.allocate(shape, 64, torch.float32, "cpu")
        inputs.load(args, reservation)
        pool = engine.prompt_cache.pool.data.clone()
        with torch.no_grad():                    # as the engine runs it
            items, scores, flags = cached.search_buffers(inputs, shape, 24, 30)
        # A batch of hits writes nothing, not even the sink page.
        assert torch.equal(engine.prompt_cache.pool.data, pool) == (call == "hit")
        runner.verdict_of(args, flags).raise_if_invalid()
        engine.prompt_cache.finish(reservation, keep=True)
        _assert_same((items[:3], scores[:3]), want, call)
    stats = engine.prompt_cache.stats()
    assert (stats.misses, stats.device_hits) == (3, 3)


def test_digests_never_fold_out_of_range_ids_onto_valid_ones():
    """Records are int32 pairs for valid prompts; an id past int32 makes int64 records whose
    digests differ (the record size is hashed), so a hostile id cannot alias a valid one."""
    import numpy as np
    from torch_engine.prompt_cache import keys
    scope = keys.CacheScope("model", "layout", MaskMode.ITEM_CAUSAL)
    segments = np.array([7, 7, 8])
    valid = keys.token_records(np.array([1, 2, 3]), segments)
    wide = keys.token_records(np.array([1, 2, 3 + 2 ** 32]), segments)
    assert (valid[1], wide[1]) == (8, 16)
    assert keys.prefix_digest(scope, valid, 3) != keys.prefix_digest(scope, wide, 3)
    assert keys.prefix_digests(scope, valid, [2, 3]) == [
        keys.prefix_digest(scope, valid, n) for n in (2, 3)]
    # Segment ids count from the part's first: equal layouts at other offsets hash alike.
    shifted = keys.token_records(np.array([1, 2, 3]), segments + 100)
    assert keys.prefix_digest(scope, shifted, 3) == keys.prefix_digest(scope, valid, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mask", MASKS)
def test_cuda_split_batch_equals_the_uncached_engine(catalog, mask, monkeypatch):
    """A batch of a hit between two misses on CUDA in bf16, run as two captured searches
    (the hit's without a store): every row under the ranked-list rule against the uncached
    engine, in its place."""
    config = EngineConfig(soft_marker=LAYOUT.soft_id, dtype="bfloat16")
    model = Model.from_preset("tiny", seed=5).cuda()
    plain = Engine(model, catalog, config)
    engine = Engine(Model.from_preset("tiny", seed=5).cuda(), catalog, config,
                    prompt_cache=PromptCache(
                        KVGeometry.of_model(model.config, torch.bfloat16),
                        PromptCacheConfig(device_bytes=1 << 24, split_run_tokens=0), "cuda"),
                    model_version="tiny-v1")

    def on_cuda(users, seed=0):
        prompt, soft = _batch(users, seed)
        return type(prompt)(*(t.cuda() for t in prompt)), soft.cuda().bfloat16()

    _recommend(engine, *on_cuda(USERS[1:2], seed=3), mask)
    runs = _spy_runs(engine, monkeypatch)
    prompt, soft = on_cuda(USERS)
    got = _recommend(engine, prompt, soft, mask)
    assert runs == [[False], [True, True]]
    assert _ranked_break(got, _recommend(plain, prompt, soft, mask, cached=False),
                         "bfloat16") is None, RANKED_LIST_RULE
