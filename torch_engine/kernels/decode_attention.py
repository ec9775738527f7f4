"""xAttention decode in Triton: W beams share one prompt KV, then each adds its own few tokens.

Same function as ``torch_engine.reference.decode_attention``. For each request and KV head the
W beams x G query heads form one ``[W*G, D]`` query tile, so the shared prompt is read once per
tile and attended with matrix products (``tl.dot``) instead of W vector products. Stages:

1. shared stage: the prompt KV of the request, online softmax (FlashAttention-2) over
   ``BLOCK_N``-key tiles; when ``B * Hkv`` tiles cannot fill the GPU the prompt is split into
   ``splits`` equal chunks, one program each (split-K / flash-decoding);
2. own stage (split 0 only): each row's own ``num_own`` beam tokens, as one small product of
   the tile against the own keys of the <= OWN_BEAMS beams the tile touches (keeping each
   row's own-beam column), folded into the same running (max, sum, acc) state: the
   log-sum-exp merge with the shared stage, done in registers in float32;
3. merge (only when ``splits > 1``): the per-split partial outputs and log-sum-exps combine in
   float32. With ``splits == 1`` stage 3 disappears and the whole step is one launch.

Registered as ``xgr::decode_attention`` with ``torch.library.triton_op``: ``torch.export``
keeps the op in the graph, AOTInductor compiles its Triton kernels into the package (no
Python at serving time), and the launch path is traceable (config and grid from shapes only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from xgr_common.errors import InvalidInputError, require
from torch_engine.kernels import _common as c
from torch_engine.kernels.decode_tiling import DecodeConfig, decode_config_for, own_beams
from torch_engine.kernels._online_softmax import (attend_cached_pages, online_softmax_step,
                                                   page_stages, score_key_tile)

_OP = "decode_attention"
_LOG2E = 1.4426950408889634
_MAX_GRID_Y = 65535


@dataclass(frozen=True)
class PagedPrefix:
    """Cached prompt tokens that come before each request's packed prompt KV: the prompt
    cache's pages ``pool_k, pool_v [pages, page_tokens, Hkv, D]`` (page_tokens a power of
    two), request b's first ``cached_lens[b]`` tokens on pages ``block_table[b, :]``
    (``[B, P]`` int32). Checked by ``kernels.paged_attention``'s launchers."""

    pool_k: torch.Tensor
    pool_v: torch.Tensor
    block_table: torch.Tensor
    cached_lens: torch.Tensor

    @property
    def page_tokens(self) -> int:
        return self.pool_k.shape[1]


@triton.jit
def _shared_tile(acc, l_i, m_i, q, sk_ptr, sv_ptr, s_kt, s_vt, k0, hi, d, qk_scale, kd, vd, col,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr, ACC_IN_DOT: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, TMA: tl.constexpr):
    """The key tile from ``k0`` as one step of FlashAttention-2's online softmax; the key mask
    only when MASKED. A whole tile (not MASKED) loads through the descriptors kd, vd when TMA.
    Scores stay unscaled until one fused multiply-subtract: exp2(s * scale - m)."""
    kpos = k0 + tl.arange(0, BLOCK_N)
    s, v = score_key_tile(q, sk_ptr, sv_ptr, kd, vd, k0, kpos, col, s_kt, s_vt, d, hi, MASKED,
                          TMA, DOT_PRECISION)
    if MASKED:
        s = tl.where((kpos < hi)[None, :], s, float("-inf"))
    return online_softmax_step(acc, l_i, m_i, s, v, qk_scale, ACC_IN_DOT, DOT_PRECISION)


