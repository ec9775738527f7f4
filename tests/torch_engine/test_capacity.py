"""Capacity: the memory estimate against a measured run, the pre-check, out-of-memory
containment, and beam width 1024 with top_k 300 against an exhaustive search."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.torch_engine.engine_worlds import checked_batch
from torch_engine import search
from torch_engine.capacity import check_capacity, estimate_request
from torch_engine.catalog import Catalog
from torch_engine.checks import check_arguments
from torch_engine.config import EngineConfig, preset
from torch_engine.engine import Engine
from torch_engine.kv_cache import BeamKV
from torch_engine.model import Model
from xgr_common.errors import CapacityError, InvalidInputError
from xgr_common.layout import TokenLayout
from xgr_common.tolerances import tolerance_for

FP32 = tolerance_for(torch.float32)
LAYOUT = TokenLayout()


@pytest.fixture(scope="module")
def model():
    return Model.from_preset("tiny", seed=21)


@pytest.fixture(scope="module")
def catalog():
    rng = np.random.default_rng(4)
    return Catalog.from_arrays(rng.choice(50_000, 3000, replace=False),
                               rng.integers(0, 256, (3000, 3)))


def prompts(batch: int, length: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(8, 1024, (batch, length), generator=gen), torch.full((batch,), length)


def peak_cpu_bytes(work) -> int:
    """Peak of live CPU tensor bytes during ``work()`` (allocation deltas of the profiler, in
    time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def estimate_of(engine, tokens, lengths, width, top_k):
    """The engine's memory check of a request (``check_capacity`` of its shape)."""
    args = check_arguments(engine.limits, tokens, lengths, None, width, top_k, None, None)
    return check_capacity(engine.footprint, engine.runner.shape(args), width, top_k,
                          engine.device, engine.config.memory_budget)


def test_estimate_matches_the_tensors_of_a_tiny_run(model, catalog):
    engine = Engine(model, catalog)
    tokens, lengths = prompts(2, 24)
    batch = checked_batch(engine, tokens, lengths, None, 64, 50)
    estimate = estimate_of(engine, tokens, lengths, 64, 50)
    with torch.no_grad():
        state = search.prefill(engine.model, engine.catalog, batch, engine.options)
    shared = sum(t.numel() * t.element_size() for t in state.shared.keys + state.shared.values)
    assert estimate.shared_kv == shared
    cfg = model.config
    beams = BeamKV(cfg.num_layers, 2, 64, LAYOUT.levels - 1, cfg.num_kv_heads, cfg.head_dim,
                   torch.float32, torch.device("cpu"))
    beam_bytes = 2 * beams.keys.numel() * beams.keys.element_size()
    # The KV itself plus the gather a reorder makes (one of two written slots).
    assert estimate.beam_kv == beam_bytes + beam_bytes // 2
    with torch.no_grad():
        peak = peak_cpu_bytes(lambda: engine.recommend(tokens, lengths, beam_width=64,
                                                       top_k=50))
    assert peak <= estimate.total <= 3 * peak, (peak, estimate)


def test_estimate_of_the_benchmark_shape_by_hand():
    cfg = preset("qwen2-0.5b")
    est = estimate_request(cfg, 2, batch=8, prompt_rows=8 * 1024, longest=1024, width=1024,
                           top_k=300, levels=3, codebook_size=256, exclude_width=1,
                           attention="triton", selection="triton")
    assert est.shared_kv == 2 * 24 * 8 * 1024 * 2 * 64 * 2            # 100.7 MB
    assert est.beam_kv == 2 * 24 * 8 * 1024 * 2 * 2 * 64 * 2 * 3 // 2
    assert est.logits_and_selection == 8 * 1024 * 256 * 12
    assert est.attention_scores == 0


def test_precheck_refuses_a_request_over_the_budget_and_names_the_numbers(model, catalog,
                                                                          monkeypatch):
    tokens, lengths = prompts(2, 24)
    need = estimate_of(Engine(model, catalog), tokens, lengths, 128, 50).total
    tight = Engine(model, catalog, EngineConfig(memory_budget=need - 1))
    started = []
    monkeypatch.setattr(tight.runner, "run", lambda *args: started.append(args))
    with pytest.raises(CapacityError, match=r"beam_width 128.*MiB.*beam_kv"):
        tight.recommend(tokens, lengths, beam_width=128, top_k=50)
    assert started == [], "the refused request reached the runner"
    exact = Engine(model, catalog, EngineConfig(memory_budget=need))
    items, _ = exact.recommend(tokens, lengths, beam_width=128, top_k=50)
    assert bool((items >= 0).all())


def test_out_of_memory_fails_one_batch_and_the_next_runs_normally(model, catalog, monkeypatch):
    engine = Engine(model, catalog)
    tokens, lengths = prompts(2, 16, seed=3)
    want_items, want_scores = engine.recommend(tokens, lengths, beam_width=32, top_k=40)
    decode = search.decode
    calls = []

    def failing_once(model, catalog, state, width, *args):
        calls.append(width)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return decode(model, catalog, state, width, *args)

    monkeypatch.setattr(search, "decode", failing_once)
    with pytest.raises(CapacityError, match="ran out of device memory.*ready for the next"):
        engine.recommend(tokens, lengths, beam_width=32, top_k=40)
    items, scores = engine.recommend(tokens, lengths, beam_width=32, top_k=40)
    assert calls == [32, 32]
    assert torch.equal(items, want_items)
    torch.testing.assert_close(scores, want_scores, atol=0.0, rtol=0.0)


@pytest.mark.parametrize("failure", ["precheck", "out_of_memory"])
def test_an_invalid_input_outranks_the_capacity_error_of_its_batch(model, catalog, monkeypatch,
                                                                   failure):
    """A batch that breaks a value rule and cannot fit (refused before any work, or out of
    memory during its search) raises the rule's ``InvalidInputError``."""
    tokens, lengths = prompts(2, 24)
    budget = None
    if failure == "precheck":
        budget = estimate_of(Engine(model, catalog), tokens, lengths, 128, 50).total - 1
    else:
        def out_of_memory(*args):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        monkeypatch.setattr(search, "decode", out_of_memory)
    engine = Engine(model, catalog, EngineConfig(memory_budget=budget))
    with pytest.raises(CapacityError):
        engine.recommend(tokens, lengths, beam_width=128, top_k=50)
    bad = tokens.clone()
    bad[1, 3] = model.config.vocab_size
    with pytest.raises(InvalidInputError, match="token_ids must lie in"):
        engine.recommend(bad, lengths, beam_width=128, top_k=50)


def exhaustive_top(model, catalog, tokens, top_k):
    """Score every path of ``catalog`` with one full forward per path (batched): each level
    log-softmax over the codes the catalog allows after the path's prefix."""
    levels, paths = catalog.levels, catalog.num_prefixes[-1]
    # Codes of every full path from the CSR tables, walking up from the last level.
    codes = torch.zeros((paths, levels), dtype=torch.int64)
    node = torch.arange(paths)
    prefixes = [None] * (levels + 1)
    prefixes[levels] = node
    for level in reversed(range(levels)):
        codes[:, level] = catalog.level_codes[level][node]
        node = catalog.level_parents[level][node]
        prefixes[level] = node
    seq = torch.cat([tokens.expand(paths, -1),
                     torch.stack([codes[:, i] + LAYOUT.level_range(i)[0]
                                  for i in range(levels - 1)], 1)], 1)
    with torch.no_grad():
        logits = model(seq)[:, tokens.shape[1] - 1:]                     # [P, levels, vocab]
    score = torch.zeros(paths)
    for level in range(levels):
        start, end = LAYOUT.level_range(level)
        row = logits[:, level, start:end]
        indptr = catalog.level_indptr[level]
        parent = prefixes[level]
        allowed = torch.zeros_like(row, dtype=torch.bool)
        for p in range(paths):  # small: a few thousand rows
            lo, hi = int(indptr[parent[p]]), int(indptr[parent[p] + 1])
            allowed[p, catalog.level_codes[level][lo:hi]] = True
        lse = torch.logsumexp(row.masked_fill(~allowed, float("-inf")), dim=1)
        score += row.gather(1, codes[:, level:level + 1])[:, 0] - lse
    order = torch.sort(score, descending=True, stable=True).indices
    items, scores = [], []
    for path in order.tolist():
        lo, hi = int(catalog.path_indptr[path]), int(catalog.path_indptr[path + 1])
        items += catalog.path_items[lo:hi].tolist()
        scores += [float(score[path])] * (hi - lo)
    return torch.tensor(items[:top_k]), torch.tensor(scores[:top_k])


def test_beam_width_1024_and_top_k_300_match_an_exhaustive_search(model):
    # 32 x 32 prefixes of length two and one path each: width 1024 holds every prefix, so
    # beam search is exhaustive; about 1.3 items per path make top_k 300 reachable.
    rng = np.random.default_rng(8)
    count = 1300
    codes = np.stack([rng.integers(0, 32, count), rng.integers(0, 32, count),
                      np.zeros(count, dtype=np.int64)], 1)
    catalog = Catalog.from_arrays(rng.choice(10**6, count, replace=False), codes)
    assert catalog.num_prefixes[-1] <= 1024
    engine = Engine(model, catalog, EngineConfig(max_beam_width=1024))
    tokens, lengths = prompts(1, 10, seed=5)
    items, scores = engine.recommend(tokens, lengths, beam_width=1024, top_k=300)
    want_items, want_scores = exhaustive_top(model, catalog, tokens, 300)
    assert torch.equal(items[0], want_items)
    torch.testing.assert_close(scores[0], want_scores, atol=1e-4, rtol=1e-4)
