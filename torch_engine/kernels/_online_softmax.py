"""The online-softmax update shared by the attention kernels (FlashAttention-2, base 2).

One ``@triton.jit`` function, inlined by Triton into each caller, so the decode and prefill
kernels fold a tile of scores into their running (max, sum, acc) state the same way.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
