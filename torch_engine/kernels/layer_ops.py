"""Fused elementwise steps of a decoder layer (Triton), for the serving path on CUDA.

At batch 1 a search is bound by kernel launches (about 19 per layer and pass with plain torch
ops inside one CUDA graph); these fold the elementwise work between the matrix products.

The two RMSNorms of a layer need no launch of their own. Each norm's weight is folded into the
columns of the product after it (``layers.FusedProjections``), and its ``1 / rms(x)`` row
scale is applied to that product's output by the kernel that reads it next:
``norm(x) @ W^T = (x @ (W * g)^T) / rms(x)`` row by row. The residual adds ride on the output
and down projections (beta = 1 in the product). A layer is then 4 products, attention and 2
elementwise launches (``qkv_rotary``, ``silu_mul``) instead of 4.

* ``qkv_rotary``: the fused q/k/v product's output -> its input norm's row scale and the
  biases, rotated queries and keys (Qwen3's per-head RMSNorm first) and values, written where
  the caller wants them (the contiguous prompt KV, or a beam-KV slot): 1 launch instead of 6
  (Qwen2) or 11 (Qwen3) plus the KV copies.
* ``silu_mul``: ``silu(gate) * up`` from the fused gate/up product, after the post-attention
  norm's row scale: 1 launch instead of 4.
* ``rms_norm``: RMSNorm alone (the model's final norm): one row per program, a shorter
  kernel than torch's.
* ``rotary_cos_sin``: the rotary cos and signed sin rows of a pass's positions (each repeated
  for the beams of a decode step), from the model's frequencies: 1 launch instead of about 13
  (``layers.rotary_cos_sin``: the frequencies, the products, cos, sin, the concatenations,
  the casts), with the same float32 steps.

Arithmetic in float32, one rounding to the output dtype; same functions as the torch ops they
replace, defined in ``torch_engine.reference.layer_ops``. Each launcher checks shapes, dtypes,
strides and devices (never values, which would cost a host synchronisation) and raises
``InvalidInputError`` naming the argument and the rule; shapes alone decide each launch, so
they capture in CUDA graphs.

The engine's eager and captured searches call the launchers (``qkv_rotary`` writes keys and
values straight into their slot). Traced programs call the same kernels as functional ops
registered with ``torch.library.triton_op`` (``xgr::qkv_rotary``, ``xgr::silu_mul``,
``xgr::rms_norm``, ``xgr::rotary_cos_sin``; the ``traced_*`` functions), so AOTInductor
compiles them into an engine package (``torch_engine.kernel_layers``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from xgr_common.errors import InvalidInputError, require
from torch_engine.kernels import _common as c


@triton.jit
def _row_scale(x_ptr, row, size, eps, BLOCK: tl.constexpr):
    """``1 / rms`` of row ``row`` of ``x [N, size]`` (contiguous rows), in float32."""
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row.to(tl.int64) * size + cols, mask=cols < size, other=0.0)
    x = x.to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=0) / size + eps)


@triton.jit
def _head_rows(src, bias_ptr, heads, cols, scale, mask, D: tl.constexpr, BIAS: tl.constexpr):
    """Columns ``cols`` of ``heads`` rows of one fused product row, row-scaled, bias added."""
    x = tl.load(src + heads * D + cols[None, :], mask=mask, other=0.0).to(tl.float32) * scale
    if BIAS:
        x += tl.load(bias_ptr + heads * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _rotate_heads(src, bias_ptr, heads, cos, sin, scale, norm_ptr, eps, d, partner, mask,
                  D: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr):
    x = _head_rows(src, bias_ptr, heads, d, scale, mask, D, BIAS)
    swapped = _head_rows(src, bias_ptr, heads, partner, scale, mask, D, BIAS)
    if NORM:
        inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
        x = x * inv * tl.load(norm_ptr + d).to(tl.float32)[None, :]
        swapped = swapped * inv * tl.load(norm_ptr + partner).to(tl.float32)[None, :]
    return x * cos[None, :] + swapped * sin[None, :]


@triton.jit
def _qkv_rotary_kernel(qkv_ptr, x_ptr, bias_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_ptr,
                       k_ptr, v_ptr, width, hidden, in_eps, eps, s_qkv, s_cos, s_q, s_kb,
                       s_kw, s_vb, s_vw,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                       HQ_P2: tl.constexpr, HKV_P2: tl.constexpr, NORM: tl.constexpr,
                       SCALE: tl.constexpr, BIAS: tl.constexpr, HIDDEN_P2: tl.constexpr):
    in_eps = tl.cast(in_eps, tl.float32)  # float64 scalars when Inductor launches the kernel
    eps = tl.cast(eps, tl.float32)
    row = tl.program_id(0)
    d = tl.arange(0, D)
    partner = (d + D // 2) % D
    # The input norm folded into the product: its row scale comes from the product's input.
    if SCALE:
        scale = _row_scale(x_ptr, row, hidden, in_eps, HIDDEN_P2)
    else:
        scale = 1.0
    cos = tl.load(cos_ptr + row * s_cos + d).to(tl.float32)
    sin = tl.load(sin_ptr + row * s_cos + d).to(tl.float32)      # signed: first half negated
    src = qkv_ptr + row.to(tl.int64) * s_qkv
    hq = tl.arange(0, HQ_P2)[:, None]
    q = _rotate_heads(src, bias_ptr, hq, cos, sin, scale, qn_ptr, eps, d, partner, hq < HQ, D,
                      NORM, BIAS)
    tl.store(q_ptr + row.to(tl.int64) * s_q + hq * D + d[None, :], q.to(q_ptr.dtype.element_ty),
             mask=hq < HQ)
    hk = tl.arange(0, HKV_P2)[:, None]
    k = _rotate_heads(src + HQ * D, bias_ptr + HQ * D, hk, cos, sin, scale, kn_ptr, eps, d,
                      partner, hk < HKV, D, NORM, BIAS)
    b = (row // width).to(tl.int64)
    w = (row % width).to(tl.int64)
    tl.store(k_ptr + b * s_kb + w * s_kw + hk * D + d[None, :], k.to(k_ptr.dtype.element_ty),
             mask=hk < HKV)
    v = _head_rows(src + (HQ + HKV) * D, bias_ptr + (HQ + HKV) * D, hk, d, scale, hk < HKV, D,
                   BIAS)
    tl.store(v_ptr + b * s_vb + w * s_vw + hk * D + d[None, :], v.to(v_ptr.dtype.element_ty),
             mask=hk < HKV)


def _nothing_to_launch(rows) -> bool:
    """True for an empty launch. Under tracing the row count is symbolic and a test of it
    would guard the dynamic size: the traced launch is kept (its grid is empty at run time)."""
    return isinstance(rows, int) and rows == 0


def _check_row_inputs(op: str, inputs: torch.Tensor, rows: int, product_name: str,
                      product: torch.Tensor, input_eps: float) -> None:
    """``inputs``: the ``[..., H]`` rows (contiguous) whose RMS scales the product's rows."""
    require(isinstance(inputs, torch.Tensor), InvalidInputError,
            f"{op}: inputs must be a torch.Tensor, got {type(inputs).__name__}")
    c.check_devices(op, {"inputs": inputs, product_name: product})
    c.check_float(op, {"inputs": inputs})
    require(inputs.dim() >= 1 and inputs.is_contiguous()
            and inputs.numel() == rows * inputs.shape[-1], InvalidInputError,
            f"{op}: inputs must hold one contiguous [H] row per product row ({rows} rows), "
            f"got shape {tuple(inputs.shape)} strides {inputs.stride()}")
    require(isinstance(input_eps, float) and input_eps > 0, InvalidInputError,
            f"{op}: input_eps must be a positive float, got {input_eps!r}")


