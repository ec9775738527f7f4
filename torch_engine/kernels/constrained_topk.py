"""Constrained top-k of one beam-search level in Triton: masked log-softmax over the CSR
allowed codes plus per-request top-``width`` over W x C candidates, no dense vocabulary mask.

Same function and selection rule as ``torch_engine.reference.constrained_topk`` (read its
docstring: softmax normalised over the allowed codes; ties by flat index ``w * C + c``; output
in flat-index order, i.e. sorted by parent beam). Launches:

1. ``_level_scores_kernel``, one program per beam: reads the beam's CSR slice (its allowed
   codes), gathers those logits, takes their log-sum-exp in fp32, and writes the candidate
   totals ``parent score + logp`` and child prefix ids into a ``[B, W*C]`` scratch row (-inf
   and -1 for codes not allowed, dropped children via a binary search in ``blocked``).
2. ``_reduce_kernel`` (zero or more times), programs ``[B, chunks]``: each keeps the best
   ``width`` candidates of its chunk of a request's row, in flat order with their flat ids.
   The best ``width`` of a row are among the chunks' best ``width`` (a candidate beaten by
   fewer than ``width`` in the row is beaten by fewer in its chunk), so each step shrinks
   the row ``chunk / width``-fold without changing the result; it spreads one request's
   select over many programs instead of one.
3. ``_select_kernel``, one program per request over what is left: finds the ``width``-th
   largest sortable key by a radix select (4 histogram passes of 8 bits each), then one
   ordered pass writes the keys above it plus the first ties in flat-index order, so the
   outputs come out sorted by parent without a sort (-inf picks, when too few candidates
   are finite, go last). The reduce kernel uses the same radix select per chunk.

A program whose candidates fit ``RESIDENT_KEYS`` loads them once and keeps them in registers
through its four passes (``_radix_select_resident``); larger ones stream them through blocks
once per pass. Keeping them resident nearly halves a level's selection at batch 1: a select's
time is its chain of block-wide scans and reductions, not its loads, and streaming multiplies
that chain by the number of blocks.

Shapes only decide the launch (no device reads), so it captures in a CUDA graph. Registered as
``xgr::constrained_topk`` with a shape-only fake.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from xgr_common.errors import InvalidInputError, require
from torch_engine.kernels import _common as c
from torch_engine.kernels._sorted_search import contains

_OP = "constrained_topk"
# Sortable key of -inf (0xFF800000 ^ 0x7FFFFFFF as int32); constexpr: jit code reads globals
# only as compile-time constants.
_NEG_INF_KEY = tl.constexpr(-2139095041)


@triton.jit
def _level_scores_kernel(
        logits_ptr, scores_ptr, prefix_ptr, indptr_ptr, codes_ptr, blocked_ptr,
        total_ptr, child_ptr, width, size, num_blocked,
        s_lb, s_lw, s_lc, s_sb, s_sw, s_pb, s_pw, s_xb,
        BLOCK_C: tl.constexpr, BLOCK_E: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    row = tl.program_id(0)                          # b * W + w
    b = row // width
    w = row % width
    prefix = tl.load(prefix_ptr + b * s_pb + w * s_pw)
    start = tl.load(indptr_ptr + prefix)
    count = (tl.load(indptr_ptr + prefix + 1) - start).to(tl.int32)
    parent = tl.load(scores_ptr + b * s_sb + w * s_sw).to(tl.float32)
    logit_row = logits_ptr + b * s_lb + w * s_lw
    out_row = row.to(tl.int64) * size

    # Clear the row first: codes not allowed stay -inf / -1.
    for c0 in range(0, size, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        ok = cols < size
        tl.store(total_ptr + out_row + cols, tl.full([BLOCK_C], float("-inf"), tl.float32),
                 mask=ok)
        tl.store(child_ptr + out_row + cols, tl.full([BLOCK_C], -1, tl.int32), mask=ok)

    # Online log-sum-exp over the allowed codes only (the CSR slice of this prefix).
    m_i = tl.full([BLOCK_E], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_E], tl.float32)
    for e0 in range(0, count, BLOCK_E):
        j = e0 + tl.arange(0, BLOCK_E)
        ok = j < count
        code = tl.load(codes_ptr + start + j, mask=ok, other=0)
        x = tl.load(logit_row + code * s_lc, mask=ok, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_i, x)
        l_i = l_i * tl.exp(m_i - m_new) + tl.where(ok, tl.exp(x - m_new), 0.0)
        m_i = m_new
    m_all = tl.max(m_i, 0)
    lse = m_all + tl.log(tl.sum(l_i * tl.exp(m_i - m_all), 0))
    # The clearing stores above and the scatter below may map one address to two threads.
    tl.debug_barrier()

    for e0 in range(0, count, BLOCK_E):
        j = e0 + tl.arange(0, BLOCK_E)
        ok = j < count
        entry = start + j
        code = tl.load(codes_ptr + entry, mask=ok, other=0)
        x = tl.load(logit_row + code * s_lc, mask=ok, other=0.0).to(tl.float32)
        total = parent + (x - lse)
        # Children among this request's sorted blocked ids never take a beam.
        blocked = contains(blocked_ptr + b * s_xb, num_blocked, entry, SEARCH_STEPS)
        total = tl.where(blocked, float("-inf"), total)
        tl.store(total_ptr + out_row + code, total, mask=ok)
        tl.store(child_ptr + out_row + code, entry.to(tl.int32), mask=ok)


@triton.jit
def _sortable(x):
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _radix_select(key_ptr, n, keep, BLOCK: tl.constexpr):
    """The ``keep``-th largest sortable key of ``key_ptr[0:n]`` (fp32): returns it, how many
    keys equal to it to take (the first ones in order) and how many keys are above it, each
    an int64 ``[1]``. Keys as unsigned u = key + 2**31, 8 bits a pass from the top: each pass
    histograms the next digit of the keys sharing the digits chosen so far (the others go to
    bin 256, ignored) and keeps the digit where the count of keys >= it reaches the need."""
    bins = tl.arange(0, 512)
    prefix = tl.zeros([1], tl.int64)
    need = tl.zeros([1], tl.int64) + keep
    greater = tl.zeros([1], tl.int64)
    for level in tl.static_range(4):
        shift = 24 - 8 * level
        hist = tl.zeros([512], tl.int32)
        for i0 in range(0, n, BLOCK):
            idx = i0 + tl.arange(0, BLOCK)
            inside = idx < n
            x = tl.load(key_ptr + idx, mask=inside, other=float("-inf"))
            u = _sortable(x).to(tl.int64) + 2147483648
            match = ((u >> (shift + 8)) == prefix) & inside
            digit = tl.where(match, (u >> shift) & 255, 256)
            hist += tl.histogram(digit.to(tl.int32), 512)
        hist = tl.where(bins < 256, hist, 0).to(tl.int64)
        below = tl.cumsum(hist, 0)                     # keys with digit <= d
        total = tl.sum(hist, 0)
        at_least = total - below + hist                 # keys with digit >= d
        d = tl.max(tl.where((at_least >= need) & (bins < 256), bins, -1), 0).to(tl.int64)
        above = total - tl.sum(tl.where(bins == d, below, 0), 0)
        greater += above
        need -= above
        prefix = prefix * 256 + d
    return prefix - 2147483648, need, greater


@triton.jit
def _radix_select_resident(key_ptr, n, keep, BLOCK: tl.constexpr):
    """``_radix_select`` for ``n <= BLOCK``: the keys are loaded once and stay in registers
    for all four passes, and a pass narrows the candidates with the digit it chose instead of
    comparing their upper bits with the prefix. Same three results."""
    idx = tl.arange(0, BLOCK)
    inside = idx < n
    x = tl.load(key_ptr + idx, mask=inside, other=float("-inf"))
    u = _sortable(x).to(tl.int64) + 2147483648
    bins = tl.arange(0, 256)
    match = inside
    need = tl.zeros([1], tl.int64) + keep
    greater = tl.zeros([1], tl.int64)
    prefix = tl.zeros([1], tl.int64)
    for level in tl.static_range(4):
        digit = ((u >> (24 - 8 * level)) & 255).to(tl.int32)
        hist = tl.histogram(digit, 256, mask=match)
        at_least = tl.cumsum(hist, 0, reverse=True)     # keys with digit >= d
        # at_least never grows with d and at_least[0] >= need: d is the last bin that
        # still holds ``need`` keys at or above it.
        d = tl.sum((at_least >= need).to(tl.int32), 0) - 1
        above = tl.sum(tl.where(bins > d, hist, 0), 0).to(tl.int64)
        greater += above
        need -= above
        match = match & (digit == d)
        prefix = prefix * 256 + d
    return prefix - 2147483648, need, greater


@triton.jit
def _pick_block(key_ptr, idx, n, threshold, ties, seen, taken_live):
    """One block of the ordered write pass after a radix select: the keys at ``idx``
    (``-inf`` past ``n``), which lie above the threshold (``live``), which are ties of it and
    their 1-based rank among all ties so far (``seen`` before this block), which are taken
    (``pick``: above, or among the first ``ties`` ties) and each pick's 0-based rank among all
    picks in flat order (``rank``, given ``taken_live`` live keys before this block). Counts
    are int32: a request's candidates are fewer than 2**31 (``_check_inputs``)."""
    inside = idx < n
    x = tl.load(key_ptr + idx, mask=inside, other=float("-inf"))
    key = _sortable(x)[None, :]
    threshold = threshold.to(tl.int32)[:, None]
    tie = ((key == threshold) & inside[None, :]).to(tl.int32)
    tie_rank = seen[:, None] + tl.cumsum(tie, 1)
    live = (key > threshold) & inside[None, :]
    live_rank = taken_live[:, None] + tl.cumsum(live.to(tl.int32), 1)
    cap = ties.to(tl.int32)[:, None]
    pick = live | ((tie > 0) & (tie_rank <= cap))
    # Picks so far = live keys so far + the ties taken so far (the first ``ties`` of them).
    rank = live_rank + tl.minimum(tie_rank, cap) - 1
    return x, tie, tie_rank, live, live_rank, pick, rank


