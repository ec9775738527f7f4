"""The fused constrained top-k (``xgr::constrained_topk``) against its plain-torch reference, the
reference against the engine's torch selection path, and the engine with the fused selection.

On the CPU the kernel runs under Triton's interpreter (about a second per W=64, C=256 call).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_engine import beam_search as bs
from torch_engine.catalog import Catalog
from torch_engine.config import EngineConfig
from torch_engine.engine import Engine
from xgr_common.errors import ConfigError, InvalidInputError
from torch_engine.kernels.constrained_topk import (RESIDENT_KEYS, constrained_topk,
                                                   launch_constrained_topk)
from xgr_common.layout import TokenLayout
from torch_engine.model import Model
from torch_engine.reference.constrained_topk import constrained_topk as reference
from xgr_common.tolerances import tolerance_for

FP32 = tolerance_for(torch.float32)


def random_catalog(rng: np.random.Generator, size: int, items: int, skew: float) -> Catalog:
    """Codes drawn from a power law (``skew`` > 0): some prefixes get many children, most few,
    so the allowed sets are ragged."""
    weights = 1.0 / np.arange(1, size + 1) ** skew
    codes = rng.choice(size, size=(items, 3), p=weights / weights.sum())
    codes = np.stack([rng.permutation(size)[codes[:, i]] for i in range(3)], axis=1)
    return Catalog.from_arrays(np.arange(items) * 7 + 3, codes, TokenLayout(codebook_size=size))


def level_inputs(gen: torch.Generator, catalog: Catalog, level: int, batch: int, beams: int,
                 dtype: torch.dtype, dead: float = 0.25):
    """Logits on a 0.25 grid (many exact ties inside a row), random live prefixes and scores,
    a fraction of dead beams."""
    size = catalog.layout.codebook_size
    logits = (torch.randint(-12, 12, (batch, beams, size), generator=gen) * 0.25).to(dtype)
    prefixes = torch.randint(0, catalog.num_prefixes[level], (batch, beams), generator=gen)
    scores = torch.randn((batch, beams), generator=gen) - 3.0
    scores[torch.rand((batch, beams), generator=gen) < dead] = float("-inf")
    scores[:, 0] = 0.0
    return logits, scores, prefixes


def random_blocked(gen: torch.Generator, catalog: Catalog, level: int, batch: int
                   ) -> torch.Tensor:
    """Sorted ``[B, 6]`` child ids to drop, some past the last entry (padding)."""
    entries = catalog.num_prefixes[level + 1]
    return torch.randint(0, entries + 3, (batch, 6), generator=gen).sort(dim=1).values


def poisoned(batch: int, width: int) -> tuple[torch.Tensor, ...]:
    return (torch.full((batch, width), float("nan")),
            *(torch.full((batch, width), -7, dtype=torch.int64) for _ in range(3)))


def check_equal(out, ref, what: str) -> None:
    scores, parent, code, prefix = out
    assert not bool(torch.isnan(scores).any()), f"{what}: unwritten scores"
    for name, got, want in (("parent", parent, ref[1]), ("code", code, ref[2]),
                            ("prefix", prefix, ref[3])):
        assert torch.equal(got, want), f"{what}: {name} differs\n{got}\n{want}"
    finite = torch.isfinite(ref[0])
    assert torch.equal(torch.isfinite(scores), finite), f"{what}: -inf pattern differs"
    torch.testing.assert_close(scores[finite], ref[0][finite], atol=FP32.atol, rtol=FP32.rtol)


_WIDE = pytest.mark.slow   # 64 beams under the interpreter: the slow part of the grid


@pytest.mark.parametrize("beams,size,level,dtype", [
    (1, 16, 1, torch.float32), (4, 16, 2, torch.float32), (4, 256, 1, torch.bfloat16),
    pytest.param(64, 16, 0, torch.float32, marks=_WIDE),
    pytest.param(64, 16, 2, torch.float32, marks=_WIDE),
    pytest.param(64, 256, 1, torch.float32, marks=_WIDE)])
def test_kernel_matches_reference(beams, size, level, dtype):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    catalog = random_catalog(rng, size, items=40 * size, skew=1.2)
    logits, scores, prefixes = level_inputs(gen, catalog, level, 2, beams, dtype)
    blocked = random_blocked(gen, catalog, level, 2) if level == 2 else None
    indptr, codes = catalog.level_indptr[level], catalog.level_codes[level]
    for width in sorted({1, beams, min(2 * beams, beams * size)}):
        out = launch_constrained_topk(logits, scores, prefixes, indptr, codes, width, blocked,
                                      out=poisoned(2, width))
        ref = reference(logits, scores, prefixes, indptr, codes, width, blocked)
        check_equal(out, ref, f"W={beams} C={size} level={level} width={width} {dtype}")


def tied_level_inputs(gen: torch.Generator, catalog: Catalog, level: int, batch: int,
                      beams: int, dead: float):
    """``level_inputs`` with parent scores on a 0.5 grid too: many exact ties across beams."""
    logits, scores, prefixes = level_inputs(gen, catalog, level, batch, beams, torch.float32,
                                            dead)
    live = torch.isfinite(scores)
    scores[live] = (torch.randint(-4, 1, (int(live.sum()),), generator=gen) * 0.5).float()
    return logits, scores, prefixes


@pytest.mark.parametrize("width,chunk", [(1, 16), (5, 13), *(
    pytest.param(w, c, marks=pytest.mark.slow) for w, c in ((7, 23), (16, 32), (40, 97),
                                                            (100, 200)))])
@pytest.mark.parametrize("dead", [0.25, pytest.param(0.97, marks=pytest.mark.slow)])
@pytest.mark.parametrize("resident_keys", [RESIDENT_KEYS,
                                           pytest.param(0, marks=pytest.mark.slow)])
def test_chunked_select_matches_reference(width, chunk, dead, resident_keys):
    """Small chunks force several reduction steps (short last chunks, padded segments); with
    97% dead beams fewer candidates than ``width`` are finite (the -inf tail). Each select
    runs with its keys in registers and streamed through blocks."""
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    catalog = random_catalog(rng, 16, items=600, skew=1.0)
    level = int(torch.randint(0, 3, (1,), generator=gen))
    logits, scores, prefixes = tied_level_inputs(gen, catalog, level, 3, 16, dead)
    blocked = random_blocked(gen, catalog, level, 3) if level == 2 else None
    indptr, codes = catalog.level_indptr[level], catalog.level_codes[level]
    out = launch_constrained_topk(logits, scores, prefixes, indptr, codes, width, blocked,
                                  out=poisoned(3, width), chunk=chunk,
                                  resident_keys=resident_keys)
    ref = reference(logits, scores, prefixes, indptr, codes, width, blocked)
    check_equal(out, ref, f"width={width} chunk={chunk} level={level} dead={dead} "
                          f"resident_keys={resident_keys}")


@pytest.mark.parametrize("grow", [4, 64])
def test_a_plan_for_larger_traced_sizes_selects_the_same(monkeypatch, grow):
    """A traced program plans its chunks, reduction steps and blocks for the largest width
    and candidate count it accepts (``bounded_size``), then runs at smaller ones: reduction
    steps over fewer candidates than a chunk and blocks wider than the keys change nothing."""
    from torch_engine.kernels import _common

    monkeypatch.setattr(_common, "bounded_size", lambda op, name, size: grow * size)
    gen = torch.Generator().manual_seed(grow)
    catalog = random_catalog(np.random.default_rng(grow), 16, items=600, skew=1.0)
    logits, scores, prefixes = tied_level_inputs(gen, catalog, 1, 3, 16, 0.25)
    indptr, codes = catalog.level_indptr[1], catalog.level_codes[1]
    out = launch_constrained_topk(logits, scores, prefixes, indptr, codes, 12, None,
                                  out=poisoned(3, 12), chunk=2 * 12 * grow)
    check_equal(out, reference(logits, scores, prefixes, indptr, codes, 12, None),
                f"bounds x{grow}")


def test_chunk_must_leave_room_to_shrink():
    catalog = random_catalog(np.random.default_rng(0), 16, items=50, skew=0.0)
    logits, scores, prefixes = level_inputs(torch.Generator().manual_seed(0), catalog, 0, 1, 4,
                                            torch.float32)
    with pytest.raises(InvalidInputError, match="chunk must be an int >= 2 \\* width"):
        launch_constrained_topk(logits, scores, prefixes, catalog.level_indptr[0],
                                catalog.level_codes[0], 8, None, chunk=15)


def test_fewer_continuations_than_beams_fill_the_tail_with_dead_beams():
    rng = np.random.default_rng(3)
    catalog = random_catalog(rng, 16, items=30, skew=0.0)
    gen = torch.Generator().manual_seed(5)
    logits, scores, prefixes = level_inputs(gen, catalog, 0, 2, 64, torch.float32, dead=1.0)
    width = 64
    out = launch_constrained_topk(logits, scores, prefixes, catalog.level_indptr[0],
                                  catalog.level_codes[0], width, None, out=poisoned(2, width))
    ref = reference(logits, scores, prefixes, catalog.level_indptr[0], catalog.level_codes[0],
                    width)
    check_equal(out, ref, "level 0, one live beam")
    live = catalog.num_prefixes[1]
    assert live < width
    # One live beam: its allowed children come first, in prefix (= catalog) order.
    assert torch.equal(out[3][:, :live], torch.arange(live).expand(2, live))
    assert bool(torch.isfinite(out[0][:, :live]).all())
    assert bool(torch.isneginf(out[0][:, live:]).all())


def test_ties_break_by_flat_index_then_come_out_sorted_by_parent():
    catalog = Catalog.from_arrays(np.arange(8), np.array([[c, 0, 0] for c in range(8)]),
                                  TokenLayout(codebook_size=8))
    logits = torch.zeros((1, 3, 8))                     # all 8 codes allowed, all equal
    scores = torch.tensor([[-1.0, -1.0, -2.0]])
    prefixes = torch.zeros((1, 3), dtype=torch.int64)
    args = (logits, scores, prefixes, catalog.level_indptr[0], catalog.level_codes[0], 10)
    for result in (constrained_topk(*args), reference(*args)):
        # 16 tied candidates of beams 0 and 1: the first 10 in flat order w * 8 + c.
        assert result[1].tolist() == [[0] * 8 + [1] * 2]
        assert result[2].tolist() == [list(range(8)) + [0, 1]]


def torch_path(logits, scores, prefixes, catalog, level, width, excluded=None):
    logp, child = bs.constrain(logits, prefixes, catalog, level)
    if excluded is not None:
        logp = bs.drop_exhausted(logp, child, excluded, catalog, level)
    if catalog.num_prefixes[level + 1] <= width:
        return bs.keep_all(scores, logp, catalog, level, width)
    return bs.rank(scores, logp, child, width)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_reference_selects_what_the_engine_torch_path_selects(level):
    rng = np.random.default_rng(11 + level)
    catalog = random_catalog(rng, 16, items=400, skew=1.0)
    gen = torch.Generator().manual_seed(level)
    # Fewer beams than next prefixes: ``rank`` (``keep_all`` has its own test below).
    width = min(24, catalog.num_prefixes[level + 1] - 1)
    logits = torch.randn((2, width, 16), generator=gen)           # continuous: no ties
    prefixes = torch.randint(0, catalog.num_prefixes[level], (2, width), generator=gen)
    scores = torch.randn((2, width), generator=gen)
    excluded = blocked = None
    if level == 2:
        rows = torch.arange(catalog.num_items)[torch.randperm(catalog.num_items, generator=gen)]
        excluded = bs.excluded_rows(catalog.path_items[rows[:2 * 150]].view(2, 150), catalog)
        blocked = bs.exhausted_prefixes(excluded, catalog, level)
        assert bool((blocked < catalog.num_prefixes[-1]).any()), "no exhausted path to test"
    parents, codes, children, new = torch_path(logits, scores, prefixes, catalog, level, width,
                                               excluded)
    ref = reference(logits, scores, prefixes, catalog.level_indptr[level],
                    catalog.level_codes[level], width, blocked)
    for b in range(2):
        want = {(int(p), int(c), int(x)) for p, c, x, s in
                zip(parents[b], codes[b], children[b], new[b]) if s > float("-inf")}
        got = {(int(p), int(c), int(x)) for p, c, x, s in
               zip(ref[1][b], ref[2][b], ref[3][b], ref[0][b]) if s > float("-inf")}
        assert got == want and len(got) > 0
        torch.testing.assert_close(ref[0][b][torch.isfinite(ref[0][b])].sort().values,
                                   new[b][torch.isfinite(new[b])].sort().values)


def test_keep_all_layout_is_what_the_kernel_returns_when_every_prefix_fits():
    catalog = random_catalog(np.random.default_rng(2), 16, items=60, skew=0.5)
    width = catalog.num_prefixes[1] + 3
    gen = torch.Generator().manual_seed(1)
    logits, scores, prefixes = level_inputs(gen, catalog, 0, 1, width, torch.float32, dead=1.0)
    prefixes.zero_()
    parents, codes, children, new = torch_path(logits, scores, prefixes, catalog, 0, width)
    out = constrained_topk(logits, scores, prefixes, catalog.level_indptr[0],
                           catalog.level_codes[0], width)
    live = catalog.num_prefixes[1]
    for got, want in zip((out[1], out[2], out[3]), (parents, codes, children)):
        assert torch.equal(got[:, :live], want[:, :live])
    torch.testing.assert_close(out[0][:, :live], new[:, :live])


def _bad_cases():
    catalog = random_catalog(np.random.default_rng(0), 16, items=50, skew=0.0)
    gen = torch.Generator().manual_seed(0)
    logits, scores, prefixes = level_inputs(gen, catalog, 1, 2, 4, torch.float32)
    base = dict(logits=logits, scores=scores, prefixes=prefixes,
                indptr=catalog.level_indptr[1], codes=catalog.level_codes[1], width=4,
                blocked=None)
    return {
        "logits": {**base, "logits": logits[0]},
        "scores": {**base, "scores": scores.double()},
        "prefixes": {**base, "prefixes": prefixes.int()},
        "indptr": {**base, "indptr": catalog.level_indptr[1].int()},
        "width": {**base, "width": 4 * 16 + 1},
        "blocked": {**base, "blocked": torch.zeros((3, 2), dtype=torch.int64)},
    }


@pytest.mark.parametrize("name", sorted(_bad_cases()))
def test_bad_input_names_argument(name):
    with pytest.raises(InvalidInputError, match=name):
        constrained_topk(**_bad_cases()[name])


def test_opcheck():
    catalog = random_catalog(np.random.default_rng(4), 16, items=60, skew=0.5)
    gen = torch.Generator().manual_seed(4)
    logits, scores, prefixes = level_inputs(gen, catalog, 2, 1, 2, torch.float32)
    blocked = random_blocked(gen, catalog, 2, 1)
    torch.library.opcheck(torch.ops.xgr.constrained_topk.default,
                          (logits, scores, prefixes, catalog.level_indptr[2],
                           catalog.level_codes[2], 3, blocked),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_export_traces_the_op_and_runs_it():
    catalog = random_catalog(np.random.default_rng(6), 16, items=80, skew=0.5)
    gen = torch.Generator().manual_seed(6)
    logits, scores, prefixes = level_inputs(gen, catalog, 1, 2, 4, torch.float32)
    indptr, codes = catalog.level_indptr[1], catalog.level_codes[1]

    class Level(torch.nn.Module):
        def forward(self, logits, scores, prefixes, indptr, codes):
            return constrained_topk(logits, scores, prefixes, indptr, codes, 5)

    program = torch.export.export(Level(), (logits, scores, prefixes, indptr, codes))
    targets = {node.target for node in program.graph.nodes}
    assert torch.ops.xgr.constrained_topk.default in targets
    got = program.module()(logits, scores, prefixes, indptr, codes)
    check_equal(got, reference(logits, scores, prefixes, indptr, codes, 5), "exported")


def test_engine_with_fused_selection_returns_the_torch_selection_items():
    """The fused path (selection and exclusion kernels) against the torch path. About two
    items per pair of codes: excluding 60 of the 300 items exhausts many prefixes of two
    and three codes, which then must never take a beam."""
    rng = np.random.default_rng(9)
    ids = rng.choice(np.arange(10_000), size=300, replace=False)
    codes = rng.integers(0, 12, (300, 3))
    catalog = Catalog.from_arrays(ids, codes)
    model = Model.from_preset("tiny", seed=3)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(8, 1024, (2, 12), generator=gen)
    lengths = torch.tensor([12, 7])
    exclude = torch.from_numpy(np.stack([rng.choice(ids, 64, replace=False) for _ in range(2)]))
    exclude[0, 60:] = -1
    exclude[1, :4] = 77_777                                 # not in the catalog
    results = []
    for selection in ("torch", "triton"):
        engine = Engine(model, catalog, EngineConfig(selection_backend=selection))
        assert engine.options.selection == selection
        results.append(engine.recommend(tokens, lengths, beam_width=16, top_k=20,
                                        exclude_items=exclude))
    (items_t, scores_t), (items_k, scores_k) = results
    assert torch.equal(items_k, items_t)
    torch.testing.assert_close(scores_k, scores_t, atol=FP32.atol, rtol=FP32.rtol)


def test_auto_selection_stays_torch_on_the_cpu():
    assert bs.resolve_selection("auto", torch.device("cpu")) == "torch"
    assert EngineConfig().selection_backend == "auto"      # the default: fused on CUDA only
    with pytest.raises(ConfigError, match="selection_backend"):
        EngineConfig(selection_backend="cuda")


@pytest.mark.gpu
def test_gpu_default_engine_takes_the_fused_selection():
    catalog = Catalog.from_arrays(np.arange(300), np.random.default_rng(4).integers(0, 12,
                                                                                    (300, 3)))
    engine = Engine(Model.from_preset("tiny", seed=3, device="cuda"), catalog)
    assert engine.options.selection == "triton"


@pytest.mark.gpu
@pytest.mark.parametrize("beams,dtype", [(256, torch.bfloat16), (1024, torch.float32)])
def test_gpu_kernel_matches_reference(beams, dtype):
    rng = np.random.default_rng(beams)
    catalog = random_catalog(rng, 256, items=200_000, skew=0.8).to("cuda")
    gen = torch.Generator().manual_seed(beams)
    for level in (0, 1, 2):
        logits, scores, prefixes = (t.cuda() for t in level_inputs(
            torch.Generator().manual_seed(level), catalog.to("cpu"), level, 4, beams, dtype))
        blocked = random_blocked(gen, catalog, level, 4).cuda() if level == 2 else None
        indptr, codes = catalog.level_indptr[level], catalog.level_codes[level]
        out = launch_constrained_topk(logits, scores, prefixes, indptr, codes, beams, blocked,
                                      out=tuple(t.cuda() for t in poisoned(4, beams)))
        ref = reference(logits, scores, prefixes, indptr, codes, beams, blocked)
        check_equal(out, ref, f"GPU W={beams} level={level} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("beams", [256, 1024])
@pytest.mark.parametrize("dead", [0.25, 0.999])
def test_gpu_tied_select_matches_reference(beams, dead):
    """Default chunks (W 256: one reduction of 16 chunks; W 1024: two, 32 then 4 chunks) on
    tied scores, and with nearly all beams dead the -inf tail."""
    rng = np.random.default_rng(beams + 1)
    catalog = random_catalog(rng, 256, items=200_000, skew=0.8)
    gen = torch.Generator().manual_seed(beams + 7)
    for level in (1, 2):
        inputs = tied_level_inputs(gen, catalog, level, 3, beams, dead)
        logits, scores, prefixes = (t.cuda() for t in inputs)
        blocked = random_blocked(gen, catalog, level, 3).cuda() if level == 2 else None
        indptr = catalog.level_indptr[level].cuda()
        codes = catalog.level_codes[level].cuda()
        for width in (beams, 300):
            out = launch_constrained_topk(logits, scores, prefixes, indptr, codes, width,
                                          blocked,
                                          out=tuple(t.cuda() for t in poisoned(3, width)))
            ref = reference(logits, scores, prefixes, indptr, codes, width, blocked)
            check_equal(out, ref, f"GPU tied W={beams} width={width} level={level}")


@pytest.mark.gpu
def test_gpu_selection_replays_in_a_cuda_graph_without_host_sync():
    catalog = random_catalog(np.random.default_rng(1), 256, items=50_000, skew=0.8).to("cuda")
    inputs = [tuple(t.cuda() for t in level_inputs(torch.Generator().manual_seed(s),
                                                  catalog.to("cpu"), 1, 2, 256, torch.bfloat16))
              for s in (0, 1)]
    static = tuple(t.clone() for t in inputs[0])
    args = (catalog.level_indptr[1], catalog.level_codes[1], 256)
    constrained_topk(*static, *args)                            # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    results = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            out = constrained_topk(*static, *args)
        for tensors in inputs:
            for dst, src in zip(static, tensors):
                dst.copy_(src)
            graph.replay()
            results.append(tuple(t.clone() for t in out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for tensors, got in zip(inputs, results):
        check_equal(got, reference(*tensors, *args), "graph replay")
