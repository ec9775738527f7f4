"""The decode step's matrix products with their elementwise work folded in (Triton).

At decode the products see few rows (``B * W``: 256 at batch 1) and the library GEMMs run far
below their bound (on an H200: 13-30% for q/k/v, o and down at 256 rows of qwen2-0.5b), so the
elementwise launch after each product costs about as much as the product's own shortfall. Two
products take their epilogue into the same program:

* ``qkv_rotary_product``: ``h @ W_qkv.T + b`` for one head per program, computed as its two
  halves ``[M, D/2]`` side by side, so the rotary embedding (and Qwen3's per-head RMSNorm) is
  elementwise between two accumulators; queries are returned, keys and values written where
  the caller wants them (a beam-KV slot). Replaces the product and ``layer_ops.qkv_rotary``.
* ``gate_up_silu``: ``silu(h @ W_gate.T) * (h @ W_up.T)`` with both accumulators in one program:
  the ``[M, 2 I]`` intermediate never reaches memory. Replaces the product and
  ``layer_ops.silu_mul``.

Each product's result is rounded to the input dtype before its epilogue, as the torch path
stores it, so both paths see the same values up to the order of the sums. Definitions:
``torch_engine.reference.layer_ops`` (``qkv_rotary`` after ``F.linear``; ``silu_mul``). Plain
launches (no custom op), like ``layer_ops``: the engine calls them outside tracing only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from torch_engine.errors import InvalidInputError, require
from torch_engine.kernels import _common as c
from torch_engine.kernels.layer_ops import _rows, check_rotary_outputs


@dataclass(frozen=True)
class ProductTile:
    """Rows, output columns (``gate_up_silu``; ``qkv_rotary_product`` takes half a head) and
    reduction step of one program, its warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


# Up to this many rows the fused products replace the library product + elementwise launch;
# above it the library's large-tile kernels win (``fused_product_table`` in bench_engine).
FUSED_MAX_ROWS = 1024


def fused_for(rows: int) -> bool:
    """Whether a product over ``rows`` rows takes the fused kernels."""
    return rows <= FUSED_MAX_ROWS


# Chosen from the product sweep of ``benchmarks/bench_engine.py --stages=kernels`` (H200).
GATE_UP_TILE = ProductTile(64, 64, 64, 4, 4)
QKV_TILE = ProductTile(64, 0, 64, 4, 4)
_INTERPRETER_TILE = ProductTile(16, 16, 16, 4, 1)


