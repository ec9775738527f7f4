"""Reference definitions of the fused layer kernels (``torch_engine.kernels.layer_ops``).

Each is the plain composition of the torch steps a kernel replaces, computed in float32
(float64 when given float64) and returned in that precision, so tests can compare the kernel's
one-rounding result against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_engine.layers import apply_rotary


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.dtype == torch.float64 else x.float()


def qkv_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
               num_kv_heads: int, q_norm: torch.Tensor | None = None,
               k_norm: torch.Tensor | None = None, eps: float = 1e-6
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split ``qkv [..., (Hq + 2 Hkv) * D]`` into heads, RMS-normalise queries and keys per head
    when ``q_norm``/``k_norm [D]`` are given (Qwen3), rotate them (``layers.apply_rotary``,
    the engine's torch path, itself checked against Hugging Face). Returns q ``[..., Hq, D]``,
    k and v ``[..., Hkv, D]``."""
    dim = cos.shape[-1]
    wide = _wide(qkv).dtype
    heads = qkv.to(wide).unflatten(-1, (num_heads + 2 * num_kv_heads, dim))
    q, k = heads[..., :num_heads, :], heads[..., num_heads:num_heads + num_kv_heads, :]
    v = heads[..., num_heads + num_kv_heads:, :]
    if q_norm is not None:
        q = F.rms_norm(q, (dim,), q_norm.to(wide), eps)
        k = F.rms_norm(k, (dim,), k_norm.to(wide), eps)
    cos, sin = cos.to(wide), sin.to(wide)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + delta`` (rounded to x's dtype, as the residual stream is stored) and
    ``rms_norm(s) * weight`` in float32/64."""
    total = x + delta
    wide = torch.float64 if torch.float64 in (total.dtype, weight.dtype) else torch.float32
    return total, F.rms_norm(total.to(wide), (total.shape[-1],), weight.to(wide), eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [..., 2 I]`` (gate first) in float32/64."""
    gate, up = _wide(gate_up).chunk(2, dim=-1)
    return F.silu(gate) * up
