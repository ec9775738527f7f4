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


def row_scale(inputs: torch.Tensor, eps: float, wide: torch.dtype) -> torch.Tensor:
    """``1 / rms`` of each row of ``inputs [..., H]`` as ``[..., 1]`` in ``wide``: the scale of
    an RMSNorm whose weight was folded into the product after it."""
    x = inputs.to(wide)
    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def qkv_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
               num_kv_heads: int, q_norm: torch.Tensor | None = None,
               k_norm: torch.Tensor | None = None, eps: float = 1e-6,
               inputs: torch.Tensor | None = None, input_eps: float = 1e-6,
               bias: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scale each row of ``qkv [..., (Hq + 2 Hkv) * D]`` by ``1 / rms`` of its ``inputs`` row
    when given and add ``bias``, split into heads, RMS-normalise queries and keys per head
    when ``q_norm``/``k_norm [D]`` are given (Qwen3), rotate them (``layers.apply_rotary``,
    the engine's torch path, itself checked against Hugging Face). Returns q ``[..., Hq, D]``,
    k and v ``[..., Hkv, D]``."""
    dim = cos.shape[-1]
    wide = _wide(qkv).dtype
    rows = qkv.to(wide)
    if inputs is not None:
        rows = rows * row_scale(inputs, input_eps, wide)
    if bias is not None:
        rows = rows + bias.to(wide)
    heads = rows.unflatten(-1, (num_heads + 2 * num_kv_heads, dim))
    q, k = heads[..., :num_heads, :], heads[..., num_heads:num_heads + num_kv_heads, :]
    v = heads[..., num_heads + num_kv_heads:, :]
    if q_norm is not None:
        q = F.rms_norm(q, (dim,), q_norm.to(wide), eps)
        k = F.rms_norm(k, (dim,), k_norm.to(wide), eps)
    cos, sin = cos.to(wide), sin.to(wide)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


def silu_mul(gate_up: torch.Tensor, inputs: torch.Tensor | None = None,
             input_eps: float = 1e-6) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [..., 2 I]`` (gate first) in float32/64, each row first
    scaled by ``1 / rms`` of its ``inputs`` row when given."""
    rows = _wide(gate_up)
    if inputs is not None:
        rows = rows * row_scale(inputs, input_eps, rows.dtype)
    gate, up = rows.chunk(2, dim=-1)
    return F.silu(gate) * up
