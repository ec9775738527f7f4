"""The key-tile steps shared by the attention kernels (FlashAttention-2, base 2).

``@triton.jit`` functions, inlined by Triton into each caller, so the decode and prefill
kernels load a tile of keys and values, score it, and fold the scores into their running
(max, sum, acc) state the same way; each kernel applies its own mask in between.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(acc, l_i, m_i, s, v, qk_scale, ACC_IN_DOT: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, LAZY_RESCALE: tl.constexpr):
    """Fold one tile into the state: s ``[M, N]`` unscaled scores (-inf where masked),
    v ``[N, D]``, acc ``[M, D]`` / l_i, m_i ``[M]`` float32 with m_i in base-2 scaled units.
    Scores stay unscaled until one fused multiply-subtract: exp2(s * scale - m).

    The state only needs ``acc = sum_j 2^(s_j - m) v_j`` and ``l = sum_j 2^(s_j - m)`` for
    one reference m per row, not the running maximum. With LAZY_RESCALE the reference moves
    (and acc, l are rescaled) only when some row's maximum passes it by more than 8: then
    every probability stays below 2^8, exact enough in float32 and in the 16-bit P of the
    P V product, and most tiles skip the ``[M, D]`` rescale and the ``[M]`` exponentials."""
    if LAZY_RESCALE:
        m_tile = tl.max(s, 1) * qk_scale
        if tl.max(m_tile - m_i, 0) > 8.0:        # one branch for the whole tile
            m_new = tl.maximum(m_i, m_tile)
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
        p = tl.exp2(s * qk_scale - m_i[:, None])
        l_i += tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        return acc, l_i, m_i
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
def score_key_tile(q, k_base, v_base, kpos, s_kt, s_vt, d, hi, MASKED: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """Unscaled scores ``q @ k.T`` ``[M, N]`` and the values ``[N, D]`` of the key rows
    ``kpos`` ``[N]`` (row strides s_kt, s_vt; columns d). With MASKED, rows at or past ``hi``
    read as zeros: the caller masks their scores."""
    if MASKED:
        k_ok = kpos < hi
        k = tl.load(k_base + kpos[:, None] * s_kt + d[None, :], mask=k_ok[:, None], other=0.0)
        v = tl.load(v_base + kpos[:, None] * s_vt + d[None, :], mask=k_ok[:, None], other=0.0)
    else:
        k = tl.load(k_base + kpos[:, None] * s_kt + d[None, :])
        v = tl.load(v_base + kpos[:, None] * s_vt + d[None, :])
    return tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), v
