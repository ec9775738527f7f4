"""The fused item expansion (``torch_engine.kernels.item_expansion``, one Triton launch) against
``beam_search.expand_items``, bit for bit: tied and signed-zero scores, dead beams, exclusions,
fewer reachable items than top_k, several slot blocks, sizes of 1; the launcher's rejections;
serving sizes and a CUDA-graph replay on the GPU; the kernel compiled for sm_90.

On the CPU the kernel runs under Triton's interpreter (the root conftest sets it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.sm90_compile import assert_no_spills, compiled_lines
from torch_engine import beam_search as bs
from torch_engine.catalog import Catalog
from xgr_common.errors import InvalidInputError
from torch_engine.kernels.item_expansion import MAX_BEAMS, expand_items
from xgr_common.layout import TokenLayout

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU generator with a fresh seed each run (printed, so a failure can be replayed)."""
    seed = torch.seed() % 2**31
    print(f"seed {seed}")
    return torch.Generator().manual_seed(seed)


def random_catalog(gen: torch.Generator, size: int, items: int, skew: float = 1.0) -> Catalog:
    """Three levels of ``size`` codes drawn from a power law, so paths hold ragged numbers of
    items; item ids ``7 i + 3`` leave ids outside the catalog in between."""
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    weights = 1.0 / np.arange(1, size + 1) ** skew
    codes = rng.choice(size, size=(items, 3), p=weights / weights.sum())
    catalog = Catalog.from_arrays(np.arange(items) * 7 + 3, codes, TokenLayout(codebook_size=size))
    return catalog.to(DEVICE)


def num_paths(catalog: Catalog) -> int:
    return catalog.num_prefixes[catalog.levels]