@triton.jit
def _merge_rows(part_o_ptr, part_lse_ptr, base, stride_split, row_ok, d,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
                CACHE: tl.constexpr):
    """out = sum_s 2^(lse_s - lse) * out_s with lse = log2 sum_s 2^lse_s, in fp32."""
    lse_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        lse_max = tl.maximum(lse_max, tl.load(part_lse_ptr + base + s * stride_split,
                                              mask=row_ok, other=0.0, cache_modifier=CACHE))
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for s in tl.static_range(SPLITS):
        part = base + s * stride_split
        weight = tl.exp2(tl.load(part_lse_ptr + part, mask=row_ok, other=0.0,
                                 cache_modifier=CACHE) - lse_max)
        o = tl.load(part_o_ptr + part[:, None] * HEAD_DIM + d[None, :],
                    mask=row_ok[:, None], other=0.0, cache_modifier=CACHE).to(tl.float32)
        total += weight
        acc += weight[:, None] * o
    return acc / total[:, None]


@triton.jit
def _decode_partial_kernel(
        q_ptr, sk_ptr, sv_ptr, cu_ptr, len_ptr, bk_ptr, bv_ptr, out_ptr, part_o_ptr,
        part_lse_ptr, count_ptr, kd, vd, num_own, qk_scale, width, num_kv_heads,
        s_qb, s_qw, s_qh, s_skt, s_skh, s_svt, s_svh,
        s_bkb, s_bkw, s_bks, s_bkh, s_bvb, s_bvw, s_bvs, s_bvh,
        s_ob, s_ow, s_oh,
        cached_ptr, table_ptr, pk_ptr, pv_ptr, pkd, pvd, s_tb, s_pkp, s_pkt, s_pkh, s_pvp,
        s_pvt, s_pvh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, OWN_BEAMS: tl.constexpr,
        FUSED_MERGE: tl.constexpr, ACC_IN_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        TMA: tl.constexpr, LENS: tl.constexpr, PAGED: tl.constexpr,
        PAGE: tl.constexpr, PAGE_TMA: tl.constexpr, PAGE_STAGES: tl.constexpr):
    qk_scale = tl.cast(qk_scale, tl.float32)  # a float64 scalar when Inductor launches it
    # Row tiles vary fastest: the tiles of one (request, KV head) run side by side and read its
    # prompt KV from L2 once, instead of once per row tile when the KV outgrows L2.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    split = tl.program_id(2)
    b = pid_bh // num_kv_heads
    h = pid_bh % num_kv_heads
    # Row r of the tile is beam r // GROUP, query head h * GROUP + r % GROUP.
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < width * GROUP
    beam = rows // GROUP
    head = h * GROUP + rows % GROUP
    d = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + b * s_qb + beam * s_qw + head * s_qh
    q = tl.load(q_rows[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)

    # Stage 1: this split's block-aligned chunk of the request's prompt; unpaged, whole key
    # tiles run unmasked and only a ragged last tile applies the key mask.
    start = tl.load(cu_ptr + b).to(tl.int32)
    if LENS:
        # Request-major packing: the request's tokens, not its padding tail, end the prompt.
        end = start + tl.load(len_ptr + b).to(tl.int32)
    else:
        end = tl.load(cu_ptr + b + 1).to(tl.int32)
    # A finite floor instead of -inf keeps exp2(m_old - m_new) defined when a tile is all masked.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    sk_head = sk_ptr + h * s_skh
    sv_head = sv_ptr + h * s_svh
    if PAGED:
        # The request's keys are its cached tokens (the prompt cache's pages), then its packed
        # prompt: one logical sequence, split into block-aligned chunks as below.
        cached = tl.load(cached_ptr + b).to(tl.int32)
        n_keys = cached + (end - start)
        chunk = tl.cdiv(tl.cdiv(n_keys, SPLITS), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(n_keys, lo + chunk)
        # The split's cached keys [lo, mid) from the pages alone, then its suffix keys
        # [mid, hi) as whole packed-prompt tiles: no tile loads both and selects.
        mid = tl.minimum(hi, tl.maximum(cached, lo))
        acc, l_i, m_i = attend_cached_pages(
            acc, l_i, m_i, q, pk_ptr + h * s_pkh, pv_ptr + h * s_pvh, pkd, pvd, s_pkp, s_pkt,
            s_pvp, s_pvt, table_ptr + b * s_tb, lo, mid, tl.arange(0, BLOCK_N), d,
            h * HEAD_DIM, qk_scale, PAGE, BLOCK_N, PAGE_TMA, ACC_IN_DOT, DOT_PRECISION,
            PAGE_STAGES)
        row_lo = start + mid - cached
        row_hi = start + hi - cached
        row_full = row_lo + tl.maximum(row_hi - row_lo, 0) // BLOCK_N * BLOCK_N
        for k0 in range(row_lo, row_full, BLOCK_N):
            acc, l_i, m_i = _shared_tile(acc, l_i, m_i, q, sk_head, sv_head, s_skt, s_svt, k0,
                                         row_hi, d, qk_scale, kd, vd, h * HEAD_DIM, BLOCK_N,
                                         False, ACC_IN_DOT, DOT_PRECISION, TMA)
        if row_full < row_hi:
            acc, l_i, m_i = _shared_tile(acc, l_i, m_i, q, sk_head, sv_head, s_skt, s_svt,
                                         row_full, row_hi, d, qk_scale, kd, vd, h * HEAD_DIM,
                                         BLOCK_N, True, ACC_IN_DOT, DOT_PRECISION, TMA)
    else:
        chunk = tl.cdiv(tl.cdiv(end - start, SPLITS), BLOCK_N) * BLOCK_N
        lo = start + split * chunk
        hi = tl.minimum(end, lo + chunk)
        full_hi = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
        for k0 in range(lo, full_hi, BLOCK_N):
            acc, l_i, m_i = _shared_tile(acc, l_i, m_i, q, sk_head, sv_head, s_skt, s_svt, k0,
                                         hi, d, qk_scale, kd, vd, h * HEAD_DIM, BLOCK_N, False,
                                         ACC_IN_DOT, DOT_PRECISION, TMA)
        if full_hi < hi:
            acc, l_i, m_i = _shared_tile(acc, l_i, m_i, q, sk_head, sv_head, s_skt, s_svt,
                                         full_hi, hi, d, qk_scale, kd, vd, h * HEAD_DIM,
                                         BLOCK_N, True, ACC_IN_DOT, DOT_PRECISION, TMA)

    # Stage 2 (split 0): each row's own beam tokens. The tile's rows touch OWN_BEAMS beams;
    # one small product against those beams' own keys, keeping each row's own-beam column,
    # stays on the tensor cores instead of [BLOCK_M, D] fp32 vector products.
    if split == 0:
        beam0 = (pid_m * BLOCK_M) // GROUP
        nb = tl.arange(0, OWN_BEAMS)
        own_beam = beam0 + nb
        own_ok = (own_beam < width)[:, None]
        mine = (beam - beam0)[:, None] == nb[None, :]                    # [BLOCK_M, OWN_BEAMS]
        # In int64: a layer's view of a beam-major cache (``kv_cache.BeamKV``) spans every
        # layer's slots, which can pass 2**31 elements at large batches and beam widths.
        b64 = b.to(tl.int64)
        beam64 = own_beam[:, None].to(tl.int64)
        k_own_base = bk_ptr + b64 * s_bkb + beam64 * s_bkw + h * s_bkh + d[None, :]
        v_own_base = bv_ptr + b64 * s_bvb + beam64 * s_bvw + h * s_bvh + d[None, :]
        for j in range(0, num_own):
            k_own = tl.load(k_own_base + j * s_bks, mask=own_ok, other=0.0)
            s_all = tl.dot(q, tl.trans(k_own), input_precision=DOT_PRECISION) * qk_scale
            s_own = tl.sum(tl.where(mine, s_all, 0.0), 1)
            m_new = tl.maximum(m_i, s_own)
            alpha = tl.exp2(m_i - m_new)
            p_own = tl.exp2(s_own - m_new)
            l_i = l_i * alpha + p_own
            v_own = tl.load(v_own_base + j * s_bvs, mask=own_ok, other=0.0)
            p_sel = tl.where(mine, p_own[:, None], 0.0).to(v_own.dtype)
            acc = tl.dot(p_sel, v_own, acc * alpha[:, None], input_precision=DOT_PRECISION)
            m_i = m_new

    o_rows = out_ptr + b * s_ob + beam * s_ow + head * s_oh
    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
    else:
        # Partial state of this split: normalised output and log2-sum-exp (-inf when empty).
        part = (pid_bh * SPLITS + split) * width * GROUP + rows
        out = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + d[None, :],
                 out.to(part_o_ptr.dtype.element_ty), mask=row_ok[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1.0e-30)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_ok)
        if FUSED_MERGE:
            # Stage 3 in the split that finishes last (no merge launch): the barrier orders
            # every thread's partial stores before the release of the counter increment; the
            # last program acquires them all and reads them past L1 (.cg).
            tl.debug_barrier()
            tile = pid_bh * tl.num_programs(0) + pid_m
            done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if done == SPLITS - 1:
                tl.debug_barrier()
                base = pid_bh * SPLITS * width * GROUP + rows
                merged = _merge_rows(part_o_ptr, part_lse_ptr, base, width * GROUP, row_ok, d,
                                     BLOCK_M, HEAD_DIM, SPLITS, ".cg")
                tl.store(o_rows[:, None] + d[None, :], merged.to(out_ptr.dtype.element_ty),
                         mask=row_ok[:, None])
                # Every split has counted: the counter goes back to zero, so the next launch
                # may reuse it without a fill (``merge_counters``).
                tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def _decode_merge_kernel(
        part_o_ptr, part_lse_ptr, out_ptr, width, num_kv_heads, s_ob, s_ow, s_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        SPLITS: tl.constexpr):
    # Stage 3 as its own launch: combine the splits' partial states.
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = pid_bh // num_kv_heads
    h = pid_bh % num_kv_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < width * GROUP
    d = tl.arange(0, HEAD_DIM)
    base = pid_bh * SPLITS * width * GROUP + rows
    merged = _merge_rows(part_o_ptr, part_lse_ptr, base, width * GROUP, row_ok, d, BLOCK_M,
                         HEAD_DIM, SPLITS, "")
    beam = rows // GROUP
    head = h * GROUP + rows % GROUP
    o_rows = out_ptr + b * s_ob + beam * s_ow + head * s_oh
    tl.store(o_rows[:, None] + d[None, :], merged.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def _check_inputs(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale,
                  seq_lens=None, devices: bool = True) -> float:
    """Shape/dtype/stride (and, unless tracing, device) checks; returns the softmax scale."""
    c.check_rank(_OP, "q", q, 4, "[B, W, Hq, D]")
    c.check_rank(_OP, "shared_k", shared_k, 3, "[T, Hkv, D]")
    c.check_rank(_OP, "shared_v", shared_v, 3, "[T, Hkv, D]")
    c.check_rank(_OP, "cu_seqlens", cu_seqlens, 1, "[B+1]")
    c.check_rank(_OP, "beam_k", beam_k, 5, "[B, W, S, Hkv, D]")
    c.check_rank(_OP, "beam_v", beam_v, 5, "[B, W, S, Hkv, D]")
    batch, width, hq, dim = q.shape
    total, hkv = shared_k.shape[:2]
    c.check_head_dim(_OP, dim)
    require(hkv >= 1 and hq % hkv == 0, InvalidInputError,
            f"{_OP}: q heads ({hq}) must be a multiple of shared_k heads ({hkv})")
    c.check_same_shape(_OP, "shared_v", shared_v, "shared_k", shared_k, "[T, Hkv, D]")
    c.check_dim(_OP, "shared_k", shared_k, 2, dim, "head_dim, as q")
    c.check_dim(_OP, "cu_seqlens", cu_seqlens, 0, batch + 1, "B+1, as q")
    expected_beam = (batch, width, beam_k.shape[2], hkv, dim)
    for name, tensor in (("beam_k", beam_k), ("beam_v", beam_v)):
        for got, want in zip(tensor.shape, expected_beam):
            c.require_size(got == want, f"{_OP}: {name} must have shape [B, W, S, Hkv, D] = "
                           f"{expected_beam}, got {tuple(tensor.shape)}")
    # One program row per (request, KV head): CUDA allows 65535 along the grid's second axis.
    c.require_size(batch * hkv <= _MAX_GRID_Y, f"{_OP}: batch x KV heads must be at most "
                   f"{_MAX_GRID_Y}, got {batch} x {hkv}")
    require(isinstance(num_own, int) and 0 <= num_own <= beam_k.shape[2], InvalidInputError,
            f"{_OP}: num_own must be an int in [0, S={beam_k.shape[2]}], got {num_own!r}")
    tensors = {"q": q, "shared_k": shared_k, "shared_v": shared_v, "beam_k": beam_k,
               "beam_v": beam_v}
    c.check_float(_OP, tensors)
    c.check_last_dim_contiguous(_OP, tensors)
    # The beam KV is indexed in int64 (see the own stage), the rest in int32.
    c.check_int32_offsets(_OP, {"q": q, "shared_k": shared_k, "shared_v": shared_v})
    c.check_index(_OP, "cu_seqlens", cu_seqlens)
    index = {"cu_seqlens": cu_seqlens}
    if seq_lens is not None:
        c.check_rank(_OP, "seq_lens", seq_lens, 1, "[B]")
        c.check_dim(_OP, "seq_lens", seq_lens, 0, batch, "B, as q")
        c.check_index(_OP, "seq_lens", seq_lens)
        index["seq_lens"] = seq_lens
    if devices:
        c.check_devices(_OP, {**tensors, **index})
    return c.resolve_scale(_OP, scale, dim)


def _counters_for(counters: torch.Tensor | None, tiles: int, device: torch.device
                  ) -> torch.Tensor:
    """The caller's zeroed counters (checked), or a fresh zeroed buffer."""
    if counters is None:
        return torch.zeros(tiles, device=device, dtype=torch.int32)
    require(counters.dtype == torch.int32 and counters.dim() == 1 and counters.is_contiguous(),
            InvalidInputError,
            f"{_OP}: counters must be a contiguous 1-D int32 tensor, got dtype "
            f"{counters.dtype} and shape {tuple(counters.shape)}")
    require(counters.numel() >= tiles, InvalidInputError,
            f"{_OP}: counters must hold at least {tiles} entries (merge_counters), got "
            f"{counters.numel()}")
    require(counters.device == device, InvalidInputError,
            f"{_OP}: counters is on {counters.device} but q is on {device}")
    return counters


def launch_decode(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own: int,
                  scale: float, config: DecodeConfig,
                  out: torch.Tensor | None = None,
                  counters: torch.Tensor | None = None,
                  seq_lens: torch.Tensor | None = None,
                  paged: PagedPrefix | None = None) -> torch.Tensor:
    """Runs the kernels with an explicit ``config`` (inputs already checked); ``out``
    (caller-owned, like q) receives the result when given; ``counters``: zeroed int32 split
    counters to use (and leave zeroed) instead of a fresh zeroed buffer, see
    ``decode_tiling.merge_counters``; ``seq_lens``: see ``decode_attention``; ``paged``:
    cached tokens read before each request's prompt (whole tiles through TMA when
    ``config.tma`` and a page holds whole tiles)."""
    batch, width, hq, dim = q.shape
    hkv = shared_k.shape[1]
    group = hq // hkv
    out = torch.empty_like(q) if out is None else out
    if isinstance(out.numel(), int) and out.numel() == 0:
        return out
    rows = width * group
    grid = (triton.cdiv(rows, config.block_m), batch * hkv, config.splits)
    if config.splits > 1:
        # Partial outputs in the input's 16-bit type halve the merge's traffic (it dominates at
        # batch 1); fp32 inputs keep fp32 partials. The log-sum-exps stay fp32.
        part_o = torch.empty((batch * hkv, config.splits, rows, dim), device=q.device,
                             dtype=q.dtype)
        part_lse = torch.empty((batch * hkv, config.splits, rows), device=q.device,
                               dtype=torch.float32)
    else:
        # Unused by the one-launch variant, but distinct from ``out``: traced as a functional
        # kernel call, arguments that alias one tensor would be cloned apart.
        part_o = torch.empty(1, device=q.device, dtype=q.dtype)
        part_lse = torch.empty(1, device=q.device, dtype=torch.float32)
    fused = config.fused_merge and config.splits > 1
    # Finished-split counters of the fused merge, one per row tile, zero at the start.
    count = (_counters_for(counters, grid[0] * grid[1], q.device) if fused
             else torch.empty(1, device=q.device, dtype=torch.int32))
    tma = config.tma and c.tma_ready(shared_k, shared_v)
    kd, vd = (c.kv_descriptors(shared_k, shared_v, config.block_n) if tma
              else (shared_k, shared_v))
    page_tma = False
    if paged is None:  # the page arguments are never read: inputs stand in for them
        page_args = (cu_seqlens, cu_seqlens, shared_k, shared_v, shared_k, shared_v) + (0,) * 7
        page = 16
    else:
        pk, pv, table = paged.pool_k, paged.pool_v, paged.block_table
        pkd, pvd = c.page_descriptors(pk, pv, config.block_n, config.tma)
        page_tma = pkd is not pk
        page_args = (paged.cached_lens, table, pk, pv, pkd, pvd, table.stride(0),
                     pk.stride(0), pk.stride(1), pk.stride(2), pv.stride(0), pv.stride(1),
                     pv.stride(2))
        page = paged.page_tokens
    wrap_triton(_decode_partial_kernel)[grid](
        q, shared_k, shared_v, cu_seqlens, cu_seqlens if seq_lens is None else seq_lens,
        beam_k, beam_v, out, part_o, part_lse, count, kd, vd, num_own, scale * _LOG2E, width, hkv,
        q.stride(0), q.stride(1), q.stride(2), shared_k.stride(0), shared_k.stride(1),
        shared_v.stride(0), shared_v.stride(1),
        beam_k.stride(0), beam_k.stride(1), beam_k.stride(2), beam_k.stride(3),
        beam_v.stride(0), beam_v.stride(1), beam_v.stride(2), beam_v.stride(3),
        out.stride(0), out.stride(1), out.stride(2),
        *page_args,
        GROUP=group, HEAD_DIM=dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        SPLITS=config.splits, OWN_BEAMS=own_beams(config.block_m, group), FUSED_MERGE=fused,
        ACC_IN_DOT=config.acc_in_dot,
        DOT_PRECISION=c.dot_precision(q.dtype), TMA=tma, LENS=seq_lens is not None,
        PAGED=paged is not None, PAGE=page, PAGE_TMA=page_tma,
        PAGE_STAGES=page_stages(config.num_stages, config.page_stages),
        num_warps=config.num_warps, num_stages=config.num_stages,
        **c.register_cap(config.maxnreg, q))
    if config.splits > 1 and not fused:
        merge_m = min(config.block_m, 64)
        wrap_triton(_decode_merge_kernel)[(batch * hkv, triton.cdiv(rows, merge_m))](
            part_o, part_lse, out, width, hkv, out.stride(0), out.stride(1), out.stride(2),
            GROUP=group, HEAD_DIM=dim, BLOCK_M=merge_m, SPLITS=config.splits, num_warps=4)
    return out


def _run(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale,
         counters: torch.Tensor | None = None,
         seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Checks, the config from shapes (example sizes when traced), the launch."""
    scale = _check_inputs(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale,
                          seq_lens)
    batch, width, hq, dim = q.shape
    hkv = shared_k.shape[1]
    config = decode_config_for(c.size_hint(batch), width, hq // hkv, hkv,
                               c.size_hint(shared_k.shape[0], 1024), dim, q.device)
    with c.on_device(q.device):
        return launch_decode(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale,
                             config, counters=counters, seq_lens=seq_lens)


@triton_op("xgr::decode_attention", mutates_args=())
def _decode_attention_op(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                         cu_seqlens: torch.Tensor, beam_k: torch.Tensor, beam_v: torch.Tensor,
                         num_own: int, scale: float | None = None,
                         seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    # torch.library.triton_op: also the fake (under tracing the wrapped launches record the
    # kernels instead of running), so AOTInductor compiles the kernels into its package.
    if c.interpreting():
        return torch.ops.xgr.decode_attention_interpreted(q, shared_k, shared_v, cu_seqlens,
                                                          beam_k, beam_v, num_own, scale,
                                                          seq_lens)
    return _run(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale,
                seq_lens=seq_lens)


@torch.library.custom_op("xgr::decode_attention_interpreted", mutates_args=())
def _decode_interpreted(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                        cu_seqlens: torch.Tensor, beam_k: torch.Tensor, beam_v: torch.Tensor,
                        num_own: int, scale: float | None = None,
                        seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """The op under ``TRITON_INTERPRET=1`` (CPU): interpreted kernels cannot be traced
    (``wrap_triton`` hands them back raw), so traced graphs call this opaque op instead."""
    return _run(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale,
                seq_lens=seq_lens)


@_decode_interpreted.register_fake
def _(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale=None, seq_lens=None):
    _check_inputs(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale, seq_lens)
    return torch.empty_like(q)


def decode_attention(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                     cu_seqlens: torch.Tensor, beam_k: torch.Tensor, beam_v: torch.Tensor,
                     num_own: int, scale: float | None = None,
                     seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step of W beams per request (Triton; the reference's signature and result).

    q: ``[B, W, Hq, D]``; shared_k, shared_v: ``[T, Hkv, D]`` packed prompt KV, request b at
    rows ``cu_seqlens[b]:cu_seqlens[b+1]``, or ``cu_seqlens[b]:cu_seqlens[b] + seq_lens[b]``
    when ``seq_lens`` (``[B]`` int32/int64) is given (request-major packing, padding between
    requests); cu_seqlens: ``[B+1]`` int32/int64, non-decreasing,
    ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] <= T`` (values are not read on the host);
    beam_k, beam_v: ``[B, W, S, Hkv, D]`` with the first ``num_own`` slots valid,
    ``0 <= num_own <= S`` (0: the prompt alone, e.g. a prompt's last token attending its whole
    prompt; every request then needs at least one prompt token). fp16/bf16/fp32, last axis
    contiguous, all on one CUDA device. Returns ``[B, W, Hq, D]`` in ``q.dtype``.
    """
    return torch.ops.xgr.decode_attention(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v,
                                          num_own, scale, seq_lens)


def decode_attention_counted(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                             cu_seqlens: torch.Tensor, beam_k: torch.Tensor,
                             beam_v: torch.Tensor, num_own: int, counters: torch.Tensor,
                             scale: float | None = None,
                             seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """``decode_attention`` with caller-owned split counters: ``counters`` int32, zeroed, at
    least ``decode_tiling.merge_counters`` entries, left zeroed. A plain launch, not the
    custom op: for the engine's eager and captured searches, where it saves each launch its
    counter fill (one graph node); traced programs hold the op, which fills its own."""
    return _run(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own, scale, counters,
                seq_lens)
