"""The key-tile steps shared by the attention kernels (FlashAttention-2, base 2).

``@triton.jit`` functions, inlined by Triton into each caller, so the decode and prefill
kernels load a tile of keys and values, score it, and fold the scores into their running
(max, sum, acc) state the same way; each kernel applies its own mask in between.
"""

from __future__ import annotations

import triton
import triton.language as tl


def page_stages(num_stages: int, override: int | None = None) -> int:
    """The pipeline depth of ``attend_cached_pages``'s whole-tile loop in a kernel compiled
    with ``num_stages``: the pipeliner gives the page-index load and the tile's load a share
    each, so twice the kernel's depth less one keeps the tiles ``num_stages - 1`` steps
    ahead, as the kernel's unpaged loops are. ``override``: an explicit depth (tiling
    sweeps)."""
    return override if override is not None else max(1, 2 * num_stages - 1)


@triton.jit
def online_softmax_step(acc, l_i, m_i, s, v, qk_scale, ACC_IN_DOT: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """Fold one tile into the state: s ``[M, N]`` unscaled scores (-inf where masked),
    v ``[N, D]``, acc ``[M, D]`` / l_i, m_i ``[M]`` float32 with m_i in base-2 scaled units.
    Scores stay unscaled until one fused multiply-subtract: exp2(s * scale - m)."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if ACC_IN_DOT:  # accumulate in the product's own registers (no separate [M, D] add)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    else:  # a fresh product, free to overlap the rescale of acc
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def score_key_tile(q, k_base, v_base, k_desc, v_desc, k0, kpos, col, s_kt, s_vt, d, hi,
                   MASKED: tl.constexpr, TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Unscaled scores ``q @ k.T`` ``[M, N]`` and the values ``[N, D]`` of the key rows
    ``kpos = k0 + [0, N)``. A whole tile (not MASKED) loads through the tensor-memory-access
    descriptors k_desc, v_desc over the ``[T, Hkv * D]`` keys and values (columns
    ``col..col+D``: one KV head) when TMA; otherwise pointer loads from k_base, v_base (row
    strides s_kt, s_vt; columns d). With MASKED, rows at or past ``hi`` read as zeros: the
    caller masks their scores."""
    if TMA and not MASKED:
        k = k_desc.load([k0, col])
        v = v_desc.load([k0, col])
    elif MASKED:
        k_ok = kpos < hi
        k = tl.load(k_base + kpos[:, None] * s_kt + d[None, :], mask=k_ok[:, None], other=0.0)
        v = tl.load(v_base + kpos[:, None] * s_vt + d[None, :], mask=k_ok[:, None], other=0.0)
    else:
        k = tl.load(k_base + kpos[:, None] * s_kt + d[None, :])
        v = tl.load(v_base + kpos[:, None] * s_vt + d[None, :])
    return tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), v


@triton.jit
def load_paged_tile(pk_head, pv_head, s_pkp, s_pkt, s_pvp, s_pvt, table_row, kpos, ok, d,
                    PAGE: tl.constexpr, MASKED: tl.constexpr = True):
    """Keys and values ``[N, D]`` of a request's cached token positions ``kpos`` from the
    prompt cache's pages: position p lies at slot ``p % PAGE`` of page ``table_row[p // PAGE]``
    (one gathered page index per key row; a tile spans whole pages when N is a multiple of
    PAGE). With MASKED, rows where ``ok`` is false read as zeros; without it every row is a
    cached token (``ok`` unused) and the loads carry no mask. Page offsets in int64: a
    layer's pool can pass 2**31 elements."""
    if MASKED:
        page = tl.load(table_row + kpos // PAGE, mask=ok, other=0).to(tl.int64)
    else:
        page = tl.load(table_row + kpos // PAGE).to(tl.int64)
    slot = (kpos % PAGE).to(tl.int64)
    k_rows = pk_head + (page * s_pkp + slot * s_pkt)[:, None] + d[None, :]
    v_rows = pv_head + (page * s_pvp + slot * s_pvt)[:, None] + d[None, :]
    if MASKED:
        k = tl.load(k_rows, mask=ok[:, None], other=0.0)
        v = tl.load(v_rows, mask=ok[:, None], other=0.0)
    else:
        k = tl.load(k_rows)
        v = tl.load(v_rows)
    return k, v


@triton.jit
def load_page_tile(pk_head, pv_head, pkd, pvd, s_pkp, s_pkt, s_pvp, s_pvt, table_row, k0, n,
                   d, col, PAGE: tl.constexpr, TMA: tl.constexpr):
    """Keys and values ``[N, D]`` of the whole cached tile ``k0 + [0, N)`` when it lies inside
    one page (N divides PAGE, k0 a multiple of N): one page index for the tile, contiguous
    rows. With TMA, through the descriptors pkd, pvd over the layer's pool as
    ``[pages * PAGE, Hkv * D]`` (columns ``col..col+D``: one KV head); otherwise pointer
    loads."""
    page = tl.load(table_row + k0 // PAGE).to(tl.int64)
    if TMA:
        row = (page * PAGE + k0 % PAGE).to(tl.int32)
        k = pkd.load([row, col])
        v = pvd.load([row, col])
    else:
        # The page's base in one int64 scalar offset; the tile's rows within it in int32
        # (a page is far below 2**31 elements), so the [N, D] offsets cost no 64-bit math.
        slot = k0 % PAGE + n
        k = tl.load((pk_head + page * s_pkp) + (slot[:, None] * s_pkt + d[None, :]))
        v = tl.load((pv_head + page * s_pvp) + (slot[:, None] * s_pvt + d[None, :]))
    return k, v


@triton.jit
def attend_cached_pages(acc, l_i, m_i, q, pk_head, pv_head, pkd, pvd, s_pkp, s_pkt, s_pvp,
                        s_pvt, table_row, lo, hi, n, d, col, qk_scale, PAGE: tl.constexpr,
                        BLOCK_N: tl.constexpr, TMA: tl.constexpr, ACC_IN_DOT: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, STAGES: tl.constexpr):
    """Fold a request's cached keys ``[lo, hi)`` (lo a multiple of BLOCK_N; every query of
    the tile sees every one) into the online-softmax state: whole tiles without a mask, one
    page index a tile when a page holds whole tiles (through TMA when the launcher made
    descriptors), one a row otherwise; then a masked ragged tail.

    STAGES: the whole-tile loop's pipeline depth (``page_stages``). The page index is a load
    that the tile's load waits on, so Triton's pipeliner splits the depth between the two:
    the kernel's own depth would leave the tile's keys fetched only one step ahead."""
    whole = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
    for k0 in tl.range(lo, whole, BLOCK_N, num_stages=STAGES):
        if PAGE % BLOCK_N == 0:
            k, v = load_page_tile(pk_head, pv_head, pkd, pvd, s_pkp, s_pkt, s_pvp, s_pvt,
                                  table_row, k0, n, d, col, PAGE, TMA)
        else:
            k, v = load_paged_tile(pk_head, pv_head, s_pkp, s_pkt, s_pvp, s_pvt, table_row,
                                   k0 + n, n, d, PAGE, MASKED=False)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, ACC_IN_DOT,
                                            DOT_PRECISION)
    if whole < hi:
        kpos = whole + n
        k_ok = kpos < hi
        k, v = load_paged_tile(pk_head, pv_head, s_pkp, s_pkt, s_pvp, s_pvt, table_row, kpos,
                               k_ok, d, PAGE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = tl.where(k_ok[None, :], s, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, ACC_IN_DOT,
                                            DOT_PRECISION)
    return acc, l_i, m_i