def beams(gen: torch.Generator, catalog: Catalog, batch: int, width: int, dead: float = 0.3
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores on a 0.5 grid with 0.0 and -0.0 among them (many exact ties), a fraction of dead
    beams (-inf, path 0), random paths (repeats included when W is large)."""
    scores = torch.randint(-3, 1, (batch, width), generator=gen) * 0.5
    scores = torch.where(torch.rand((batch, width), generator=gen) < 0.2, -0.0, scores)
    paths = torch.randint(0, num_paths(catalog), (batch, width), generator=gen)
    dying = torch.rand((batch, width), generator=gen) < dead
    return scores.masked_fill(dying, float("-inf")), paths.masked_fill(dying, 0)


def exclusions(gen: torch.Generator, catalog: Catalog, paths: torch.Tensor, columns: int
               ) -> torch.Tensor:
    """``[B, columns]`` sorted excluded rows (``bs.excluded_rows``) from item ids of which about
    half lie on the request's own paths (so they remove items), the rest other catalog ids,
    ids not in the catalog, and -1 padding."""
    indptr, items = catalog.path_indptr.cpu(), catalog.path_items.cpu()
    rows = []
    for request in paths.cpu():
        own = torch.cat([items[indptr[p]:indptr[p + 1]] for p in request.tolist()])
        pick = torch.randint(0, own.shape[0], (columns,), generator=gen)
        other = torch.randint(0, catalog.num_items, (columns,), generator=gen) * 7 + 3
        unknown = torch.randint(0, 10 * catalog.num_items, (columns,), generator=gen) * 7 + 5
        kind = torch.randint(0, 8, (columns,), generator=gen)
        ids = torch.where(kind < 4, own[pick], torch.where(kind < 6, other, unknown))
        rows.append(torch.where(kind == 7, -1, ids))
    return bs.excluded_rows(torch.stack(rows).to(DEVICE), catalog)


def run_both(catalog: Catalog, scores: torch.Tensor, paths: torch.Tensor,
             excluded: torch.Tensor, top_k: int, what: str = "") -> tuple[torch.Tensor, ...]:
    """The kernel and the reference on one input: equal ids, bit-equal scores (the -1 / -inf
    padding and signed zeros included). Returns the kernel's items and scores."""
    scores, paths, excluded = (t.to(DEVICE) for t in (scores, paths, excluded))
    items, best = expand_items(scores, paths, excluded, catalog.path_indptr, catalog.path_items,
                               top_k)
    ref_items, ref_best = bs.expand_items(scores, paths, excluded, catalog, top_k)
    shape = (scores.shape[0], top_k)
    assert items.shape == shape and best.shape == shape, what
    assert items.dtype == torch.int64 and best.dtype == torch.float32, what
    assert torch.equal(items, ref_items), f"{what}: items differ\n{items}\n{ref_items}"
    assert torch.equal(best.view(torch.int32), ref_best.view(torch.int32)), (
        f"{what}: scores differ\n{best}\n{ref_best}")
    return items, best


@pytest.mark.parametrize("batch,width,columns,top_k,size,items", [
    (1, 1, 1, 1, 4, 40),            # every size 1 (constants in the launch)
    (3, 1, 5, 7, 4, 200),
    (2, 8, 1, 1, 4, 200),
    (4, 16, 12, 30, 4, 200),
    (3, 50, 40, 64, 8, 300),        # W not a power of two
    (2, 200, 100, 500, 8, 300),     # fewer reachable items than top_k, repeated paths
    (2, 64, 300, 20, 4, 200),       # X > top_k: exclusions among the first slots
    (2, 256, 64, 1500, 4, 3000),    # several slot blocks
    (2, 16, 4, 2100, 4, 200),       # padding over several blocks
    (2, 48, 8, 4000, 4, 3000),      # padding from the middle of a later block
])
def test_matches_reference(gen, batch, width, columns, top_k, size, items):
    catalog = random_catalog(gen, size, items)
    scores, paths = beams(gen, catalog, batch, width)
    excluded = exclusions(gen, catalog, paths, columns)
    run_both(catalog, scores, paths, excluded, top_k, f"B{batch} W{width} X{columns} k{top_k}")


def test_rows_of_one_batch_differ(gen):
    """Each program reads its own request: rows with different beams and exclusions give the
    rows the reference gives, not copies of one."""
    catalog = random_catalog(gen, 4, 400)
    scores, paths = beams(gen, catalog, 5, 24)
    excluded = exclusions(gen, catalog, paths, 9)
    items, _ = run_both(catalog, scores, paths, excluded, 40)
    assert len({tuple(row) for row in items.tolist()}) > 1


def test_all_beams_dead(gen):
    catalog = random_catalog(gen, 4, 200)
    scores, paths = beams(gen, catalog, 3, 16)
    scores[1] = float("-inf")
    scores[2, :] = float("-inf")
    excluded = exclusions(gen, catalog, paths, 4)
    items, best = run_both(catalog, scores, paths, excluded, 10)
    assert bool((items[1:] == -1).all()) and bool((best[1:] == float("-inf")).all())


def test_ties_follow_beam_index(gen):
    """All scores equal (0.0 and -0.0 mixed): items come beam by beam in index order."""
    catalog = random_catalog(gen, 4, 300)
    _, paths = beams(gen, catalog, 2, 32, dead=0.0)
    scores = torch.where(torch.rand((2, 32), generator=gen) < 0.5, 0.0, -0.0)
    excluded = torch.full((2, 1), catalog.num_items, dtype=torch.int64)
    items, _ = run_both(catalog, scores, paths, excluded, 50)
    indptr, path_items = catalog.path_indptr.cpu(), catalog.path_items.cpu()
    expected = torch.cat([path_items[indptr[p]:indptr[p + 1]] for p in paths[0].tolist()])
    assert torch.equal(items[0].cpu()[:min(50, expected.shape[0])], expected[:50])


def test_every_reachable_item_excluded(gen):
    catalog = random_catalog(gen, 4, 200)
    scores, paths = beams(gen, catalog, 2, 6, dead=0.0)
    indptr, path_items = catalog.path_indptr.cpu(), catalog.path_items.cpu()
    ids = [torch.cat([path_items[indptr[p]:indptr[p + 1]] for p in row.tolist()])
           for row in paths]
    wide = max(len(row) for row in ids) + 3
    exclude = torch.stack([torch.nn.functional.pad(row, (0, wide - len(row)), value=-1)
                           for row in ids])
    excluded = bs.excluded_rows(exclude.to(DEVICE), catalog)
    items, best = run_both(catalog, scores, paths, excluded, 5)
    assert bool((items == -1).all()) and bool((best == float("-inf")).all())


@pytest.mark.parametrize("columns", [1, 2, 7, 8, 16])
def test_full_exclusion_rows(gen, columns):
    """Rows of distinct excluded items with no padding (power-of-two widths included): the
    membership search reaches the last column."""
    catalog = random_catalog(gen, 4, 400)
    scores, paths = beams(gen, catalog, 3, 12, dead=0.0)
    indptr, path_items = catalog.path_indptr.cpu(), catalog.path_items.cpu()
    rows = []
    for request in paths:
        own = torch.cat([path_items[indptr[p]:indptr[p + 1]] for p in request.tolist()]).unique()
        rows.append(own[torch.randperm(own.shape[0], generator=gen)[:columns]])
    excluded = bs.excluded_rows(torch.stack(rows).to(DEVICE), catalog)
    assert bool((excluded < catalog.num_items).all())
    run_both(catalog, scores, paths, excluded, 60)


def test_repeated_paths_walk_top_k_plus_x_slots(gen):
    """Beams on one path hit an excluded row once each: more hits than X among the
    ``top_k + X`` raw slots, and the reference stops there (fewer than top_k items) instead
    of walking on to slots that would fill them."""
    catalog = random_catalog(gen, 4, 400)
    sizes = catalog.path_indptr.diff().cpu()
    path = int(torch.argmax(sizes))
    count = int(sizes[path])
    scores = torch.zeros((1, 4))
    paths = torch.full((1, 4), path)
    excluded = catalog.path_indptr[path:path + 1].view(1, 1).cpu()   # the path's first row
    items, _ = run_both(catalog, scores, paths, excluded, 4 * count - 4)
    assert int((items >= 0).sum()) == 4 * count - 7


def _good() -> dict:
    return dict(scores=torch.zeros((2, 4), device=DEVICE),
                paths=torch.zeros((2, 4), dtype=torch.int64, device=DEVICE),
                excluded=torch.full((2, 3), 5, dtype=torch.int64, device=DEVICE),
                path_indptr=torch.tensor([0, 2, 5], device=DEVICE),
                path_items=torch.arange(5, device=DEVICE), top_k=3)


@pytest.mark.parametrize("name,value,match", [
    ("scores", lambda: torch.zeros((2, 4), dtype=torch.float64), "scores.dtype"),
    ("scores", lambda: torch.zeros(8), "scores must have shape"),
    ("scores", lambda: torch.zeros((4, 2)).t(), "scores must be contiguous"),
    ("scores", lambda: torch.zeros((2, MAX_BEAMS + 1)), r"scores.shape\[1\]"),
    ("scores", lambda: torch.zeros((2, 0)), r"scores.shape\[1\]"),
    ("paths", lambda: torch.zeros((2, 4), dtype=torch.int32), "paths.dtype"),
    ("paths", lambda: torch.zeros((2, 5), dtype=torch.int64), "paths must have scores's shape"),
    ("excluded", lambda: torch.zeros((3, 3), dtype=torch.int64), r"excluded.shape\[0\]"),
    ("excluded", lambda: torch.zeros((2, 0), dtype=torch.int64), "excluded must have X >= 1"),
    ("excluded", lambda: torch.zeros((3, 2), dtype=torch.int64).t(), "excluded must be contig"),
    ("path_indptr", lambda: torch.zeros((1, 3), dtype=torch.int64), "path_indptr must have"),
    ("path_indptr", lambda: torch.zeros(1, dtype=torch.int64), "at least one path"),
    ("path_items", lambda: torch.arange(5, dtype=torch.int32), "path_items.dtype"),
    ("top_k", lambda: 0, "top_k must be an int >= 1"),
    ("top_k", lambda: 2.0, "top_k must be an int >= 1"),
    ("top_k", lambda: True, "top_k must be an int >= 1"),
])
def test_bad_inputs_name_the_argument(name, value, match):
    args = _good()
    value = value()
    args[name] = value.to(DEVICE) if isinstance(value, torch.Tensor) else value
    with pytest.raises(InvalidInputError, match=match):
        expand_items(**args)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    """Without the interpreter, CPU tensors are refused (``beam_search.expand_items`` serves
    them)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    args = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in _good().items()}
    with pytest.raises(InvalidInputError, match="needs CUDA tensors"):
        expand_items(**args)


def test_empty_batch():
    args = _good()
    for name in ("scores", "paths", "excluded"):
        args[name] = args[name][:0]
    items, best = expand_items(**args)
    assert items.shape == (0, 3) and best.shape == (0, 3)


@pytest.fixture(scope="module")
def serving_catalog() -> Catalog:
    """200k items over three levels of 256 codes (power law: some paths hold many items)."""
    return random_catalog(torch.Generator().manual_seed(11), 256, 200_000, skew=1.2)


@pytest.mark.gpu
@pytest.mark.parametrize("width", [256, 1024])
@pytest.mark.parametrize("columns", [1, 512])
def test_serving_sizes(gen, serving_catalog, width, columns):
    catalog = serving_catalog
    for dead in (0.0, 0.5, 1.0):
        scores, paths = beams(gen, catalog, 8, width, dead=dead)
        # Real scores: log-probabilities, mostly distinct, a few ties.
        scores = torch.where(torch.rand((8, width), generator=gen) < 0.8,
                             scores + torch.randn((8, width), generator=gen), scores)
        excluded = exclusions(gen, catalog, paths, columns)
        run_both(catalog, scores, paths, excluded, 300, f"W{width} X{columns} dead {dead}")


@pytest.mark.gpu
def test_cuda_graph_replay(gen, serving_catalog):
    """Captured once, replayed on new beams and exclusions copied into the static inputs."""
    catalog = serving_catalog
    scores, paths = (t.cuda() for t in beams(gen, catalog, 8, 256))
    excluded = exclusions(gen, catalog, paths, 512)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):                       # warm-up: compile outside capture
        expand_items(scores, paths, excluded, catalog.path_indptr, catalog.path_items, 300)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        items, best = expand_items(scores, paths, excluded, catalog.path_indptr,
                                   catalog.path_items, 300)
    for dead in (0.2, 0.9):
        new_scores, new_paths = beams(gen, catalog, 8, 256, dead=dead)
        new_scores = new_scores + torch.randn((8, 256), generator=gen)
        scores.copy_(new_scores)
        paths.copy_(new_paths)
        excluded.copy_(exclusions(gen, catalog, paths, 512))
        graph.replay()
        ref_items, ref_best = bs.expand_items(scores, paths, excluded, catalog, 300)
        assert torch.equal(items, ref_items), f"replay dead {dead}: items differ"
        assert torch.equal(best.view(torch.int32), ref_best.view(torch.int32)), (
            f"replay dead {dead}: scores differ")


# The kernel compiled for sm_90 without a GPU (``tests.sm90_compile``).
_COMPILE = """
from torch_engine.kernels.item_expansion import MAX_BEAMS, _blocks, _expand_items_kernel
signature = dict(scores_ptr="*fp32", paths_ptr="*i64", excluded_ptr="*i64", indptr_ptr="*i64",
                 items_ptr="*i64", scratch_ptr="*i64", out_items_ptr="*i64",
                 out_scores_ptr="*fp32", width="i32", num_excluded="i32", top_k="i32",
                 BLOCK_W="constexpr", LOG_W="constexpr", SEARCH_X="constexpr",
                 BLOCK_S="constexpr")
# (W, X, top_k): serving sizes, the largest exclusion row and many slot blocks, the widest beam.
for width, excluded, top_k in ((256, 1, 300), (256, 512, 300), (1024, 512, 300),
                               (1024, 4096, 3000), (MAX_BEAMS, 4096, 300)):
    blocks = _blocks(width, excluded, top_k)
    warps = blocks.pop("num_warps")
    kernel = triton.compile(ASTSource(fn=_expand_items_kernel, signature=signature,
                                      constexprs=blocks),
                            target=TARGET, options=dict(num_warps=warps))
    print("COMPILED", f"W{width} X{excluded} top_k{top_k}", blocks, f"warps {warps}",
          usage(kernel))
# One beam, one exclusion column, top_k 1: Triton passes int arguments equal to 1 as constants.
blocks = _blocks(1, 1, 1)
warps = blocks.pop("num_warps")
signature.update(width="constexpr", num_excluded="constexpr", top_k="constexpr")
triton.compile(ASTSource(fn=_expand_items_kernel, signature=signature, constexprs=dict(
    width=1, num_excluded=1, top_k=1, **blocks)), target=TARGET, options=dict(num_warps=warps))
print("COMPILED W1 X1 top_k1")
"""


@pytest.mark.heavy
def test_kernel_compiles_for_sm90():
    lines = compiled_lines(_COMPILE, 6)
    assert_no_spills(lines[:5])
