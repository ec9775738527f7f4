"""The final path -> item expansion of a beam search in one Triton launch.

``torch_engine.beam_search.expand_items`` spends about 38 small torch kernels (sort, gathers,
cumsums, two searchsorted, two scatters) at the end of every search, each a launch of its own
inside the search's CUDA graph, however little it computes. Here one program per request does
all of it:

1. sorts the request's W beam scores in registers: one descending ``tl.sort`` of int64 keys,
   the order-preserving int32 key of the score in the upper half and ``BLOCK_W - 1 - beam`` in
   the lower, which is score descending, ties by beam index ascending (torch's stable sort);
2. gives each sorted beam its item count (0 when dead), the running ends of those counts
   (``tl.cumsum``) and the path row that its slots start from, and parks the ends, the start
   rows and the scores in a per-request scratch row: registers cannot be indexed, so the
   slot -> beam search below reads them back from memory after a ``tl.debug_barrier``;
3. walks the raw item slots (``min(top_k + X, reachable)`` of them: at most X are excluded,
   so top_k survive when that many are reachable) in blocks of ``BLOCK_S``: a branchless binary
   search of the ends finds each slot's beam, hence its row of ``path_items``; a second one in
   the request's sorted ``excluded`` rows drops excluded rows; ``tl.cumsum`` gives the kept
   slots their output position. The walk stops at the first block after which ``top_k`` items
   are kept, usually the first;
4. pads the output slots past the last kept item with -1 / -inf.

Every output address is written once (kept items at distinct cumsum positions, padding past
them), so nothing races. Same function, bit for bit, as ``beam_search.expand_items`` (its
docstring has the rules). The launcher checks shapes, dtypes, contiguity and devices, never
values (a host synchronisation would break CUDA-graph capture), and raises
``InvalidInputError`` naming the argument and the rule. Shapes alone decide the launch, so
it captures in a CUDA graph. The engine's eager and captured searches call the launcher;
traced programs call it as ``xgr::expand_items``, registered with ``torch.library.triton_op``
(AOTInductor compiles the kernel into its package).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from xgr_common.errors import InvalidInputError, require
from torch_engine.kernels import _common as c
from torch_engine.kernels._sorted_search import contains
from torch_engine.kernels.constrained_topk import _sortable

_OP = "expand_items"
# Beams one program sorts in registers (W); wider beams use beam_search.expand_items.
MAX_BEAMS = 4096
# Raw item slots per block of the walk.
_MAX_SLOTS = 1024


@triton.jit
def _expand_items_kernel(scores_ptr, paths_ptr, excluded_ptr, indptr_ptr, items_ptr,
                         scratch_ptr, out_items_ptr, out_scores_ptr, width, num_excluded,
                         top_k, BLOCK_W: tl.constexpr, LOG_W: tl.constexpr,
                         SEARCH_X: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK_W)
    x = tl.load(scores_ptr + b * width + lane, mask=lane < width, other=float("-inf"))
    # -0.0 and 0.0 tie in torch's sort but not as bit keys. Lanes past W sort after every beam.
    key = _sortable(tl.where(x == 0.0, 0.0, x))
    packed = tl.sort((key.to(tl.int64) << 32) + (BLOCK_W - 1 - lane), descending=True)
    beam = BLOCK_W - 1 - packed.to(tl.int32)       # the low half: which beam is i-th best
    real = beam < width
    score = tl.load(scores_ptr + b * width + beam, mask=real, other=float("-inf"))
    live = score > float("-inf")
    path = tl.load(paths_ptr + b * width + beam, mask=live, other=0)
    first = tl.load(indptr_ptr + path, mask=live, other=0)
    count = tl.where(live, tl.load(indptr_ptr + path + 1, mask=live, other=0) - first, 0)
    ends = tl.cumsum(count, 0)
    scratch = scratch_ptr + b * (3 * BLOCK_W)
    tl.store(scratch + lane, ends)
    # Raw slot s of a beam holds row base + s, base = its first row - the slots before it.
    tl.store(scratch + BLOCK_W + lane, first - (ends - count))
    tl.store(scratch + 2 * BLOCK_W + lane, score.to(tl.int32, bitcast=True).to(tl.int64))
    tl.debug_barrier()

    # (sums, not casts: Triton passes an int argument equal to 1 as a constant)
    limit = tl.minimum(tl.sum(count, 0), tl.zeros((), tl.int64) + top_k + num_excluded)
    excluded = excluded_ptr + b * num_excluded
    out = b * top_k
    kept = tl.zeros((), tl.int64)
    start = tl.zeros((), tl.int64)
    while (start < limit) & (kept < top_k):
        slot = start + tl.arange(0, BLOCK_S)
        reachable = slot < limit
        # The beam of a slot is the first whose end lies above it: the number of ends <= slot,
        # at most W - 1 for a reachable slot (ends past W stay at the total).
        pos = tl.zeros([BLOCK_S], tl.int32)
        for k in tl.static_range(LOG_W):
            half = BLOCK_W >> (k + 1)
            end = tl.load(scratch + pos + (half - 1))
            pos = tl.where(end <= slot, pos + half, pos)
        row = tl.load(scratch + BLOCK_W + pos) + slot
        bits = tl.load(scratch + 2 * BLOCK_W + pos).to(tl.int32)
        # Issued before the exclusion search so that the two latencies overlap.
        item = tl.load(items_ptr + row, mask=reachable, other=-1)
        keep = reachable & ~contains(excluded, num_excluded, row, SEARCH_X)
        target = kept + tl.cumsum(keep.to(tl.int64), 0) - 1
        write = keep & (target < top_k)
        tl.store(out_items_ptr + out + target, item, mask=write)
        tl.store(out_scores_ptr + out + target, bits.to(tl.float32, bitcast=True), mask=write)
        kept += tl.sum(keep.to(tl.int64), 0)
        start += BLOCK_S

    kept = tl.minimum(kept, top_k)
    for j0 in range((kept // BLOCK_S) * BLOCK_S, top_k, BLOCK_S):
        j = j0 + tl.arange(0, BLOCK_S)
        pad = (j >= kept) & (j < top_k)
        tl.store(out_items_ptr + out + j, tl.full([BLOCK_S], -1, tl.int64), mask=pad)
        tl.store(out_scores_ptr + out + j, tl.full([BLOCK_S], float("-inf"), tl.float32),
                 mask=pad)


def _check_inputs(scores, paths, excluded, path_indptr, path_items, top_k) -> None:
    c.check_rank(_OP, "scores", scores, 2, "[B, W]")
    c.check_rank(_OP, "paths", paths, 2, "[B, W]")
    c.check_rank(_OP, "excluded", excluded, 2, "[B, X]")
    c.check_rank(_OP, "path_indptr", path_indptr, 1, "[P + 1]")
    c.check_rank(_OP, "path_items", path_items, 1, "[N]")
    batch, width = scores.shape
    require(scores.dtype == torch.float32, InvalidInputError,
            f"{_OP}: scores.dtype must be float32, got {scores.dtype}")
    require(scores.is_contiguous(), InvalidInputError,
            f"{_OP}: scores must be contiguous, got strides {scores.stride()}")
    require(1 <= width <= MAX_BEAMS, InvalidInputError,
            f"{_OP}: scores.shape[1] (W, the beams) must be in [1, {MAX_BEAMS}] (one program "
            f"sorts them in registers; wider beams: beam_search.expand_items), got {width}")
    c.check_same_shape(_OP, "paths", paths, "scores", scores, "[B, W]")
    c.check_dim(_OP, "excluded", excluded, 0, batch, "B, as scores")
    require(excluded.shape[1] >= 1, InvalidInputError,
            f"{_OP}: excluded must have X >= 1 columns (pad with the sentinel len(path_items)),"
            f" got shape {tuple(excluded.shape)}")
    require(path_indptr.shape[0] >= 2, InvalidInputError,
            f"{_OP}: path_indptr must hold at least one path (P + 1 >= 2), got shape "
            f"{tuple(path_indptr.shape)}")
    for name, tensor in (("paths", paths), ("excluded", excluded),
                         ("path_indptr", path_indptr), ("path_items", path_items)):
        c.check_index(_OP, name, tensor, allowed=(torch.int64,))
    require(isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1,
            InvalidInputError, f"{_OP}: top_k must be an int >= 1, got {top_k!r}")
    c.check_devices(_OP, {"scores": scores, "paths": paths, "excluded": excluded,
                          "path_indptr": path_indptr, "path_items": path_items})


def _blocks(width: int, excluded, top_k: int) -> dict:
    """Block sizes and warps of a launch, from shapes only. A slot block covers ``top_k`` plus
    the exclusions in one step, up to ``_MAX_SLOTS``. Warps grow with the blocks so that no
    compile for sm_90 spills (tests/kernels/test_item_expansion.py prints the registers). In a
    traced program the beam block and the exclusion search cover the largest width and
    exclusion count the program accepts: one program sorts every beam of its request, so a
    block sized from the example width would drop the beams past it at a wider one."""
    block_w = max(16, triton.next_power_of_2(c.bounded_size(_OP, "scores.shape[1] (W)", width)))
    block_s = max(16, min(triton.next_power_of_2(top_k + c.size_hint(excluded)), _MAX_SLOTS))
    warps = 16 if block_w >= 4096 else 8 if max(block_w, block_s) >= 512 else 4
    search_x = c.bounded_size(_OP, "excluded.shape[1]", excluded).bit_length()
    return dict(BLOCK_W=block_w, LOG_W=block_w.bit_length() - 1,
                SEARCH_X=search_x, BLOCK_S=block_s, num_warps=warps)


def expand_items(scores: torch.Tensor, paths: torch.Tensor, excluded: torch.Tensor,
                 path_indptr: torch.Tensor, path_items: torch.Tensor, top_k: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` best items of the final beams (``beam_search.expand_items``, one launch).

    scores: ``[B, W]`` float32 contiguous (any order, -inf = dead beam, W <= ``MAX_BEAMS``);
    paths: ``[B, W]`` int64 path ids in ``[0, P)``; excluded: ``[B, X]`` int64, X >= 1, each
    row sorted ascending and deduplicated (``beam_search.excluded_rows``: rows of
    ``path_items``, padded with ``len(path_items)``); path_indptr ``[P + 1]`` and path_items
    ``[N]`` int64 (the catalog's). Values are not read on the host. Returns item ids
    ``[B, top_k]`` int64 (-1 where fewer items were reachable) and their beams' scores float32
    (-inf there).
    """
    _check_inputs(scores, paths, excluded, path_indptr, path_items, top_k)
    batch, width = scores.shape
    device = scores.device
    items = torch.empty((batch, top_k), dtype=torch.int64, device=device)
    best = torch.empty((batch, top_k), dtype=torch.float32, device=device)
    if batch == 0:
        return items, best
    blocks = _blocks(width, excluded.shape[1], top_k)
    scratch = torch.empty((batch, 3 * blocks["BLOCK_W"]), dtype=torch.int64, device=device)
    with c.on_device(device):
        wrap_triton(_expand_items_kernel)[(batch,)](
            scores, paths, excluded, path_indptr, path_items, scratch, items, best, width,
            excluded.shape[1], top_k, **blocks)
    return items, best


@triton_op("xgr::expand_items", mutates_args=())
def _expand_items_op(scores: torch.Tensor, paths: torch.Tensor, excluded: torch.Tensor,
                     path_indptr: torch.Tensor, path_items: torch.Tensor, top_k: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    return expand_items(scores, paths, excluded, path_indptr, path_items, top_k)


def traced_expand_items(scores: torch.Tensor, paths: torch.Tensor, excluded: torch.Tensor,
                        path_indptr: torch.Tensor, path_items: torch.Tensor, top_k: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``expand_items`` as the op ``xgr::expand_items``, for traced programs."""
    return torch.ops.xgr.expand_items(scores, paths, excluded, path_indptr, path_items, top_k)
