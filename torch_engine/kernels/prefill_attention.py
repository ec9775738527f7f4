"""Segmented-mask prefill attention in Triton over a packed ragged batch.

Same function as ``torch_engine.reference.prefill_attention``. The mask is never materialised:
each ``BLOCK_M``-query tile derives it on the fly from positions and ``segment_ids``. Because
segments are contiguous and non-decreasing within a request, the keys any tile may attend form
one contiguous range ``[lo, hi)``, and a prefix ``[lo, full_end)`` of it is allowed for every
query of the tile. Both come from the tile's first and last segment id and one vector load of
the segment ids just past (or before) the tile; a binary search runs only when a segment is
longer than a key tile (no host work):

============  =====================  ==============================  ==========================
mode          lo                     hi                              full_end
============  =====================  ==============================  ==========================
causal        request start          q1                              q0 + 1
prefix        request start          max(q1, profile end) *          q0 + 1 (profile end **)
segment       first key of seg[q0]   one past last key of seg[q1-1]  hi if seg[q0] == seg[q1-1]
item_causal   request start          one past last key of seg[q1-1]  one past last of seg[q0]
============  =====================  ==============================  ==========================

(* when the tile holds profile queries; ** when all its queries are profile tokens.)
Key tiles below ``full_end`` run without any mask; the rest apply the mask; key tiles outside
``[lo, hi)`` are never loaded (wholly masked tiles are skipped). The mask itself compares key
positions with one window ``[row_lo, row_hi)`` per query row, found once per tile from the
tile's segment ids (running minimum/maximum scans), so masked key tiles load no segment ids.
The keys of the last row's segment that lie past the tile's last query (at most a few for
item-level layouts) take one 16-key step instead of a whole key tile. FlashAttention-2 online
softmax in float32; query tiles run longest-first; whole key tiles load through TMA
descriptors when the tile asks for it (``PrefillConfig.tma``) and the layout allows
(``_common.tma_ready``).

Programs map to query tiles without a host-side table: request b owns virtual tiles starting
at ``cu_seqlens[b] // BLOCK_M + b`` (strictly increasing, leaving room for its
``cdiv(len, BLOCK_M)`` tiles), found by counting, in one vector load of ``cu_seqlens``, the
requests that start at or below a tile; at most B programs of the ``T // BLOCK_M`` + B per
head launched exit at once. A ragged batch runs head after head, each request's tiles last
first. When every request has the same length (the engine's padded batches; the same load
tells), the tiles run longest-first across requests and heads instead, so that the programs
that start last are the shortest and the GPU does not wait on one long tile at the end. That
order goes chunk by chunk (``lpt_chunk``: requests x KV heads whose keys and values fit a third
of L2), because the long tiles of every request at once would stream their keys from memory.

Registered as ``xgr::prefill_attention`` with ``torch.library.triton_op`` (traceable launch:
config and grid from shapes), so AOTInductor compiles the kernel into its package.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from xgr_common.errors import InvalidInputError, require
from torch_engine.kernels import _common as c
from torch_engine.kernels._online_softmax import online_softmax_step, score_key_tile
from xgr_common.layout import MaskMode

_OP = "prefill_attention"
_LOG2E = 1.4426950408889634
# Kernel codes of the mask modes (a constexpr each, so every mode compiles its own loop).
MODE_CODES = {MaskMode.CAUSAL: 0, MaskMode.PREFIX_BIDIRECTIONAL: 1,
              MaskMode.SEGMENT_BIDIRECTIONAL: 2, MaskMode.ITEM_CAUSAL: 3}


@dataclass(frozen=True)
class PrefillConfig:
    """Tiling of one prefill launch."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 3
    # P V accumulated into the accumulator's registers, or added to it after the product.
    acc_in_dot: bool = True
    # Whole key tiles loaded through tensor-memory-access descriptors (Hopper's TMA).
    tma: bool = False
    # Registers per thread at most (``_common.register_cap``); None: the compiler's choice.
    maxnreg: int | None = None


@triton.jit
def _first_greater(ptr, lo, hi, x, OR_EQUAL: tl.constexpr):
    """First index p in [lo, hi) with ptr[p] > x (>= x if OR_EQUAL); hi if none. Sorted input."""
    while lo < hi:
        mid = (lo + hi) // 2
        val = tl.load(ptr + mid)
        if OR_EQUAL:
            go_right = val < x
        else:
            go_right = val <= x
        new_lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(go_right, hi, mid)
        lo = new_lo
    return lo


