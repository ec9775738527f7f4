"""Input checks and device facts shared by the Triton attention launchers.

Every check raises ``InvalidInputError`` naming the argument, the rule, what was expected and
what came. Checks read shapes, dtypes, strides and devices only: reading tensor values (e.g.
whether ``cu_seqlens`` is sorted) would force a host synchronisation and break CUDA-graph capture,
so value preconditions are documented on the public functions instead.

Under ``torch.export`` with dynamic shapes the sizes are symbolic: a size rule then becomes a
runtime assertion of the exported program (``torch._check``) instead of a guard that would fix
the size, and tile choices read the trace's example sizes (``size_hint``) without guarding.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

from xgr_common.errors import InvalidInputError, require

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def require_size(condition, message: str) -> None:
    """A rule on sizes: ``InvalidInputError`` now for concrete sizes; for symbolic sizes a
    runtime assertion of the traced program (a guard would specialise the dynamic size)."""
    if isinstance(condition, torch.SymBool):
        torch._check(condition, lambda: message)
    else:
        require(bool(condition), InvalidInputError, message)


def size_hint(size, fallback: int = 1) -> int:
    """A size as a Python int for tile choices: a traced symbolic size gives its example value
    without a guard (any tiling computes the same result, so the choice only affects speed)."""
    if isinstance(size, torch.SymInt):
        node = size.node
        value = node.maybe_as_int()
        if value is None:
            value = getattr(node, "hint", None)
        return int(value) if isinstance(value, int) else fallback
    return int(size)


def size_bound(size) -> int | None:
    """A size's largest value as a Python int, for a block that must hold every size a traced
    program accepts (e.g. one program per row of a dynamic width): a traced symbolic size
    gives the upper end of its range (None when unbounded); a plain size is itself."""
    if isinstance(size, torch.SymInt):
        node = size.node
        value = node.maybe_as_int()
        if value is not None:
            return int(value)
        try:
            upper = node.shape_env.bound_sympy(node.expr).upper
            return int(upper) if upper.is_finite else None
        except (AttributeError, TypeError, ValueError, OverflowError):
            return None
    return int(size)


def bounded_size(op: str, name: str, size) -> int:
    """``size_bound`` of a size that must have one; raises ``InvalidInputError`` naming it."""
    bound = size_bound(size)
    require(bound is not None, InvalidInputError,
            f"{op}: {name} must have a bounded size in a traced program (give its dynamic "
            f"dimension a max), got {size}")
    return bound


def check_rank(op: str, name: str, tensor: torch.Tensor, rank: int, layout: str) -> None:
    require(isinstance(tensor, torch.Tensor), InvalidInputError,
            f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    require(tensor.dim() == rank, InvalidInputError,
            f"{op}: {name} must have shape {layout} ({rank} dims), got shape {tuple(tensor.shape)}")


def check_dim(op: str, name: str, tensor: torch.Tensor, axis: int, expected: int,
              what: str) -> None:
    got = tensor.shape[axis]
    require_size(got == expected, f"{op}: {name}.shape[{axis}] ({what}) must be {expected}, "
                 f"got {got} (shape {tuple(tensor.shape)})")


def check_same_shape(op: str, name: str, tensor: torch.Tensor, like_name: str,
                     like: torch.Tensor, layout: str) -> None:
    require(tensor.dim() == like.dim(), InvalidInputError,
            f"{op}: {name} must have {like_name}'s shape {layout} = {tuple(like.shape)}, got "
            f"{tuple(tensor.shape)}")
    for got, want in zip(tensor.shape, like.shape):
        require_size(got == want, f"{op}: {name} must have {like_name}'s shape {layout} = "
                     f"{tuple(like.shape)}, got {tuple(tensor.shape)}")


def check_float(op: str, names_tensors: dict[str, torch.Tensor]) -> torch.dtype:
    """All tensors share one float dtype among fp16/bf16/fp32; returns it."""
    (first_name, first), *_ = names_tensors.items()
    require(first.dtype in FLOAT_DTYPES, InvalidInputError,
            f"{op}: {first_name}.dtype must be one of float16/bfloat16/float32, got {first.dtype}")
    for name, tensor in names_tensors.items():
        require(tensor.dtype == first.dtype, InvalidInputError,
                f"{op}: {name}.dtype must equal {first_name}.dtype ({first.dtype}), "
                f"got {tensor.dtype}")
    return first.dtype


def check_index(op: str, name: str, tensor: torch.Tensor, allowed=INDEX_DTYPES) -> None:
    require(tensor.dtype in allowed, InvalidInputError,
            f"{op}: {name}.dtype must be one of {[str(d) for d in allowed]}, got {tensor.dtype}")
    require(tensor.is_contiguous(), InvalidInputError,
            f"{op}: {name} must be contiguous, got strides {tensor.stride()}")


def check_last_dim_contiguous(op: str, names_tensors: dict[str, torch.Tensor]) -> None:
    """Kernels read one head vector as a contiguous row: the last stride must be 1."""
    for name, tensor in names_tensors.items():
        require(tensor.shape[-1] <= 1 or tensor.stride(-1) == 1, InvalidInputError,
                f"{op}: {name} must be contiguous in its last (head_dim) axis, i.e. stride(-1) "
                f"== 1, got strides {tensor.stride()}")


def check_int32_offsets(op: str, names_tensors: dict[str, torch.Tensor]) -> None:
    """Kernels compute element offsets in int32: every input must span < 2**31 elements."""
    for name, tensor in names_tensors.items():
        span = 1 + sum(torch.sym_max(size - 1, 0) * abs(stride)
                       for size, stride in zip(tensor.shape, tensor.stride()))
        require_size(span < 2**31, f"{op}: {name} spans {span} elements (shape "
                     f"{tuple(tensor.shape)}, strides {tensor.stride()}); the kernel indexes in "
                     "int32, so at most 2**31 - 1: split the batch")


def check_head_dim(op: str, head_dim: int) -> None:
    ok = 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0
    require(ok, InvalidInputError,
            f"{op}: head_dim must be a power of two in [16, 256], got {head_dim}")


def check_devices(op: str, names_tensors: dict[str, torch.Tensor]) -> torch.device:
    """One device for all inputs; CUDA, or the CPU only under Triton's interpreter."""
    (first_name, first), *_ = names_tensors.items()
    for name, tensor in names_tensors.items():
        require(tensor.device == first.device, InvalidInputError,
                f"{op}: {name} is on {tensor.device} but {first_name} is on {first.device}; "
                "all inputs must share one device")
    require(first.device.type == "cuda" or (first.device.type == "cpu" and interpreting()),
            InvalidInputError,
            f"{op}: the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 for CPU "
            f"tensors), got {first.device}; use torch_engine.reference on the CPU")
    return first.device


