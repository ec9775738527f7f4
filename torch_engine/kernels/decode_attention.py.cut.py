"""xAttention decode in Triton: W beams share one prompt KV, then each adds its own few tokens.

Same function as ``torch_engine.reference.decode_attention``. For each request and KV head the
W beams x G query heads form one ``[W*G, D]`` query tile, so the shared prompt is read once per
tile and attended with matrix products (``tl.dot``) instead of W vector products. Stages:

1. shared stage: the prompt KV of the request, online softmax (FlashAttention-2) over
   ``BLOCK_N``-key tiles; when ``B * Hkv`` tiles cannot fill the GPU the prompt is split into
   ``splits`` equal chunks, one program each (split-K / flash-decoding);
2. own stage (split 0 only): each row's own ``num_own`` beam tokens, folded into the same
   running (max, sum, acc) state, which is the log-sum-exp merge done in registers;
3. merge (only when ``splits > 1``): the per-split partial outputs and log-sum-exps combine in
   float32. With ``splits == 1`` stage 3 disappears and the whole step is one launch.

Registered as the custom op ``xgr::decode_attention`` with a shape-only fake, so
``torch.compile`` and ``torch.export`` can trace it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from torch_engine.errors import InvalidInputError, require
from torch_engine.kernels import _common as c

_OP = "decode_attention"
_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeConfig:
    """Tiling of one decode launch: rows of the (beam x group) tile, keys per step, splits."""

    block_m: int
    block_n: int
    splits: int
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _decode_partial_kernel(
        q_ptr, sk_ptr, sv_ptr, cu_ptr, bk_ptr, bv_ptr, out_ptr, part_o_ptr, part_lse_ptr,
        num_own, qk_scale, width, num_kv_heads,
        s_qb, s_qw, s_qh, s_skt, s_skh, s_svt, s_svh,
        s_bkb, s_bkw, s_bks, s_bkh, s_bvb, s_bvw, s_bvs, s_bvh,
        s_ob, s_ow, s_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, OWN_BEAMS: tl.constexpr,
        DOT_PRECISION: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
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

    # Stage 1: this split's block-aligned chunk of the request's prompt.
    start = tl.load(cu_ptr + b).to(tl.int32)
    end = tl.load(cu_ptr + b + 1).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(end - start, SPLITS), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(end, lo + chunk)
    # A finite floor instead of -inf keeps exp2(m_old - m_new) defined when a tile is all masked.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for k0 in range(lo, hi, BLOCK_N):
        kpos = k0 + n
        k_ok = kpos < hi
        k = tl.load(sk_ptr + kpos[:, None] * s_skt + h * s_skh + d[None, :],
                    mask=k_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(k_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(sv_ptr + kpos[:, None] * s_svt + h * s_svh + d[None, :],
                    mask=k_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # Stage 2 (split 0): each row's own beam tokens. The tile's rows touch OWN_BEAMS beams;
    # one small product against those beams' own keys, keeping each row's own-beam column,
    # stays on the tensor cores instead of [BLOCK_M, D] fp32 vector products.
    if split == 0:
        beam0 = (pid_m * BLOCK_M) // GROUP
        nb = tl.arange(0, OWN_BEAMS)
        own_beam = beam0 + nb
        own_ok = (own_beam < width)[:, None]
        mine = (beam - beam0)[:, None] == nb[None, :]                    # [BLOCK_M, OWN_BEAMS]
        k_own_base = bk_ptr + b * s_bkb + own_beam[:, None] * s_bkw + h * s_bkh + d[None, :]
        v_own_base = bv_ptr + b * s_bvb + own_beam[:, None] * s_bvw + h * s_bvh + d[None, :]
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
            acc = acc * alpha[:, None] + tl.dot(p_sel, v_own, input_precision=DOT_PRECISION)
            m_i = m_new

    if SPLITS == 1:
        o_rows = out_ptr + b * s_ob + beam * s_ow + head * s_oh
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


@triton.jit
def _decode_merge_kernel(
        part_o_ptr, part_lse_ptr, out_ptr, width, num_kv_heads, s_ob, s_ow, s_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        SPLITS: tl.constexpr):
    # Stage 3: out = sum_s 2^(lse_s - lse) * out_s with lse = log2 sum_s 2^lse_s, in fp32.
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = pid_bh // num_kv_heads
    h = pid_bh % num_kv_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < width * GROUP
    d = tl.arange(0, HEAD_DIM)
    base = pid_bh * SPLITS * width * GROUP + rows
    lse_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        lse_max = tl.maximum(lse_max, tl.load(part_lse_ptr + base + s * width * GROUP,
                                              mask=row_ok, other=0.0))
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for s in tl.static_range(SPLITS):
        part = base + s * width * GROUP
        weight = tl.exp2(tl.load(part_lse_ptr + part, mask=row_ok, other=0.0) - lse_max)
        o = tl.load(part_o_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=row_ok[:, None],
                    other=0.0).to(tl.float32)
        total += weight
        acc += weight[:, None] * o
    beam = rows // GROUP
    head = h * GROUP + rows % GROUP
    o_rows = out_ptr + b * s_ob + beam * s_ow + head * s_oh
    tl.store(o_rows[:, None] + d[None, :], (acc / total[:, None]).to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])

