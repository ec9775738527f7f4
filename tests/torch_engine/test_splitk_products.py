"""Split-depth products and their reduce inside the residual add (Triton; the CPU interpreter
here, bf16 and decode shapes on the GPU) against the float64 references."""

import pytest
import torch

from torch_engine import reference
from torch_engine.errors import InvalidInputError
from torch_engine.kernels import splitk_products as sk
from torch_engine.tolerances import tolerance_for


def rel_error(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows, cols, depth, splits", [
    (7, 40, 96, 3),      # ragged rows and columns, chunks of whole steps
    (16, 16, 100, 3),    # depth not a whole number of steps: the masked path
    (5, 33, 48, 5),      # more splits than steps: the empty ones are dropped
])
def test_partials_and_their_sum_match_float64(dtype, rows, cols, depth, splits):
    """Each depth chunk's partial and the reduce with and without the norm, fresh inputs each
    run, outputs poisoned first (``torch.empty`` buffers are checked for NaN)."""
    device = _device()
    gen = torch.Generator(device=device)
    gen.seed()
    tol = tolerance_for(dtype)
    x = torch.randn(rows, depth, generator=gen, device=device).to(dtype)
    weight = (torch.randn(cols, depth, generator=gen, device=device) * 0.1).to(dtype)
    config = sk.splitk_config_for(rows, cols, depth, device, splits=splits)
    parts = sk.product_partials(x, weight, config)
    want = reference.product_partials(x.double(), weight.double(), config.splits, config.block_k)
    assert parts.dtype == torch.float32 and parts.shape == want.shape, (parts.shape, want.shape)
    assert rel_error(parts, want) <= tolerance_for(torch.float32).rel_norm * 10, gen.initial_seed()
    assert rel_error(parts.sum(0), x.double() @ weight.double().T) <= tol.rel_norm

    residual = torch.randn(rows, cols, generator=gen, device=device).to(dtype)
    norm_w = (torch.rand(cols, generator=gen, device=device) + 0.5).to(dtype)
    total, normed = sk.add_partials(residual, parts, norm_w, 1e-6)
    want_total, want_normed = reference.add_partials(residual, want, norm_w.double(), 1e-6)
    assert not normed.isnan().any()
    # One rounding of a float32 sum against float64's: at most one unit apart.
    assert rel_error(total, want_total) <= tol.rel_norm
    assert rel_error(normed, want_normed) <= tol.rel_norm
    plain, none = sk.add_partials(residual, parts)
    assert none is None and torch.equal(plain, total)


def test_split_product_replaces_the_library_product_in_a_layer_block():
    """The decode block it replaces: ``add_rms_norm(x, attended @ W.T)``."""
    from torch_engine.kernels import layer_ops
    device = _device()
    gen = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(2, 6, 64, generator=gen, device=device)
    attended = torch.randn(12, 128, generator=gen, device=device)
    w_o = torch.randn(64, 128, generator=gen, device=device) * 0.05
    norm_w = torch.rand(64, generator=gen, device=device) + 0.5
    want_x, want_h = layer_ops.add_rms_norm(x, (attended @ w_o.T).view(2, 6, 64), norm_w, 1e-6)
    got_x, got_h = sk.add_partials(x, sk.product_partials(attended, w_o), norm_w, 1e-6)
    fp32 = tolerance_for(torch.float32).rel_norm
    assert got_x.shape == x.shape and got_h.shape == x.shape
    assert rel_error(got_x, want_x) <= fp32 and rel_error(got_h, want_h) <= fp32


def test_bad_inputs_are_named():
    device = _device()
    x, w = torch.randn(4, 32, device=device), torch.randn(8, 32, device=device)
    with pytest.raises(InvalidInputError, match=r"weight.shape\[1\] \(K, x's last axis\)"):
        sk.product_partials(x, torch.randn(8, 31, device=device))
    with pytest.raises(InvalidInputError, match=r"x must have shape \[R, K\]"):
        sk.product_partials(x[None], w)
    with pytest.raises(InvalidInputError, match="weight.dtype must equal x.dtype"):
        sk.product_partials(x, w.half())
    with pytest.raises(InvalidInputError, match="config must be a SplitKConfig"):
        sk.product_partials(x, w, sk.SplitKConfig(16, 16, 16, 0))
    parts = sk.product_partials(x, w)
    with pytest.raises(InvalidInputError, match=r"partials must have shape \[S, 4, 9\]"):
        sk.add_partials(torch.randn(4, 9, device=device), parts)
    with pytest.raises(InvalidInputError, match="partials must be contiguous float32"):
        sk.add_partials(torch.randn(4, 8, device=device), parts.double())
    with pytest.raises(InvalidInputError, match=r"weight.shape\[0\]"):
        sk.add_partials(torch.randn(4, 8, device=device), parts, torch.ones(9, device=device))
    with pytest.raises(InvalidInputError, match="eps must be a positive float"):
        sk.add_partials(torch.randn(4, 8, device=device), parts, torch.ones(8, device=device),
                        0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols, depth", [(256, 896, 896), (256, 896, 4864),
                                               (256, 2048, 2048), (2048, 2048, 6144)])
def test_decode_shapes_in_bf16_match_float64(rows, cols, depth):
    """The engine's decode shapes (qwen2-0.5b o/down at batch 1, qwen3-1.7b o and down at
    batch 8) with the default tiles, bf16."""
    gen = torch.Generator(device="cuda")
    gen.seed()
    x = torch.randn(rows, depth, generator=gen, device="cuda").bfloat16()
    weight = (torch.randn(cols, depth, generator=gen, device="cuda") * 0.02).bfloat16()
    residual = torch.randn(rows, cols, generator=gen, device="cuda").bfloat16()
    norm_w = (torch.rand(cols, generator=gen, device="cuda") + 0.5).bfloat16()
    parts = sk.product_partials(x, weight)
    total, normed = sk.add_partials(residual, parts, norm_w, 1e-6)
    want = residual.double() + x.double() @ weight.double().T
    tol = tolerance_for(torch.bfloat16).rel_norm
    assert rel_error(total, want) <= tol, gen.initial_seed()
    assert rel_error(normed, torch.nn.functional.rms_norm(
        want, (cols,), norm_w.double(), 1e-6)) <= tol