def resolve_scale(op: str, scale: float | None, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    require(isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0,
            InvalidInputError,
            f"{op}: scale must be a finite positive float or None, got {scale!r}")
    return float(scale)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs take exact (IEEE) products so fp32 results meet the fp32 tolerance; tf32
    would give ~3e-4 relative error. fp16/bf16 operands ignore the setting."""
    return "ieee" if dtype == torch.float32 else "tf32"


def on_device(device: torch.device):
    """Launches go to ``device`` (not the current CUDA device); nothing to select on the CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (torch caches the properties; no device call);
    a nominal 4 under the CPU interpreter."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def l2_bytes(device: torch.device) -> int:
    """The GPU's L2 cache size (a nominal 50 MiB, a datacenter GPU's size, under the
    interpreter or on the CPU)."""
    if device.type != "cuda":
        return 50 * 2 ** 20
    return torch.cuda.get_device_properties(device).L2_cache_size


def tracing(*tensors: torch.Tensor) -> bool:
    """True under ``torch.export`` / ``torch.compile`` tracing (fake tensors, no addresses)."""
    return torch.compiler.is_compiling() or any(
        isinstance(t, torch._subclasses.FakeTensor) for t in tensors)


def register_cap(maxnreg: int | None, *tensors: torch.Tensor) -> dict:
    """Launch options that cap registers per thread (``maxnreg``) when a tile asks for it:
    fewer registers let one more program share a multiprocessor. Eager and CUDA-graph launches
    only: a traced launch (AOTInductor) keeps the compiler's own choice."""
    return {} if maxnreg is None or tracing(*tensors) else {"maxnreg": maxnreg}


def tma_ready(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether keys and values ``[T, Hkv, D]`` can be read through tensor-memory-access
    descriptors over ``[T, Hkv * D]``: a Hopper-or-newer GPU (or the interpreter), heads packed
    in each row, 16-byte aligned base and row stride; otherwise the pointer loads serve.
    Never while tracing (``torch.export``): a traced launch has no addresses to describe."""
    if tracing(k, v):
        return False
    if k.device.type == "cuda":
        if torch.cuda.get_device_capability(k.device)[0] < 9:
            return False
    elif not interpreting():
        return False
    for t in (k, v):
        dim = t.shape[2]
        if t.stride(2) != 1 or t.stride(1) != dim or t.shape[0] == 0:
            return False
        if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, block_n: int):
    """Host-side descriptors of keys and values ``[T, Hkv, D]`` as ``[T, Hkv * D]``, loading
    ``[block_n, D]`` blocks (check ``tma_ready`` first)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return tuple(TensorDescriptor(t, [t.shape[0], t.shape[1] * t.shape[2]], [t.stride(0), 1],
                                  [block_n, t.shape[2]]) for t in (k, v))


def page_descriptors(pool_k: torch.Tensor, pool_v: torch.Tensor, block_n: int, tma: bool):
    """TMA descriptors over one layer's pool ``[pages, page_tokens, Hkv, D]`` as
    ``[pages * page_tokens, Hkv * D]`` rows, loading ``[block_n, D]`` blocks, when ``tma``
    is asked for, a page holds whole key tiles, the pages are laid end to end and
    ``_common.tma_ready`` allows; otherwise the pools themselves (pointer loads)."""
    if not tma or tracing(pool_k, pool_v):   # no guards on a traced pool's symbolic sizes
        return pool_k, pool_v
    pages, page = pool_k.shape[:2]
    if page % block_n or pages * page >= 2 ** 31:
        return pool_k, pool_v
    if any(t.stride(0) != page * t.stride(1) for t in (pool_k, pool_v)):
        return pool_k, pool_v
    rows_k, rows_v = (t.view(pages * page, *t.shape[2:]) for t in (pool_k, pool_v))
    if not tma_ready(rows_k, rows_v):
        return pool_k, pool_v
    return kv_descriptors(rows_k, rows_v, block_n)