@triton.jit
def _minimum(a, b):
    return tl.minimum(a, b)


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _segment_end(seg_ptr, pos, end, x, SCAN: tl.constexpr):
    """First p in [pos, end] with seg[p] > x (end if none), given seg[pos - 1] <= x. One vector
    load of SCAN ids; the serial binary search runs only when the segment is longer."""
    offs = pos + tl.arange(0, SCAN)
    # The fill is a constant, not x + 1, so the load need not wait for x.
    vals = tl.load(seg_ptr + offs, mask=offs < end, other=2147483647)
    found = pos + tl.sum((vals <= x).to(tl.int32), 0)
    if found == pos + SCAN:
        found = _first_greater(seg_ptr, pos + SCAN, end, x, False)
    return found


@triton.jit
def _segment_start(seg_ptr, start, pos, x, SCAN: tl.constexpr):
    """First p in [start, pos] with seg[p] >= x (pos if none), given seg[pos] >= x."""
    offs = pos - SCAN + tl.arange(0, SCAN)
    vals = tl.load(seg_ptr + offs, mask=offs >= start, other=-2147483647)
    found = pos - tl.sum((vals >= x).to(tl.int32), 0)
    if found == pos - SCAN:
        found = _first_greater(seg_ptr, start, pos - SCAN, x, True)
    return found


@triton.jit
def _attend_keys(acc, l_i, m_i, visited, q, k_base, v_base, s_kt, s_vt, start, stop, hi,
                 row_lo, row_hi, qk_scale, d, kd, vd, col, MODE: tl.constexpr,
                 MASKED: tl.constexpr, BLOCK_N: tl.constexpr, ACC_IN_DOT: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, STATS: tl.constexpr):
    """Key tiles of BLOCK_N keys from ``start`` while below ``stop``, each one step of
    FlashAttention-2's online softmax. MASKED tiles keep, for each row, the keys of its window
    ``[row_lo, row_hi)`` below ``hi`` (``row_lo`` only in segment mode); whole tiles (not
    MASKED) load through the descriptors kd, vd when TMA. ``visited`` counts the tiles when
    STATS."""
    for k0 in range(start, stop, BLOCK_N):
        kpos = k0 + tl.arange(0, BLOCK_N)
        s, v = score_key_tile(q, k_base, v_base, kd, vd, k0, kpos, col, s_kt, s_vt, d, hi,
                              MASKED, TMA, DOT_PRECISION)
        if MASKED:
            allowed = (kpos[None, :] < row_hi[:, None]) & (kpos < hi)[None, :]
            if MODE == 2:
                allowed = allowed & (kpos[None, :] >= row_lo[:, None])
            s = tl.where(allowed, s, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, ACC_IN_DOT,
                                            DOT_PRECISION)
        if STATS:
            visited += 1
    return acc, l_i, m_i, visited


