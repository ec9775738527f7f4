"""Which custom ops an AOTInductor package can carry: ``torch.library.triton_op`` ones (their
Triton kernels are compiled in), not ``torch.library.custom_op`` ones (Python only)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from xgr_export.torch_package import is_triton_op


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


def _launch(x: torch.Tensor, out: torch.Tensor) -> None:
    # Launched from a helper, as the engine's kernels are: torch's static scan of the op's body
    # finds no kernel here, yet the op is a triton_op that AOTInductor decomposes.
    wrap_triton(_double_kernel)[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)


@triton_op("xgr_test::triton_double", mutates_args=())
def _triton_double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _launch(x, out)
    return out


@torch.library.custom_op("xgr_test::python_double", mutates_args=())
def _python_double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_triton_ops_are_embeddable_custom_ops_are_not():
    from torch._library.triton import get_triton_kernels_for_op

    assert is_triton_op("xgr_test::triton_double")
    assert get_triton_kernels_for_op("xgr_test::triton_double") == []  # why the scan is no test
    assert not is_triton_op("xgr_test::python_double")
    assert not is_triton_op("aten::add")