@triton.jit
def _gate_up_silu_kernel(h_ptr, w_ptr, out_ptr, rows, hidden, inter, s_h, s_w, s_o,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    # Row tiles vary fastest: programs that run together read the same weight tiles.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    r_ok = r < rows
    n_ok = n < inter
    a_ptrs = h_ptr + r[:, None].to(tl.int64) * s_h + k[None, :]
    g_ptrs = w_ptr + n[:, None].to(tl.int64) * s_w + k[None, :]
    u_ptrs = g_ptrs + inter.to(tl.int64) * s_w
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = (k0 + k) < hidden
        a = tl.load(a_ptrs + k0, mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        wg = tl.load(g_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        wu = tl.load(u_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc_g = tl.dot(a, tl.trans(wg), acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, tl.trans(wu), acc_u, input_precision=DOT_PRECISION)
    dtype = out_ptr.dtype.element_ty
    gate = acc_g.to(dtype).to(tl.float32)
    up = acc_u.to(dtype).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + r[:, None].to(tl.int64) * s_o + n[None, :], out.to(dtype),
             mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def _qkv_product_kernel(h_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_ptr, k_ptr,
                        v_ptr, rows, hidden, width, eps, s_h, s_w, s_cos, s_kb, s_kw, s_vb, s_vw,
                        HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                        HAS_BIAS: tl.constexpr, NORM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    HALF: tl.constexpr = D // 2
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = r < rows
    r64 = r.to(tl.int64)
    cols = tl.arange(0, HALF)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + r64[:, None] * s_h + k[None, :]
    w1_ptrs = w_ptr + (head * D + cols)[:, None].to(tl.int64) * s_w + k[None, :]
    w2_ptrs = w1_ptrs + HALF * s_w
    acc1 = tl.zeros([BLOCK_M, HALF], tl.float32)
    acc2 = tl.zeros([BLOCK_M, HALF], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = (k0 + k) < hidden
        a = tl.load(a_ptrs + k0, mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        w1 = tl.load(w1_ptrs + k0, mask=k_ok[None, :], other=0.0)
        w2 = tl.load(w2_ptrs + k0, mask=k_ok[None, :], other=0.0)
        acc1 = tl.dot(a, tl.trans(w1), acc1, input_precision=DOT_PRECISION)
        acc2 = tl.dot(a, tl.trans(w2), acc2, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + head * D + cols).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + head * D + HALF + cols).to(tl.float32)[None, :]
    dtype = q_ptr.dtype.element_ty
    x1 = acc1.to(dtype).to(tl.float32)            # the product as the torch path stores it
    x2 = acc2.to(dtype).to(tl.float32)
    b = (r // width).to(tl.int64)
    w = (r % width).to(tl.int64)
    if head < HQ + HKV:
        if NORM:
            is_q = head < HQ
            n1 = tl.where(is_q, tl.load(qn_ptr + cols), tl.load(kn_ptr + cols)).to(tl.float32)
            n2 = tl.where(is_q, tl.load(qn_ptr + HALF + cols),
                          tl.load(kn_ptr + HALF + cols)).to(tl.float32)
            inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)
            x1 = x1 * inv[:, None] * n1[None, :]
            x2 = x2 * inv[:, None] * n2[None, :]
        rope = cos_ptr + r64[:, None] * s_cos + cols[None, :]
        cos1 = tl.load(rope, mask=r_ok[:, None], other=0.0).to(tl.float32)
        cos2 = tl.load(rope + HALF, mask=r_ok[:, None], other=0.0).to(tl.float32)
        sines = sin_ptr + r64[:, None] * s_cos + cols[None, :]
        sin1 = tl.load(sines, mask=r_ok[:, None], other=0.0).to(tl.float32)   # signed: -sin
        sin2 = tl.load(sines + HALF, mask=r_ok[:, None], other=0.0).to(tl.float32)
        o1 = x1 * cos1 + x2 * sin1
        o2 = x2 * cos2 + x1 * sin2
        if head < HQ:
            dst = q_ptr + r64[:, None] * (HQ * D) + head * D + cols[None, :]
        else:
            dst = k_ptr + b[:, None] * s_kb + w[:, None] * s_kw + (head - HQ) * D + cols[None, :]
        tl.store(dst, o1.to(dtype), mask=r_ok[:, None])
        tl.store(dst + HALF, o2.to(dtype), mask=r_ok[:, None])
    else:
        dst = (v_ptr + b[:, None] * s_vb + w[:, None] * s_vw + (head - HQ - HKV) * D
               + cols[None, :])
        tl.store(dst, x1.to(dtype), mask=r_ok[:, None])
        tl.store(dst + HALF, x2.to(dtype), mask=r_ok[:, None])


def _check_product(op: str, h: torch.Tensor, weight: torch.Tensor, out_features: int,
                   what: str) -> torch.Tensor:
    """h ``[..., H]`` rows contiguous, weight ``[out_features, H]`` (last axis contiguous),
    one float dtype and device; returns h as ``[N, H]``."""
    for name, t in (("h", h), ("weight", weight)):
        require(isinstance(t, torch.Tensor), InvalidInputError,
                f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    c.check_devices(op, {"h": h, "weight": weight})
    c.check_float(op, {"h": h, "weight": weight})
    c.check_rank(op, "weight", weight, 2, f"[{what}, H]")
    require(h.dim() >= 1, InvalidInputError, f"{op}: h must be [..., H], got a scalar")
    c.check_dim(op, "weight", weight, 0, out_features, what)
    c.check_dim(op, "weight", weight, 1, h.shape[-1], "H, h's last axis")
    c.check_last_dim_contiguous(op, {"h": h, "weight": weight})
    flat = h.reshape(-1, h.shape[-1])
    require(flat.shape[0] <= 1 or flat.stride(0) >= flat.shape[1], InvalidInputError,
            f"{op}: h's rows must not overlap, got strides {h.stride()}")
    return flat


def _tile(tile: ProductTile | None, default: ProductTile) -> ProductTile:
    if tile is not None:
        return tile
    return _INTERPRETER_TILE if c.interpreting() else default


def gate_up_silu(h: torch.Tensor, gate_up_weight: torch.Tensor,
                 tile: ProductTile | None = None) -> torch.Tensor:
    """``silu(h @ W_gate.T) * (h @ W_up.T)`` with ``gate_up_weight [2 I, H]`` (gate rows
    first, as ``FusedProjections.gate_up_weight``), h ``[..., H]``. Returns ``[..., I]`` in h's
    dtype. ``tile`` overrides the table (for sweeps)."""
    op = "gate_up_silu"
    require(isinstance(gate_up_weight, torch.Tensor) and gate_up_weight.dim() == 2
            and gate_up_weight.shape[0] % 2 == 0, InvalidInputError,
            f"{op}: gate_up_weight must be [2 I, H] (gate rows, then up rows), got "
            f"{tuple(getattr(gate_up_weight, 'shape', ()))}")
    inter = gate_up_weight.shape[0] // 2
    flat = _check_product(op, h, gate_up_weight, 2 * inter, "2 I")
    rows, hidden = flat.shape
    out = torch.empty((*h.shape[:-1], inter), dtype=h.dtype, device=h.device)
    if rows == 0 or inter == 0:
        return out
    t = _tile(tile, GATE_UP_TILE)
    grid = (triton.cdiv(rows, t.block_m), triton.cdiv(inter, t.block_n))
    with c.on_device(h.device):
        _gate_up_silu_kernel[grid](
            flat, gate_up_weight, out, rows, hidden, inter, flat.stride(0),
            gate_up_weight.stride(0), inter, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            BLOCK_K=t.block_k, DOT_PRECISION=c.dot_precision(h.dtype), num_warps=t.num_warps,
            num_stages=t.num_stages)
    return out


def qkv_rotary_product(h: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None,
                       cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                       k_out: torch.Tensor, v_out: torch.Tensor,
                       q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                       eps: float = 1e-6, tile: ProductTile | None = None) -> torch.Tensor:
    """``layer_ops.qkv_rotary(F.linear(h, qkv_weight, qkv_bias), ...)`` in one launch.

    h: ``[..., H]`` (N rows); qkv_weight: ``[(Hq + 2 Hkv) * D, H]``; qkv_bias: ``[(Hq + 2 Hkv)
    * D]`` or None; cos, sin, k_out, v_out, q_norm, k_norm, eps as in ``layer_ops.qkv_rotary``.
    Writes k_out, v_out and returns queries ``[..., Hq, D]`` in h's dtype.
    """
    op = "qkv_rotary_product"
    require(isinstance(h, torch.Tensor), InvalidInputError,
            f"{op}: h must be a torch.Tensor, got {type(h).__name__}")
    check_rotary_outputs(op, "h", h, cos, sin, num_heads, num_kv_heads, k_out, v_out, q_norm,
                         k_norm)
    dim = cos.shape[-1]
    heads = num_heads + 2 * num_kv_heads
    flat = _check_product(op, h, qkv_weight, heads * dim, "(Hq + 2 Hkv) * D")
    if qkv_bias is not None:
        c.check_rank(op, "qkv_bias", qkv_bias, 1, "[(Hq + 2 Hkv) * D]")
        c.check_dim(op, "qkv_bias", qkv_bias, 0, heads * dim, "(Hq + 2 Hkv) * D")
        c.check_float(op, {"h": h, "qkv_bias": qkv_bias})
        c.check_devices(op, {"h": h, "qkv_bias": qkv_bias})
    rows, hidden = flat.shape
    q = torch.empty((*h.shape[:-1], num_heads, dim), dtype=h.dtype, device=h.device)
    if rows == 0:
        return q
    width, s_kb, s_kw = _rows(k_out, num_kv_heads * dim)
    _, s_vb, s_vw = _rows(v_out, num_kv_heads * dim)
    cos2, sin2 = cos.reshape(-1, dim), sin.reshape(-1, dim)
    norm = q_norm is not None
    t = _tile(tile, QKV_TILE)
    grid = (triton.cdiv(rows, t.block_m), heads)
    with c.on_device(h.device):
        _qkv_product_kernel[grid](
            flat, qkv_weight, qkv_bias if qkv_bias is not None else flat, cos2, sin2,
            q_norm if norm else cos2, k_norm if norm else cos2, q, k_out, v_out, rows, hidden,
            width, eps, flat.stride(0), qkv_weight.stride(0), cos2.stride(0), s_kb, s_kw, s_vb,
            s_vw, HQ=num_heads, HKV=num_kv_heads, D=dim, HAS_BIAS=qkv_bias is not None,
            NORM=norm, BLOCK_M=t.block_m, BLOCK_K=t.block_k,
            DOT_PRECISION=c.dot_precision(h.dtype), num_warps=t.num_warps,
            num_stages=t.num_stages)
    return q
