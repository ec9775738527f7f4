"""Shared helpers of the kernel tests: fresh random inputs, packed layouts, oracle checks.

On a machine without a GPU the kernels run under Triton's interpreter on the CPU (the root
conftest sets ``TRITON_INTERPRET=1``); there only fp32/fp16 inputs are used, because the
interpreter computes ``tl.dot`` on bf16 operands wrongly.
"""

from __future__ import annotations

import types

import pytest
import torch

from xgr_common.tolerances import tolerance_for


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gen(device) -> torch.Generator:
    """A generator with a fresh seed each run (printed on failure by ``check``'s message)."""
    g = torch.Generator(device=device)
    g.seed()
    return g


def cu_seqlens_of(lengths: list[int], device) -> torch.Tensor:
    """``[B+1]`` int32 offsets of requests of ``lengths`` packed back to back."""
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def item_segments(lengths: list[int], profile: int, item: int, device) -> torch.Tensor:
    """Packed ``[T]`` int32 segment ids: ``profile`` tokens of segment 0, then items of
    ``item`` tokens numbered 1, 2, ... (the hybrid-mask layout of ``xgr_common.layout``)."""
    rows = []
    for length in lengths:
        pos = torch.arange(length)
        rows.append(torch.where(pos < profile, 0, 1 + (pos - profile).clamp(min=0) // item))
    return torch.cat(rows).to(torch.int32).to(device)


def randn(shape, dtype, gen, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=gen.device) * scale).to(dtype)


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str,
          seed: int | None = None) -> float:
    """Every element written and finite; ``||out - ref|| / ||ref||`` within the dtype's
    tolerance. Returns the relative error."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    finite = torch.isfinite(out)
    assert bool(finite.all()), (f"{what}: {int((~finite).sum())} of {out.numel()} outputs are "
                                f"NaN/Inf (unwritten or unstable); seed {seed}")
    rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    limit = tolerance_for(dtype).rel_norm
    assert rel <= limit, f"{what}: rel error {rel:.3g} > {limit:g} for {dtype}; seed {seed}"
    return rel


@pytest.fixture
def kt():
    """The helpers above, for test modules (importlib mode cannot import conftest by name)."""
    return types.SimpleNamespace(cu_seqlens_of=cu_seqlens_of, item_segments=item_segments,
                                 randn=randn, check=check)