@triton.jit
def _prefill_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, seg_ptr, stats_ptr, kd, vd,
        qk_scale, batch, num_tiles, num_heads, chunk_requests, chunk_kv_heads,
        s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, BLOCK_B: tl.constexpr, MODE: tl.constexpr,
        STATS: tl.constexpr, ACC_IN_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        TMA: tl.constexpr):
    qk_scale = tl.cast(qk_scale, tl.float32)  # a float64 scalar when Inductor launches it
    pid = tl.program_id(0)
    # Ragged batches: heads one after another, each head's virtual tiles last (longest) first.
    head = pid // num_tiles
    tile = num_tiles - 1 - pid % num_tiles
    # Request b owns virtual tiles from cu[b] // BLOCK_M + b: count the requests starting at or
    # below this tile (vector loads of BLOCK_B offsets instead of a serial search). The same
    # loads give the request's bounds, so no dependent load of cu[b], cu[b + 1] follows: cu
    # does not decrease, so cu[b] is the largest offset of the requests counted and cu[b + 1]
    # the smallest of the others (offset B included; its virtual tile lies past every tile).
    # They also tell whether every request has the same length (cu[b] == b * T / B).
    total = tl.load(cu_ptr + batch).to(tl.int32)
    length = total // batch
    starting = 0
    start = 0
    end = 2147483647
    unequal = 0
    for r0 in range(0, batch + 1, BLOCK_B):
        reqs = r0 + tl.arange(0, BLOCK_B)
        offsets = tl.load(cu_ptr + reqs, mask=reqs <= batch, other=0).to(tl.int32)
        counted = (offsets // BLOCK_M + reqs <= tile) & (reqs < batch)
        starting += tl.sum(counted.to(tl.int32), 0)
        start = tl.maximum(start, tl.max(tl.where(counted, offsets, 0), 0))
        end = tl.minimum(end, tl.min(tl.where(~counted & (reqs <= batch), offsets, end), 0))
        unequal += tl.sum(((offsets != reqs * length) & (reqs <= batch)).to(tl.int32), 0)
    b = starting - 1
    q0 = start + (tile - (start // BLOCK_M + b)) * BLOCK_M
    if (unequal == 0) & (length > 0) & (batch % chunk_requests == 0):
        # Equal lengths (the engine's padded batches): the tiles longest-first across requests
        # and heads, so the last programs to start are the shortest, in chunks of
        # chunk_requests requests x chunk_heads query heads whose keys and values share L2.
        # In a chunk: tile position (last first), then request, then head (fastest).
        tiles_each = tl.cdiv(length, BLOCK_M)
        chunk_heads = chunk_kv_heads * GROUP
        per_chunk = tiles_each * chunk_requests * chunk_heads
        chunk = pid // per_chunk
        within = pid % per_chunk
        request_groups = batch // chunk_requests
        head = chunk // request_groups * chunk_heads + within % chunk_heads
        rank = within // chunk_heads
        b = chunk % request_groups * chunk_requests + rank % chunk_requests
        position = tiles_each - 1 - rank // chunk_requests
        start = b * length
        end = start + length
        tile = start // BLOCK_M + b + position
        # Programs past the last chunk (the grid covers the virtual tiles) have no work.
        q0 = tl.where(head < num_heads, start + position * BLOCK_M, end)
    if q0 < end:
        q1 = tl.minimum(q0 + BLOCK_M, end)
        rows = q0 + tl.arange(0, BLOCK_M)
        row_ok = rows < q1
        seg_q = tl.load(seg_ptr + rows, mask=row_ok, other=-3)
        seg_first = tl.load(seg_ptr + q0)
        seg_last = tl.load(seg_ptr + q1 - 1)
        # Key range [lo, hi) of the tile and its all-allowed prefix [lo, full_end).
        lo = start
        hi = q1
        full_end = q0 + 1
        profile_end = q0
        if MODE == 1:
            if (seg_first <= 0) & (seg_last >= 0):
                profile_end = _segment_end(seg_ptr, q0, end, 0, BLOCK_N)
                hi = tl.maximum(hi, profile_end)
                if seg_first == seg_last:
                    full_end = tl.maximum(full_end, profile_end)
        elif MODE == 2:
            lo = _segment_start(seg_ptr, start, q0, seg_first, BLOCK_N)
            hi = _segment_end(seg_ptr, q1, end, seg_last, BLOCK_N)
            full_end = tl.where(seg_first == seg_last, hi, lo)
        elif MODE == 3:
            hi = _segment_end(seg_ptr, q1, end, seg_last, BLOCK_N)
            # Keys up to the end of the first row's segment are allowed for every row.
            first_rows = tl.sum(((seg_q == seg_first) & row_ok).to(tl.int32), 0)
            full_end = tl.where(seg_first == seg_last, hi, q0 + first_rows)
        full_end = tl.minimum(full_end, hi)
        n_full = (full_end - lo) // BLOCK_N
        # Each row's allowed keys form one window [row_lo, row_hi) (segments are contiguous and
        # non-decreasing): masked tiles compare key positions with it, as causal mode does,
        # instead of loading and comparing the keys' segment ids. A row's segment ends at the
        # next row of the tile that starts a segment (a reverse running minimum), or at hi for
        # the tile's last segment; it starts at the last such row at or before it, or at lo.
        row_lo = tl.full([BLOCK_M], 0, tl.int32) + lo
        row_hi = rows + 1
        if MODE == 1:
            row_hi = tl.where(seg_q == 0, tl.maximum(row_hi, profile_end), row_hi)
        elif MODE >= 2:
            nxt = rows + 1
            seg_nxt = tl.load(seg_ptr + nxt, mask=nxt < q1, other=0)
            starts = tl.where((nxt < q1) & (seg_nxt != seg_q), nxt, hi)
            seg_end = tl.associative_scan(starts, 0, _minimum, reverse=True)
            if MODE == 2:
                row_hi = seg_end
                seg_prv = tl.load(seg_ptr + rows - 1, mask=(rows > q0) & row_ok, other=0)
                begins = tl.where((rows > q0) & row_ok & (seg_prv != seg_q), rows, lo)
                row_lo = tl.associative_scan(begins, 0, _maximum)
            else:
                row_hi = tl.maximum(row_hi, seg_end)

        d = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + rows[:, None] * s_qt + head * s_qh + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        kv_head = head // GROUP
        k_base = k_ptr + kv_head * s_kh
        v_base = v_ptr + kv_head * s_vh
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        visited = 0
        m0 = lo + n_full * BLOCK_N
        acc, l_i, m_i, visited = _attend_keys(
            acc, l_i, m_i, visited, q, k_base, v_base, s_kt, s_vt, lo, m0, hi, row_lo, row_hi,
            qk_scale, d, kd, vd, kv_head * HEAD_DIM, MODE, False, BLOCK_N, ACC_IN_DOT,
            DOT_PRECISION, TMA, STATS)
        # Masked keys: whole steps up to the tile's last row, then, when the last row's
        # segment runs on past it by at most TAIL_N keys (bidirectional segments: items of a
        # few tokens), those keys in one TAIL_N-key step instead of one more BLOCK_N-key step.
        short_tail = hi - q1 <= TAIL_N
        main_hi = tl.where(short_tail, tl.maximum(q1, m0), hi)
        main_end = m0 + tl.cdiv(main_hi - m0, BLOCK_N) * BLOCK_N
        acc, l_i, m_i, visited = _attend_keys(
            acc, l_i, m_i, visited, q, k_base, v_base, s_kt, s_vt, m0, main_end, hi, row_lo,
            row_hi, qk_scale, d, kd, vd, kv_head * HEAD_DIM, MODE, True, BLOCK_N, ACC_IN_DOT,
            DOT_PRECISION, TMA, STATS)
        acc, l_i, m_i, visited = _attend_keys(
            acc, l_i, m_i, visited, q, k_base, v_base, s_kt, s_vt, main_end, hi, hi, row_lo,
            row_hi, qk_scale, d, kd, vd, kv_head * HEAD_DIM, MODE, True, TAIL_N, ACC_IN_DOT,
            DOT_PRECISION, TMA, STATS)
        # Real rows hold at least their own key (l_i >= 1); the floor only quiets padded rows.
        out = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        tl.store(o_ptr + rows[:, None] * s_ot + head * s_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
        if STATS:
            tl.store(stats_ptr + tile * num_heads + head, visited)


def _check_inputs(q, k, v, cu_seqlens, segment_ids, mode, scale,
                  devices: bool = True) -> tuple[MaskMode, float]:
    """Shape/dtype/stride (and, unless tracing, device) checks; returns (mode, scale)."""
    c.check_rank(_OP, "q", q, 3, "[T, Hq, D]")
    c.check_rank(_OP, "k", k, 3, "[T, Hkv, D]")
    c.check_rank(_OP, "v", v, 3, "[T, Hkv, D]")
    c.check_rank(_OP, "cu_seqlens", cu_seqlens, 1, "[B+1]")
    c.check_rank(_OP, "segment_ids", segment_ids, 1, "[T]")
    total, hq, dim = q.shape
    hkv = k.shape[1]
    c.check_head_dim(_OP, dim)
    c.check_dim(_OP, "k", k, 0, total, "T, as q")
    c.check_dim(_OP, "k", k, 2, dim, "head_dim, as q")
    c.check_same_shape(_OP, "v", v, "k", k, "[T, Hkv, D]")
    require(hkv >= 1 and hq % hkv == 0, InvalidInputError,
            f"{_OP}: q heads ({hq}) must be a multiple of k heads ({hkv})")
    c.require_size(cu_seqlens.shape[0] >= 2, f"{_OP}: cu_seqlens must hold B+1 >= 2 offsets, "
                   f"got shape {tuple(cu_seqlens.shape)}")
    c.check_dim(_OP, "segment_ids", segment_ids, 0, total, "T, as q")
    tensors = {"q": q, "k": k, "v": v}
    c.check_float(_OP, tensors)
    c.check_last_dim_contiguous(_OP, tensors)
    c.check_int32_offsets(_OP, tensors)
    c.check_index(_OP, "cu_seqlens", cu_seqlens)
    c.check_index(_OP, "segment_ids", segment_ids, (torch.int32,))
    if devices:
        c.check_devices(_OP, {**tensors, "cu_seqlens": cu_seqlens, "segment_ids": segment_ids})
    try:
        mode = MaskMode(mode)
    except ValueError:
        raise InvalidInputError(f"{_OP}: mode must be one of {[m.value for m in MaskMode]}, "
                                f"got {mode!r}") from None
    return mode, c.resolve_scale(_OP, scale, dim)


# Head dim -> tile, from the tile sweeps (item-level causal, batches of 1 to 16 long prompts;
# ``docs/performance.md``). Since the masks come from per-row windows, one tile serves every
# batch and length: d64 64 x 64 with registers capped at 128, so that four programs share a
# multiprocessor (faster than uncapped, and ahead of the earlier 128-row and 128-key tiles);
# d128 64 x 64 loading whole key tiles through TMA descriptors (faster than pointer loads).
# fp32 inputs take FP32_TILE: pointer loads and no register cap (fp32 tiles take twice the
# shared memory and registers; the GPU grid tests run fp32 on it).
PREFILL_TILES = {
    64: PrefillConfig(64, 64, 4, 3, maxnreg=128),
    128: PrefillConfig(64, 64, 4, 3, tma=True),
}
FP32_TILE = PrefillConfig(64, 64, 4, 3)


def prefill_config_for(head_dim: int, element_size: int = 2) -> PrefillConfig:
    """The tile for a head size and the input's bytes per element (shapes alone, so the choice
    traces and captures); small tiles under the interpreter, to exercise many tiles."""
    if c.interpreting():
        return PrefillConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
    if element_size > 2:
        return FP32_TILE
    return PREFILL_TILES.get(head_dim, PREFILL_TILES[128])


def lpt_chunk(batch: int, total: int, num_kv_heads: int, head_dim: int, element_size: int,
              device: torch.device) -> tuple[int, int]:
    """(requests, KV heads) of one chunk of the longest-first order of equal-length batches.

    Tiles run longest-first within a chunk, chunk after chunk; a chunk's keys and values stay
    under a third of the L2 cache, so that the programs running at once (the long tiles of every
    request and head of the chunk) read them from L2 instead of memory. All requests, and as
    many KV heads as fit, when the whole batch of one head fits; else one KV head and as many
    requests as fit. Divisors of the batch and the KV heads, so chunks are whole."""
    budget = c.l2_bytes(device) // 3
    length = total // max(batch, 1)
    one = max(1, length * head_dim * 2 * element_size)  # keys and values of a request and head
    if batch * one <= budget:
        fit = budget // (batch * one)
        return batch, max(h for h in range(1, num_kv_heads + 1)
                          if num_kv_heads % h == 0 and h <= fit)
    fit = max(1, budget // one)
    return max(r for r in range(1, batch + 1) if batch % r == 0 and r <= fit), 1


def launch_prefill(q, k, v, cu_seqlens, segment_ids, mode: MaskMode, scale: float,
                   config: PrefillConfig, stats: torch.Tensor | None = None,
                   out: torch.Tensor | None = None,
                   chunk: tuple[int, int] | None = None) -> torch.Tensor:
    """Runs the kernel with an explicit ``config`` (inputs already checked).

    ``out`` (caller-owned, like q) receives the result when given.
    ``stats``, when given, is an int32 ``[T // block_m + B, Hq]`` buffer that receives the
    number of key tiles each (virtual query tile, head) program visited.
    ``chunk``: (requests, KV heads) of the longest-first chunks of an equal-length batch
    instead of ``lpt_chunk``'s; a request count that does not divide the batch keeps the
    ragged order.
    """
    total, hq, dim = q.shape
    batch = cu_seqlens.shape[0] - 1
    out = torch.empty_like(q) if out is None else out
    if isinstance(out.numel(), int) and out.numel() == 0:
        return out
    num_tiles = total // config.block_m + batch
    want_stats = stats is not None
    if not want_stats:
        # Unused then, but distinct from ``out``: traced as a functional kernel call,
        # arguments that alias one tensor would be cloned apart.
        stats = torch.empty(1, device=q.device, dtype=torch.int32)
    tma = config.tma and c.tma_ready(k, v)
    kd, vd = (c.kv_descriptors(k, v, config.block_n) if tma else (k, v))
    chunk_requests, chunk_kv_heads = chunk or lpt_chunk(
        c.size_hint(batch), c.size_hint(total), k.shape[1], dim, k.element_size(), q.device)
    wrap_triton(_prefill_kernel)[(num_tiles * hq,)](
        q, k, v, out, cu_seqlens, segment_ids, stats, kd, vd,
        scale * _LOG2E, batch, num_tiles, hq, chunk_requests, chunk_kv_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        GROUP=hq // k.shape[1], HEAD_DIM=dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        TAIL_N=min(16, config.block_n),
        BLOCK_B=min(64, max(2, triton.next_power_of_2(c.size_hint(batch) + 1))),
        MODE=MODE_CODES[mode], STATS=want_stats, ACC_IN_DOT=config.acc_in_dot,
        DOT_PRECISION=c.dot_precision(q.dtype), TMA=tma,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **c.register_cap(config.maxnreg, q))
    return out


def _run(q, k, v, cu_seqlens, segment_ids, mode, scale) -> torch.Tensor:
    """Checks, the config from shapes, the launch."""
    mode, scale = _check_inputs(q, k, v, cu_seqlens, segment_ids, mode, scale)
    config = prefill_config_for(q.shape[2], q.element_size())
    with c.on_device(q.device):
        return launch_prefill(q, k, v, cu_seqlens, segment_ids, mode, scale, config)


@triton_op("xgr::prefill_attention", mutates_args=())
def _prefill_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cu_seqlens: torch.Tensor, segment_ids: torch.Tensor,
                          mode: str = MaskMode.ITEM_CAUSAL.value,
                          scale: float | None = None) -> torch.Tensor:
    # torch.library.triton_op: also the fake (under tracing the wrapped launch records the
    # kernel instead of running), so AOTInductor compiles the kernel into its package.
    if c.interpreting():
        return torch.ops.xgr.prefill_attention_interpreted(q, k, v, cu_seqlens, segment_ids,
                                                           mode, scale)
    return _run(q, k, v, cu_seqlens, segment_ids, mode, scale)


@torch.library.custom_op("xgr::prefill_attention_interpreted", mutates_args=())
def _prefill_interpreted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens: torch.Tensor, segment_ids: torch.Tensor,
                         mode: str = MaskMode.ITEM_CAUSAL.value,
                         scale: float | None = None) -> torch.Tensor:
    """The op under ``TRITON_INTERPRET=1`` (CPU): interpreted kernels cannot be traced
    (``wrap_triton`` hands them back raw), so traced graphs call this opaque op instead."""
    return _run(q, k, v, cu_seqlens, segment_ids, mode, scale)


@_prefill_interpreted.register_fake
def _(q, k, v, cu_seqlens, segment_ids, mode=MaskMode.ITEM_CAUSAL.value, scale=None):
    _check_inputs(q, k, v, cu_seqlens, segment_ids, mode, scale)
    return torch.empty_like(q)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cu_seqlens: torch.Tensor, segment_ids: torch.Tensor,
                      mode: MaskMode = MaskMode.ITEM_CAUSAL,
                      scale: float | None = None) -> torch.Tensor:
    """Masked attention of each packed request over itself (Triton; the reference's result).

    q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]`` with ``Hq % Hkv == 0``; cu_seqlens: ``[B+1]``
    int32/int64 with ``cu_seqlens[0] == 0``, non-decreasing, ``cu_seqlens[-1] == T``;
    segment_ids: ``[T]`` int32, contiguous and non-decreasing inside each request (the layout of
    ``xgr_common.layout``; the tile skipping relies on it, values are not read on the host).
    fp16/bf16/fp32, last axis contiguous, one CUDA device. Returns ``[T, Hq, D]`` in q.dtype.
    """
    mode_value = mode.value if isinstance(mode, MaskMode) else mode
    return torch.ops.xgr.prefill_attention(q, k, v, cu_seqlens, segment_ids, mode_value, scale)