def _check_qkv_rotary(qkv, cos, sin, num_heads, num_kv_heads, k_out, v_out, q_norm, k_norm,
                      inputs, input_eps, bias) -> None:
    op = "qkv_rotary"
    for name, t in (("qkv", qkv), ("cos", cos), ("sin", sin), ("k_out", k_out),
                    ("v_out", v_out)):
        require(isinstance(t, torch.Tensor), InvalidInputError,
                f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    require(isinstance(num_heads, int) and isinstance(num_kv_heads, int) and num_kv_heads >= 1
            and num_heads >= num_kv_heads, InvalidInputError,
            f"{op}: num_heads and num_kv_heads must be ints with num_heads >= num_kv_heads >= 1, "
            f"got {num_heads!r} and {num_kv_heads!r}")
    dim = cos.shape[-1]
    c.check_head_dim(op, dim)
    tensors = {"qkv": qkv, "cos": cos, "sin": sin, "k_out": k_out, "v_out": v_out}
    if (q_norm is None) != (k_norm is None):
        raise InvalidInputError(f"{op}: q_norm and k_norm come together (Qwen3) or not at all, "
                                f"got q_norm={'a tensor' if q_norm is not None else None} and "
                                f"k_norm={'a tensor' if k_norm is not None else None}")
    if q_norm is not None:
        c.check_rank(op, "q_norm", q_norm, 1, "[head_dim]")
        c.check_rank(op, "k_norm", k_norm, 1, "[head_dim]")
        c.check_dim(op, "q_norm", q_norm, 0, dim, "head_dim")
        c.check_dim(op, "k_norm", k_norm, 0, dim, "head_dim")
        tensors.update(q_norm=q_norm, k_norm=k_norm)
    c.check_devices(op, tensors)
    c.check_float(op, {"qkv": qkv, "k_out": k_out, "v_out": v_out})
    c.check_float(op, {"cos": cos, "sin": sin})
    c.check_dim(op, "qkv", qkv, -1, (num_heads + 2 * num_kv_heads) * dim,
                "(num_heads + 2 * num_kv_heads) * head_dim")
    c.check_same_shape(op, "sin", sin, "cos", cos, "[..., head_dim]")
    rows = qkv.numel() // max(qkv.shape[-1], 1)
    require(cos.numel() == rows * dim, InvalidInputError,
            f"{op}: cos must hold one [head_dim] row per row of qkv ({rows} rows), got shape "
            f"{tuple(cos.shape)}")
    c.check_last_dim_contiguous(op, {"qkv": qkv, "cos": cos, "sin": sin})
    for name, t in (("k_out", k_out), ("v_out", v_out)):
        require(t.dim() in (3, 4), InvalidInputError,
                f"{op}: {name} must be [N, Hkv, D] or [B, W, Hkv, D], got shape "
                f"{tuple(t.shape)}")
        require(tuple(t.shape[-2:]) == (num_kv_heads, dim)
                and t.stride(-1) == 1 and t.stride(-2) == dim, InvalidInputError,
                f"{op}: {name}'s last two axes must be a contiguous [num_kv_heads, head_dim] = "
                f"[{num_kv_heads}, {dim}], got shape {tuple(t.shape)} strides {t.stride()}")
        require(t.numel() == rows * num_kv_heads * dim, InvalidInputError,
                f"{op}: {name} must hold one [Hkv, D] row per row of qkv ({rows} rows), got "
                f"shape {tuple(t.shape)}")
    if inputs is not None:
        _check_row_inputs(op, inputs, rows, "qkv", qkv, input_eps)
    if bias is not None:
        c.check_rank(op, "bias", bias, 1, "[(Hq + 2 Hkv) * D]")
        c.check_dim(op, "bias", bias, 0, qkv.shape[-1], "qkv's last axis")
        c.check_devices(op, {"bias": bias, "qkv": qkv})
        c.check_float(op, {"bias": bias})
        require(bias.is_contiguous(), InvalidInputError, f"{op}: bias must be contiguous")


def _rows(t: torch.Tensor, inner: int) -> tuple[int, int, int]:
    """(width, batch stride, width stride) of ``t [B, W, ...]`` or ``[N, ...]`` whose last
    ``inner`` elements of a row are contiguous."""
    if t.dim() == 4:
        return t.shape[1], t.stride(0), t.stride(1)
    # sym_max: under tracing the row count may be data-dependent, and max() would guard it.
    return torch.sym_max(t.shape[0], 1), 0, t.stride(0)


def qkv_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               num_heads: int, num_kv_heads: int, k_out: torch.Tensor, v_out: torch.Tensor,
               q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
               eps: float = 1e-6, inputs: torch.Tensor | None = None,
               input_eps: float = 1e-6, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Split the fused projection and rotate queries and keys.

    qkv: ``[..., (Hq + 2 Hkv) * D]`` with N leading rows, rows contiguous; cos, sin:
    ``[..., D]`` per row (``layers.rotary_cos_sin``: sin signed); k_out, v_out: ``[N, Hkv, D]``
    or ``[B, W, Hkv, D]`` (N = B * W; e.g. a beam-KV slot) with ``[Hkv, D]`` contiguous;
    q_norm, k_norm: ``[D]`` per-head RMSNorm weights (Qwen3) or None; inputs: the product's
    input rows ``[..., H]`` (contiguous) when qkv came from weights with the input norm folded
    in: each qkv row is first multiplied by ``1 / rms(inputs row)`` (``input_eps`` inside the
    root); bias: ``[(Hq + 2 Hkv) * D]`` added after that scale. Writes k_out, v_out and
    returns queries ``[..., Hq, D]`` (contiguous, qkv's dtype).
    """
    _check_qkv_rotary(qkv, cos, sin, num_heads, num_kv_heads, k_out, v_out, q_norm, k_norm,
                      inputs, input_eps, bias)
    dim = cos.shape[-1]
    lead = qkv.shape[:-1]
    flat = qkv.reshape(-1, qkv.shape[-1])
    rows = flat.shape[0]
    cos2, sin2 = cos.reshape(-1, dim), sin.reshape(-1, dim)
    q = torch.empty((*lead, num_heads, dim), dtype=qkv.dtype, device=qkv.device)
    width, s_kb, s_kw = _rows(k_out, num_kv_heads * dim)
    _, s_vb, s_vw = _rows(v_out, num_kv_heads * dim)
    if _nothing_to_launch(rows):
        return q
    norm = q_norm is not None
    hidden = inputs.shape[-1] if inputs is not None else 1
    wrap_triton(_qkv_rotary_kernel)[(rows,)](
        flat, inputs if inputs is not None else cos2, bias if bias is not None else cos2,
        cos2, sin2, q_norm if norm else cos2, k_norm if norm else cos2, q, k_out, v_out,
        width, hidden, input_eps, eps, flat.stride(0), cos2.stride(0), num_heads * dim,
        s_kb, s_kw, s_vb, s_vw,
        HQ=num_heads, HKV=num_kv_heads, D=dim, HQ_P2=triton.next_power_of_2(num_heads),
        HKV_P2=triton.next_power_of_2(num_kv_heads), NORM=norm, SCALE=inputs is not None,
        BIAS=bias is not None, HIDDEN_P2=triton.next_power_of_2(hidden), num_warps=4)
    return q


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, size, eps, BLOCK: tl.constexpr):
    eps = tl.cast(eps, tl.float32)  # a float64 scalar when Inductor launches the kernel
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < size
    x = tl.load(x_ptr + row * size + cols, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / size + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * size + cols, (x * inv * w).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm(x) * weight`` (float32 inside, one rounding); x ``[..., H]``, weight ``[H]``.
    Returns a new tensor like x."""
    op = "rms_norm"
    c.check_devices(op, {"x": x, "weight": weight})
    c.check_float(op, {"x": x})
    c.check_rank(op, "weight", weight, 1, "[H]")
    c.check_dim(op, "weight", weight, 0, x.shape[-1], "H, x's last axis")
    require(isinstance(eps, float) and eps > 0, InvalidInputError,
            f"{op}: eps must be a positive float, got {eps!r}")
    x, weight = x.contiguous(), weight.contiguous()
    size = x.shape[-1]
    out = torch.empty_like(x)
    rows = x.numel() // max(size, 1)
    if not _nothing_to_launch(rows):
        wrap_triton(_rms_norm_kernel)[(rows,)](x, weight, out, size, eps,
                                               BLOCK=triton.next_power_of_2(size),
                                  num_warps=4)
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, x_ptr, out_ptr, size, hidden, eps, BLOCK: tl.constexpr,
                     SCALE: tl.constexpr, HIDDEN_P2: tl.constexpr):
    # A float64 scalar when Inductor launches the kernel: the row scale, and with it every
    # product of the row, would be computed in float64.
    eps = tl.cast(eps, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < size
    gate = tl.load(gu_ptr + row * 2 * size + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * size + size + cols, mask=ok, other=0.0).to(tl.float32)
    if SCALE:
        # The post-attention norm folded into the gate/up product: its row scale.
        scale = _row_scale(x_ptr, row, hidden, eps, HIDDEN_P2)
        gate = gate * scale
        up = up * scale
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * size + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, inputs: torch.Tensor | None = None,
             input_eps: float = 1e-6) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [..., 2 I]`` (gate first, rows contiguous) -> ``[..., I]``.

    inputs: the product's input rows ``[..., H]`` (contiguous) when gate_up came from weights
    with the norm before it folded in: gate and up are first multiplied by
    ``1 / rms(inputs row)`` (``input_eps`` inside the root)."""
    op = "silu_mul"
    c.check_devices(op, {"gate_up": gate_up})
    c.check_float(op, {"gate_up": gate_up})
    require(gate_up.dim() >= 1 and gate_up.shape[-1] % 2 == 0, InvalidInputError,
            f"{op}: gate_up's last axis must be even ([..., 2 I], gate then up), got shape "
            f"{tuple(gate_up.shape)}")
    gate_up = gate_up.contiguous()
    size = gate_up.shape[-1] // 2
    out = torch.empty((*gate_up.shape[:-1], size), dtype=gate_up.dtype, device=gate_up.device)
    rows = out.numel() // max(size, 1)
    if inputs is not None:
        _check_row_inputs(op, inputs, rows, "gate_up", gate_up, input_eps)
    hidden = inputs.shape[-1] if inputs is not None else 1
    if not _nothing_to_launch(rows):
        # Long rows in few programs: each one computes its row's scale again.
        block = min(triton.next_power_of_2(size), 4096)
        wrap_triton(_silu_mul_kernel)[(rows, triton.cdiv(size, block))](
            gate_up, inputs if inputs is not None else gate_up, out, size, hidden, input_eps,
            BLOCK=block, SCALE=inputs is not None, HIDDEN_P2=triton.next_power_of_2(hidden),
            num_warps=8 if block >= 4096 else 4)
    return out


@triton.jit
def _rotary_cos_sin_kernel(pos_ptr, inv_ptr, cos_ptr, sin_ptr, rows, repeat,
                           D: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = row < rows
    half = tl.arange(0, D // 2)
    inv_freq = tl.load(inv_ptr + half)
    # As layers.rotary_cos_sin: freqs = float(position) * inv_freq, then cosf / sinf.
    position = tl.load(pos_ptr + row // repeat, mask=ok, other=0).to(tl.float32)
    freqs = position[:, None] * inv_freq[None, :]
    # tl.cos / tl.sin compile to libdevice's cosf / sinf on sm_90 (Triton 3.6), not to the
    # approximate instructions: the functions torch's kernels call.
    cos = tl.cos(freqs).to(cos_ptr.dtype.element_ty)
    sin = tl.sin(freqs)
    at = row.to(tl.int64)[:, None] * D + half[None, :]
    mask = ok[:, None]
    tl.store(cos_ptr + at, cos, mask=mask)
    tl.store(cos_ptr + at + D // 2, cos, mask=mask)
    tl.store(sin_ptr + at, (-sin).to(sin_ptr.dtype.element_ty), mask=mask)
    tl.store(sin_ptr + at + D // 2, sin.to(sin_ptr.dtype.element_ty), mask=mask)


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                   repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``layers.rotary_cos_sin`` of ``positions [...]`` (int) given its frequencies
    ``inv_freq [D / 2]`` float32 (``layers.rotary_inv_freq``, computed once per model), each
    position's row repeated ``repeat`` times (a decode step's beams share their request's
    position): cos and signed sin ``[*positions.shape, repeat, D]`` (``[*positions.shape, D]``
    when ``repeat`` is 1) in ``dtype``."""
    op = "rotary_cos_sin"
    require(isinstance(positions, torch.Tensor) and not positions.is_floating_point()
            and not positions.is_complex() and positions.dtype != torch.bool, InvalidInputError,
            f"{op}: positions must be an integer tensor, got "
            f"{getattr(positions, 'dtype', type(positions).__name__)}")
    c.check_rank(op, "inv_freq", inv_freq, 1, "[D / 2]")
    half = inv_freq.shape[0]
    require(inv_freq.dtype == torch.float32 and inv_freq.is_contiguous() and half >= 1
            and half & (half - 1) == 0, InvalidInputError,
            f"{op}: inv_freq must be a contiguous float32 [D / 2] with D / 2 a power of two, "
            f"got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    require(isinstance(repeat, int) and repeat >= 1, InvalidInputError,
            f"{op}: repeat must be an int >= 1, got {repeat!r}")
    require(dtype in c.FLOAT_DTYPES, InvalidInputError,
            f"{op}: dtype must be one of float16/bfloat16/float32, got {dtype}")
    c.check_devices(op, {"positions": positions, "inv_freq": inv_freq})
    flat = positions.reshape(-1).contiguous()
    rows = flat.numel() * repeat
    shape = (*positions.shape, *((repeat,) if repeat > 1 else ()), 2 * half)
    cos = torch.empty(shape, dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    if _nothing_to_launch(rows):
        return cos, sin
    block = 16
    with c.on_device(positions.device):
        wrap_triton(_rotary_cos_sin_kernel)[(triton.cdiv(rows, block),)](
            flat, inv_freq, cos, sin, rows, repeat, D=2 * half, BLOCK_R=block, num_warps=4)
    return cos, sin


# --------------------------------------------------------------- the kernels as traced ops
def _functional_qkv_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           inputs: torch.Tensor, bias: torch.Tensor | None,
                           q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                           num_heads: int, num_kv_heads: int, eps: float, input_eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``qkv_rotary`` with keys and values in new tensors ``[..., Hkv, D]`` (qkv's leading
    axes: one or two), returned after the queries."""
    require(qkv.dim() in (2, 3), InvalidInputError,
            f"qkv_rotary: qkv must be [N, (Hq + 2 Hkv) * D] or [B, W, (Hq + 2 Hkv) * D], got "
            f"shape {tuple(qkv.shape)}")
    dim = cos.shape[-1]
    k = qkv.new_empty((*qkv.shape[:-1], num_kv_heads, dim))
    v = torch.empty_like(k)
    q = qkv_rotary(qkv, cos, sin, num_heads, num_kv_heads, k, v, q_norm, k_norm, eps, inputs,
                   input_eps, bias)
    return q, k, v


def _fake_qkv_rotary(qkv, cos, sin, inputs, bias, q_norm, k_norm, num_heads, num_kv_heads,
                     eps, input_eps):
    dim, lead = cos.shape[-1], qkv.shape[:-1]
    k = qkv.new_empty((*lead, num_kv_heads, dim))
    return qkv.new_empty((*lead, num_heads, dim)), k, torch.empty_like(k)


def _fake_silu_mul(gate_up, inputs=None, input_eps=1e-6):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def _fake_rms_norm(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_rotary_cos_sin(positions, inv_freq, dtype, repeat=1):
    shape = (*positions.shape, *((repeat,) if repeat > 1 else ()), 2 * inv_freq.shape[0])
    cos = positions.new_empty(shape, dtype=dtype)
    return cos, torch.empty_like(cos)


def _traced_op(name: str, launch, fake):
    """``launch`` as the op ``xgr::<name>``, a ``torch.library.triton_op`` (its wrapped
    launches are what AOTInductor compiles into a package). Under ``TRITON_INTERPRET=1``
    interpreted kernels cannot be traced, so the op then calls ``xgr::<name>_interpreted``,
    an opaque custom op with ``fake`` for its shapes (CPU tests trace and run it)."""
    interpreted = torch.library.custom_op(f"xgr::{name}_interpreted", launch, mutates_args=())
    interpreted.register_fake(fake)

    @functools.wraps(launch)
    def dispatch(*args, **kwargs):
        run = interpreted if c.interpreting() else launch
        return run(*args, **kwargs)

    return triton_op(f"xgr::{name}", dispatch, mutates_args=())


_traced_op("qkv_rotary", _functional_qkv_rotary, _fake_qkv_rotary)
# These launchers are functional already and serve as the ops' bodies; qkv_rotary's launcher
# writes into the caller's slot, so its op allocates the keys and values itself.
_traced_op("silu_mul", silu_mul, _fake_silu_mul)
_traced_op("rms_norm", rms_norm, _fake_rms_norm)
_traced_op("rotary_cos_sin", rotary_cos_sin, _fake_rotary_cos_sin)

# The ops whose kernels an engine package holds when it runs the layer kernels.
LAYER_OPS = ("xgr::qkv_rotary", "xgr::silu_mul", "xgr::rms_norm", "xgr::rotary_cos_sin")


def traced_qkv_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      inputs: torch.Tensor, bias: torch.Tensor | None,
                      q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                      num_heads: int, num_kv_heads: int, eps: float, input_eps: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``qkv_rotary`` as the op ``xgr::qkv_rotary``, for traced programs: qkv ``[N, ...]`` or
    ``[B, W, ...]``, its product input rows ``inputs`` (the input norm's row scale is always
    applied); returns q ``[..., Hq, D]`` and new k, v ``[..., Hkv, D]``."""
    return torch.ops.xgr.qkv_rotary(qkv, cos, sin, inputs, bias, q_norm, k_norm, num_heads,
                                    num_kv_heads, eps, input_eps)


def traced_silu_mul(gate_up: torch.Tensor, inputs: torch.Tensor | None,
                    input_eps: float) -> torch.Tensor:
    """``silu_mul`` as the op ``xgr::silu_mul``, for traced programs."""
    return torch.ops.xgr.silu_mul(gate_up, inputs, input_eps)


def traced_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm`` as the op ``xgr::rms_norm``, for traced programs."""
    return torch.ops.xgr.rms_norm(x, weight, eps)


def traced_rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                          repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary_cos_sin`` as the op ``xgr::rotary_cos_sin``, for traced programs."""
    return torch.ops.xgr.rotary_cos_sin(positions, inv_freq, dtype, repeat)
