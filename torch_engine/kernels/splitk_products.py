"""Decode-sized matrix products split along their depth, reduced inside the residual add.

At decode a layer's output projections (``o_proj``: ``[R, Hq*D] x [Hq*D, H]``; ``down_proj``:
``[R, I] x [I, H]``) have few rows (R = batch x beams, 256 at batch 1) and a narrow output
(H = 896 for qwen2-0.5b): 128-square output tiles give only ``R / 128 * H / 128`` (here 14)
programs for 132 SMs. The library then splits the depth itself and adds a separate reduce
launch. Here the split partial products ``[S, R, H]`` (float32) are summed by the launch that
follows anyway: the residual add, with or without the RMSNorm of the sum
(``add_partials``), so the split costs no launch of its own.

* ``product_partials(x, weight, config)``: ``partials[s] = x[:, ks] @ weight[:, ks].T`` over
  the s-th depth chunk ``ks`` (whole ``block_k`` steps), float32.
* ``add_partials(x, partials, weight, eps)``: ``s = x + sum_s partials[s]`` rounded once to
  x's dtype (the residual stream), and ``rms_norm(s) * weight`` when ``weight`` is given.

Same functions as ``torch_engine.reference.layer_ops.product_partials`` / ``add_partials``.
Launchers check shapes, dtypes, strides and devices (never values) and raise
``InvalidInputError`` naming the argument and the rule; shapes alone choose each launch, so the
calls capture in CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from torch_engine.errors import InvalidInputError, require
from torch_engine.kernels import _common as c


@dataclass(frozen=True)
class SplitKConfig:
    """Tiling of one split product: output tile, depth step, depth chunks (splits)."""

    block_m: int
    block_n: int
    block_k: int
    splits: int
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _partials_kernel(x_ptr, w_ptr, part_ptr, rows, cols, depth, chunk, s_x, s_w,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge re-read the last one (no load mask); never stored.
    a_rows = tl.minimum(rm, rows - 1).to(tl.int64) * s_x
    b_rows = tl.minimum(rn, cols - 1).to(tl.int64) * s_w
    k_lo = split * chunk
    k_hi = tl.minimum(k_lo + chunk, depth)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + kk
        if EVEN_K:  # chunks of whole steps: no depth mask
            a = tl.load(x_ptr + a_rows[:, None] + ks[None, :])
            b = tl.load(w_ptr + b_rows[:, None] + ks[None, :])
        else:
            k_ok = (ks < k_hi)[None, :]
            a = tl.load(x_ptr + a_rows[:, None] + ks[None, :], mask=k_ok, other=0.0)
            b = tl.load(w_ptr + b_rows[:, None] + ks[None, :], mask=k_ok, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=DOT_PRECISION)
    out = part_ptr + (split * rows + rm[:, None]).to(tl.int64) * cols + rn[None, :]
    tl.store(out, acc, mask=(rm < rows)[:, None] & (rn < cols)[None, :])


@triton.jit
def _add_partials_kernel(x_ptr, part_ptr, w_ptr, sum_ptr, out_ptr, rows, size, splits, eps,
                         BLOCK: tl.constexpr, NORM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < size
    t = tl.load(x_ptr + row * size + cols, mask=ok, other=0.0).to(tl.float32)
    for s in range(splits):
        t += tl.load(part_ptr + (s * rows + row) * size + cols, mask=ok, other=0.0)
    total = t.to(sum_ptr.dtype.element_ty)                 # the residual stream's one rounding
    tl.store(sum_ptr + row * size + cols, total, mask=ok)
    if NORM:
        t = total.to(tl.float32)
        inv = tl.rsqrt(tl.sum(t * t, axis=0) / size + eps)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * size + cols, (t * inv * w).to(out_ptr.dtype.element_ty),
                 mask=ok)


# (rows at most, tile) from the product sweep at decode shapes (benchmarks/bench_products.py,
# H200); splits come from the shape (``splitk_config_for``).
_TILE = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4}
_INTERPRETER = SplitKConfig(16, 16, 16, 1, num_warps=4, num_stages=1)


def splitk_config_for(rows: int, cols: int, depth: int, device: torch.device,
                      splits: int | None = None) -> SplitKConfig:
    """Tiles from shapes alone: 64 x 128 output tiles and as many depth chunks (of at least
    four 64-deep steps) as fill about one wave of the GPU's SMs; ``splits`` overrides."""
    if c.interpreting():
        tile = _INTERPRETER
        chunks = splits or max(1, min(3, depth // (2 * tile.block_k)))
        return SplitKConfig(tile.block_m, tile.block_n, tile.block_k, chunks,
                            tile.num_warps, tile.num_stages)
    tiles = triton.cdiv(rows, _TILE["block_m"]) * triton.cdiv(cols, _TILE["block_n"])
    if splits is None:
        most = max(1, depth // (4 * _TILE["block_k"]))
        splits = max(1, min(most, c.multiprocessors(device) // max(tiles, 1)))
    return SplitKConfig(splits=splits, **_TILE)


def _check_product(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    c.check_rank(op, "x", x, 2, "[R, K]")
    c.check_rank(op, "weight", weight, 2, "[N, K]")
    c.check_dim(op, "weight", weight, 1, x.shape[1], "K, x's last axis")
    tensors = {"x": x, "weight": weight}
    c.check_devices(op, tensors)
    c.check_float(op, tensors)
    c.check_last_dim_contiguous(op, tensors)


def product_partials(x: torch.Tensor, weight: torch.Tensor,
                     config: SplitKConfig | None = None) -> torch.Tensor:
    """``[S, R, N]`` float32 partial products of ``x [R, K] @ weight [N, K].T`` over S depth
    chunks of whole ``config.block_k`` steps (``splitk_config_for`` when None); their sum is
    the product. x and weight: one float dtype, last axis contiguous, one device."""
    op = "product_partials"
    _check_product(op, x, weight)
    rows, depth = x.shape
    cols = weight.shape[0]
    if config is None:
        config = splitk_config_for(rows, cols, depth, x.device)
    require(isinstance(config, SplitKConfig) and config.splits >= 1, InvalidInputError,
            f"{op}: config must be a SplitKConfig with splits >= 1, got {config!r}")
    chunk = triton.cdiv(triton.cdiv(max(depth, 1), config.splits), config.block_k) * config.block_k
    # Chunks of whole steps can leave trailing splits empty: drop them (their partials would
    # be zeros the reduce reads for nothing).
    splits = max(1, triton.cdiv(depth, chunk))
    parts = torch.empty((splits, rows, cols), device=x.device, dtype=torch.float32)
    if rows == 0 or cols == 0:
        return parts
    if depth == 0:
        return parts.zero_()
    grid = (triton.cdiv(cols, config.block_n), triton.cdiv(rows, config.block_m), splits)
    with c.on_device(x.device):
        _partials_kernel[grid](
            x, weight, parts, rows, cols, depth, chunk, x.stride(0), weight.stride(0),
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            EVEN_K=depth % config.block_k == 0, DOT_PRECISION=c.dot_precision(x.dtype),
            num_warps=config.num_warps, num_stages=config.num_stages)
    return parts


def add_partials(x: torch.Tensor, partials: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``s = x + partials.sum(0)`` (float32 sum, one rounding to x's dtype) and, when
    ``weight [H]`` is given, ``rms_norm(s) * weight``; x: ``[..., H]``; partials:
    ``[S, R, H]`` float32 with R rows of x. Returns (s, normed or None), both like x."""
    op = "add_partials"
    require(isinstance(partials, torch.Tensor) and partials.dim() == 3, InvalidInputError,
            f"{op}: partials must be a 3-D [S, R, H] tensor, got "
            f"{tuple(partials.shape) if isinstance(partials, torch.Tensor) else type(partials)}")
    size = x.shape[-1]
    rows = x.numel() // max(size, 1)
    require(tuple(partials.shape[1:]) == (rows, size), InvalidInputError,
            f"{op}: partials must have shape [S, {rows}, {size}] (R rows and H of x "
            f"{tuple(x.shape)}), got {tuple(partials.shape)}")
    require(partials.dtype == torch.float32 and partials.is_contiguous(), InvalidInputError,
            f"{op}: partials must be contiguous float32, got {partials.dtype}")
    tensors = {"x": x, "partials": partials}
    if weight is not None:
        c.check_rank(op, "weight", weight, 1, "[H]")
        c.check_dim(op, "weight", weight, 0, size, "H, x's last axis")
        tensors["weight"] = weight
    c.check_devices(op, tensors)
    c.check_float(op, {"x": x})
    require(isinstance(eps, float) and eps > 0, InvalidInputError,
            f"{op}: eps must be a positive float, got {eps!r}")
    x = x.contiguous()
    total = torch.empty_like(x)
    normed = None if weight is None else torch.empty_like(x)
    if rows:
        with c.on_device(x.device):
            _add_partials_kernel[(rows,)](
                x, partials, x if weight is None else weight.contiguous(), total,
                total if normed is None else normed, rows, size, partials.shape[0], eps,
                BLOCK=triton.next_power_of_2(size), NORM=weight is not None, num_warps=4)
    return total, normed