@triton.jit
def _reduce_kernel(key_ptr, id_ptr, out_key_ptr, out_id_ptr, count, chunk, keep,
                   HAS_IDS: tl.constexpr, RESIDENT: tl.constexpr, BLOCK: tl.constexpr):
    """Program (b, g) keeps the best ``keep`` of candidates ``[g * chunk, (g + 1) * chunk)``
    of request b (same order as the final select: key, then position), written in position
    order to output segment g; a short last chunk pads its segment with -inf (never chosen:
    padding sits after every real candidate and at least ``keep`` real ones survive)."""
    b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    start = g * chunk
    n = tl.minimum(chunk, count - start)
    k = tl.minimum(keep, n)
    base = b * count + start
    if RESIDENT:
        threshold, ties, _ = _radix_select_resident(key_ptr + base, n, k, BLOCK)
    else:
        threshold, ties, _ = _radix_select(key_ptr + base, n, k, BLOCK)
    out = (b * tl.num_programs(1) + g) * keep
    taken_live = tl.zeros([1], tl.int32)
    seen = tl.zeros([1], tl.int32)
    for i0 in range(0, n, BLOCK):
        idx = i0 + tl.arange(0, BLOCK)
        inside = idx < n
        x, tie, _tie_rank, live, _live_rank, pick, rank = _pick_block(
            key_ptr + base, idx, n, threshold, ties, seen, taken_live)
        slot = out + rank
        if HAS_IDS:
            ident = tl.load(id_ptr + base + idx, mask=inside, other=0)
        else:
            ident = (start + idx).to(tl.int32)
        tl.store(out_key_ptr + slot, x[None, :], mask=pick)
        tl.store(out_id_ptr + slot, ident[None, :], mask=pick)
        taken_live += tl.sum(live.to(tl.int32), 1)
        seen += tl.sum(tie, 1)
    for j0 in range(k, keep, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        pad = j < keep
        tl.store(out_key_ptr + out + j, tl.full([BLOCK], float("-inf"), tl.float32), mask=pad)
        tl.store(out_id_ptr + out + j, tl.zeros([BLOCK], tl.int32), mask=pad)


@triton.jit
def _select_kernel(key_ptr, id_ptr, child_ptr, out_score_ptr, out_parent_ptr, out_code_ptr,
                   out_prefix_ptr, count, child_count, size, keep,
                   HAS_IDS: tl.constexpr, RESIDENT: tl.constexpr, BLOCK: tl.constexpr):
    """Program b writes request b's best ``keep`` of ``count`` candidates (flat ids: the
    position, or ``id_ptr`` after a reduction) in flat order: keys above the threshold plus
    the first ties; when the threshold is -inf (fewer finite candidates than ``keep``) the
    dead picks go after every live one, so live beams fill the first slots."""
    b = tl.program_id(0).to(tl.int64)
    base = b * count
    if RESIDENT:
        threshold, ties, greater = _radix_select_resident(key_ptr + base, count, keep, BLOCK)
    else:
        threshold, ties, greater = _radix_select(key_ptr + base, count, keep, BLOCK)
    tail = (threshold == _NEG_INF_KEY)[:, None]
    greater = greater.to(tl.int32)[:, None]
    taken_live = tl.zeros([1], tl.int32)
    seen = tl.zeros([1], tl.int32)
    for i0 in range(0, count, BLOCK):
        idx = i0 + tl.arange(0, BLOCK)
        inside = idx < count
        x, tie, tie_rank, live, live_rank, pick, rank = _pick_block(
            key_ptr + base, idx, count, threshold, ties, seen, taken_live)
        slot = tl.where(tail, tl.where(live, live_rank - 1, greater + tie_rank - 1), rank)
        if HAS_IDS:
            flat = tl.load(id_ptr + base + idx, mask=inside, other=0).to(tl.int64)
        else:
            flat = idx.to(tl.int64)
        flat = flat[None, :]
        child = tl.load(child_ptr + b * child_count + flat, mask=pick, other=-1).to(tl.int64)
        out = b * keep + slot
        tl.store(out_score_ptr + out, x[None, :], mask=pick)
        tl.store(out_parent_ptr + out, flat // size, mask=pick)
        tl.store(out_code_ptr + out, flat % size, mask=pick)
        tl.store(out_prefix_ptr + out, tl.maximum(child, 0), mask=pick)
        taken_live += tl.sum(live.to(tl.int32), 1)
        seen += tl.sum(tie, 1)


def _check_inputs(logits, scores, prefixes, indptr, codes, width, blocked,
                  devices: bool = True) -> None:
    """Shape/dtype (and, unless tracing, device) checks; values are never read."""
    c.check_rank(_OP, "logits", logits, 3, "[B, W, C]")
    c.check_rank(_OP, "scores", scores, 2, "[B, W]")
    c.check_rank(_OP, "prefixes", prefixes, 2, "[B, W]")
    c.check_rank(_OP, "indptr", indptr, 1, "[P + 1]")
    c.check_rank(_OP, "codes", codes, 1, "[E]")
    batch, beams, size = logits.shape
    require(batch >= 1 and beams >= 1 and size >= 1, InvalidInputError,
            f"{_OP}: logits must have B, W, C >= 1, got shape {tuple(logits.shape)}")
    require(logits.dtype in c.FLOAT_DTYPES, InvalidInputError,
            f"{_OP}: logits.dtype must be one of float16/bfloat16/float32, got {logits.dtype}")
    require(scores.dtype == torch.float32, InvalidInputError,
            f"{_OP}: scores.dtype must be float32, got {scores.dtype}")
    for name, tensor in (("scores", scores), ("prefixes", prefixes)):
        require(tuple(tensor.shape) == (batch, beams), InvalidInputError,
                f"{_OP}: {name} must have shape [B, W] = {(batch, beams)} as logits, got "
                f"{tuple(tensor.shape)}")
    require(prefixes.dtype == torch.int64, InvalidInputError,
            f"{_OP}: prefixes.dtype must be int64, got {prefixes.dtype}")
    for name, tensor in (("indptr", indptr), ("codes", codes)):
        c.check_index(_OP, name, tensor, allowed=(torch.int64,))
    require(indptr.shape[0] >= 2, InvalidInputError,
            f"{_OP}: indptr must hold at least one prefix (P + 1 >= 2), got {indptr.shape[0]}")
    require(codes.shape[0] < 2**31, InvalidInputError,
            f"{_OP}: codes holds {codes.shape[0]} entries; child ids are int32, so < 2**31")
    # A traced program's width may be symbolic (one package for several beam widths): its
    # range then becomes a runtime assertion, as the sizes' rules do.
    require(isinstance(width, (int, torch.SymInt)), InvalidInputError,
            f"{_OP}: width must be an int, got {width!r}")
    message = f"{_OP}: width must be an int in [1, W * C = {beams * size}], got {width!r}"
    c.require_size(width >= 1, message)
    c.require_size(width <= beams * size, message)
    c.check_int32_offsets(_OP, {"logits": logits})
    tensors = {"logits": logits, "scores": scores, "prefixes": prefixes, "indptr": indptr,
               "codes": codes}
    if blocked is not None:
        c.check_rank(_OP, "blocked", blocked, 2, "[B, X]")
        c.check_index(_OP, "blocked", blocked, allowed=(torch.int64,))
        c.check_dim(_OP, "blocked", blocked, 0, batch, "B, as logits")
        tensors["blocked"] = blocked
    if devices:
        c.check_devices(_OP, tensors)


# Keys one program holds in registers through a whole radix select (16 a thread at most).
RESIDENT_KEYS = 8192


def select_chunk(width: int) -> int:
    """Candidates per program of one reduction step: at least 4096 (a few blocks of work per
    program) and 8 x width, so each step shrinks the candidates at least 8-fold."""
    return max(4096, 8 * triton.next_power_of_2(width))


def launch_constrained_topk(logits, scores, prefixes, indptr, codes, width, blocked,
                            out: tuple[torch.Tensor, ...] | None = None,
                            chunk: int | None = None, resident_keys: int = RESIDENT_KEYS
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs the kernels on checked inputs; ``out`` (caller-owned scores, parent, code,
    prefix ``[B, width]``) receives the result when given.

    Selection: while a request has more than ``chunk`` (default ``select_chunk(width)``)
    candidates, ``_reduce_kernel`` splits them into chunks, one program each, and keeps the
    best ``width`` of every chunk in flat order (the best ``width`` overall are among them);
    then ``_select_kernel`` picks the final ``width`` in one program per request. A program
    whose candidates fit ``resident_keys`` (a power of two; 0: none) keeps them in registers
    through its radix select."""
    batch, beams, size = logits.shape
    device = logits.device
    total = torch.empty((batch, beams * size), dtype=torch.float32, device=device)
    child = torch.empty((batch, beams * size), dtype=torch.int32, device=device)
    if blocked is None or blocked.shape[1] == 0:
        blocked = torch.empty((batch, 1), dtype=torch.int64, device=device)
        num_blocked = 0
    else:
        num_blocked = blocked.shape[1]
    block_c = min(triton.next_power_of_2(size), 1024)
    # A traced program searches the widest blocked rows it accepts (more steps are harmless).
    steps = max(1, c.bounded_size(_OP, "blocked.shape[1]", num_blocked)).bit_length()
    wrap_triton(_level_scores_kernel)[(batch * beams,)](
        logits, scores, prefixes, indptr, codes, blocked, total, child, beams, size,
        num_blocked, logits.stride(0), logits.stride(1), logits.stride(2), scores.stride(0),
        scores.stride(1), prefixes.stride(0), prefixes.stride(1), blocked.stride(0),
        BLOCK_C=block_c, BLOCK_E=block_c, SEARCH_STEPS=steps, num_warps=4)
    if out is None:
        out = (torch.empty((batch, width), dtype=torch.float32, device=device),
               *(torch.empty((batch, width), dtype=torch.int64, device=device)
                 for _ in range(3)))
    out_scores, parent, code, prefix = out
    # In a traced program the width (and with it the beams W of later levels) may be
    # symbolic: the chunk, the number of reduction steps and the blocks follow the largest
    # sizes the program accepts (more candidates per block are masked; a reduction of fewer
    # than a chunk keeps them all), the launches take the symbolic sizes.
    most_width = c.bounded_size(_OP, "width", width)
    keys, ids, count = total, None, beams * size
    most = c.bounded_size(_OP, "W * C", count)
    chunk = select_chunk(most_width) if chunk is None else chunk
    require(isinstance(chunk, int) and chunk >= 2 * most_width, InvalidInputError,
            f"{_OP}: chunk must be an int >= 2 * width = {2 * most_width} (each reduction "
            f"keeps width of every chunk), got {chunk!r}")
    while most > chunk:
        groups = triton.cdiv(count, chunk)
        out_keys = torch.empty((batch, groups * width), dtype=torch.float32, device=device)
        out_ids = torch.empty((batch, groups * width), dtype=torch.int32, device=device)
        block, resident, warps = _select_block(chunk, resident_keys)
        wrap_triton(_reduce_kernel)[(batch, groups)](
            keys, keys if ids is None else ids, out_keys, out_ids, count, chunk, width,
            HAS_IDS=ids is not None, RESIDENT=resident, BLOCK=block, num_warps=warps)
        keys, ids, count = out_keys, out_ids, groups * width
        most = triton.cdiv(most, chunk) * most_width
    block, resident, warps = _select_block(most, resident_keys)
    wrap_triton(_select_kernel)[(batch,)](
        keys, keys if ids is None else ids, child, out_scores, parent, code, prefix, count,
        beams * size, size, width, HAS_IDS=ids is not None, RESIDENT=resident, BLOCK=block,
        num_warps=warps)
    return out_scores, parent, code, prefix


def _select_block(keys: int, resident_keys: int) -> tuple[int, bool, int]:
    """Block size of a program selecting among ``keys`` candidates, whether they all stay in
    registers (one block) or are streamed through blocks once per radix pass, and its warps.
    Streamed, the interpreter pays per block and the GPU per register: larger blocks only on
    the CPU. Resident, 16 warps from 4096 keys on (slightly faster there than 8 warps; at a
    few hundred keys 8 warps are faster)."""
    block = triton.next_power_of_2(keys)
    if block <= resident_keys:
        return block, True, 16 if block >= 4096 else 8
    return min(block, 8192 if c.interpreting() else 1024), False, 8


def _run(logits, scores, prefixes, indptr, codes, width, blocked):
    _check_inputs(logits, scores, prefixes, indptr, codes, width, blocked)
    with c.on_device(logits.device):
        return launch_constrained_topk(logits, scores, prefixes, indptr, codes, width, blocked)


@triton_op("xgr::constrained_topk", mutates_args=())
def _constrained_topk_op(logits: torch.Tensor, scores: torch.Tensor, prefixes: torch.Tensor,
                         indptr: torch.Tensor, codes: torch.Tensor, width: int,
                         blocked: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # torch.library.triton_op: also the fake (under tracing the wrapped launches record the
    # kernels instead of running), so AOTInductor compiles the kernels into its package.
    if c.interpreting():
        return torch.ops.xgr.constrained_topk_interpreted(logits, scores, prefixes, indptr,
                                                          codes, width, blocked)
    return _run(logits, scores, prefixes, indptr, codes, width, blocked)


@torch.library.custom_op("xgr::constrained_topk_interpreted", mutates_args=())
def _constrained_topk_interpreted(logits: torch.Tensor, scores: torch.Tensor,
                                  prefixes: torch.Tensor, indptr: torch.Tensor,
                                  codes: torch.Tensor, width: int,
                                  blocked: torch.Tensor | None = None
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor]:
    """The op under ``TRITON_INTERPRET=1`` (CPU): interpreted kernels cannot be traced, so
    traced graphs call this opaque op instead."""
    return _run(logits, scores, prefixes, indptr, codes, width, blocked)


@_constrained_topk_interpreted.register_fake
def _(logits, scores, prefixes, indptr, codes, width, blocked=None):
    _check_inputs(logits, scores, prefixes, indptr, codes, width, blocked, devices=False)
    batch = logits.shape[0]
    shape = (batch, width)
    return (logits.new_empty(shape, dtype=torch.float32),
            *(logits.new_empty(shape, dtype=torch.int64) for _ in range(3)))


def constrained_topk(logits: torch.Tensor, scores: torch.Tensor, prefixes: torch.Tensor,
                     indptr: torch.Tensor, codes: torch.Tensor, width: int,
                     blocked: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One level of constrained beam search (Triton; the reference's signature and result).

    logits: ``[B, W, C]`` fp32/bf16/fp16 (any strides); scores: ``[B, W]`` float32;
    prefixes: ``[B, W]`` int64 valid prefix ids of ``indptr``; indptr ``[P + 1]``, codes
    ``[E]`` int64 contiguous CSR (codes of one prefix distinct, in ``[0, C)``); width in
    ``[1, W * C]``; blocked: optional ``[B, X]`` int64, each row sorted ascending (padding:
    any id >= E). Values are not read on the host. Returns scores ``[B, width]`` float32 and
    parent, code, prefix ``[B, width]`` int64, sorted by (parent, code).
    """
    return torch.ops.xgr.constrained_topk(logits, scores, prefixes, indptr, codes, width,
                                          blocked)
