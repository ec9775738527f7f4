"""Vectorised searches in a sorted device array, shared by the selection kernels: each lane of
``value`` searches on its own, in a fixed number of steps (no data-dependent loop)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def search(ptr, n, value, STEPS: tl.constexpr, RIGHT: tl.constexpr):
    """First index in ``[0, n)`` whose (sorted) entry is >= ``value`` (> with ``RIGHT``), or
    ``n``: ``searchsorted``'s left and right sides (2**STEPS > n)."""
    lo = tl.zeros_like(value)
    hi = lo + n
    for _ in tl.static_range(STEPS):
        mid = (lo + hi) // 2
        probe = tl.load(ptr + mid, mask=mid < hi, other=0)
        if RIGHT:
            go = (probe <= value) & (mid < hi)
        else:
            go = (probe < value) & (mid < hi)
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(go, hi, mid)
    return lo


@triton.jit
def contains(ptr, n, value, STEPS: tl.constexpr):
    """Whether each ``value`` is among the ``n`` sorted entries at ``ptr`` (2**STEPS > n). A
    branchless lower-bound search over the entries padded with +inf to 2**STEPS - 1 probes the
    lower bound itself whenever it is a real entry, so comparing every probe for equality
    replaces the final load."""
    pos = tl.zeros_like(value)
    hit = pos < 0
    for k in tl.static_range(STEPS):
        at = pos + ((1 << (STEPS - 1 - k)) - 1)
        real = at < n
        probe = tl.load(ptr + at, mask=real, other=0)
        hit = hit | (real & (probe == value))
        pos = tl.where(real & (probe < value), at + 1, pos)
    return hit
