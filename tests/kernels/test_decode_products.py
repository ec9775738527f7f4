"""The decode step's fused products (Triton) against the float64 composition of the steps they
replace: ``F.linear`` then ``reference.qkv_rotary`` / ``reference.silu_mul``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_engine import reference
from torch_engine.errors import InvalidInputError
from torch_engine.kernels.decode_products import (GATE_UP_TILE, QKV_TILE, ProductTile,
                                                  gate_up_silu, qkv_rotary_product)
from torch_engine.layers import rotary_cos_sin

CPU_DTYPES = [torch.float32, torch.float16]


def _gate_up_reference(h, weight):
    return reference.silu_mul(F.linear(h.double(), weight.double()))


def _qkv_case(kt, gen, rows_shape, hq, hkv, dim, hidden, dtype, bias, norm):
    rows = 1
    for size in rows_shape:
        rows *= size
    heads = hq + 2 * hkv
    h = kt.randn((*rows_shape, hidden), dtype, gen)
    weight = kt.randn((heads * dim, hidden), dtype, gen, hidden ** -0.5)
    qkv_bias = kt.randn((heads * dim,), dtype, gen, 0.1) if bias else None
    positions = torch.randint(0, 5000, rows_shape, generator=gen, device=gen.device)
    cos, sin = rotary_cos_sin(positions, dim, 1e6, dtype)
    norms = ((kt.randn((dim,), dtype, gen, 0.2) + 1.0), (kt.randn((dim,), dtype, gen, 0.2) + 1.0)
             ) if norm else (None, None)
    return h, weight, qkv_bias, cos, sin, norms


def _qkv_reference(h, weight, qkv_bias, cos, sin, hq, hkv, norms):
    qkv = F.linear(h.double(), weight.double(),
                   None if qkv_bias is None else qkv_bias.double())
    return reference.qkv_rotary(qkv, cos.double(), sin.double(), hq, hkv,
                                *(None if n is None else n.double() for n in norms), eps=1e-6)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("rows_shape,hidden,inter", [((2, 3), 40, 24), ((37,), 64, 48)])
def test_gate_up_silu_matches_reference(kt, gen, dtype, rows_shape, hidden, inter):
    # Ragged rows, columns and reduction against the 16-wide interpreter tile.
    h = kt.randn((*rows_shape, hidden), dtype, gen)
    weight = kt.randn((2 * inter, hidden), dtype, gen, hidden ** -0.5)
    out = gate_up_silu(h, weight)
    assert out.shape == (*rows_shape, inter) and out.dtype == dtype
    kt.check(out, _gate_up_reference(h, weight), dtype, "gate_up_silu", gen.initial_seed())


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("bias,norm", [(True, False), (False, True)], ids=["qwen2", "qwen3"])
@pytest.mark.parametrize("into_beams", [False, True])
def test_qkv_rotary_product_matches_reference(kt, gen, dtype, bias, norm, into_beams):
    hq, hkv, dim, hidden, batch, width = 6, 2, 32, 40, 2, 9
    h, weight, qkv_bias, cos, sin, norms = _qkv_case(kt, gen, (batch, width), hq, hkv, dim,
                                                     hidden, dtype, bias, norm)
    if into_beams:                                   # [B, W, slots, Hkv, D], slot 1
        keys = torch.full((batch, width, 2, hkv, dim), float("nan"), dtype=dtype,
                          device=gen.device)
        values = torch.full_like(keys, float("nan"))
        k_out, v_out = keys[:, :, 1], values[:, :, 1]
    else:
        k_out = torch.full((batch * width, hkv, dim), float("nan"), dtype=dtype,
                           device=gen.device)
        v_out = torch.full_like(k_out, float("nan"))
    q = qkv_rotary_product(h, weight, qkv_bias, cos, sin, hq, hkv, k_out, v_out, *norms,
                           eps=1e-6)
    want_q, want_k, want_v = _qkv_reference(h, weight, qkv_bias, cos, sin, hq, hkv, norms)
    seed = gen.initial_seed()
    kt.check(q, want_q, dtype, "q", seed)
    kt.check(k_out.reshape(want_k.shape), want_k, dtype, "k", seed)
    kt.check(v_out.reshape(want_v.shape), want_v, dtype, "v", seed)
    if into_beams:
        assert bool(keys[:, :, 0].isnan().all()) and bool(values[:, :, 0].isnan().all())


def test_products_reject_bad_inputs_by_name(device):
    h = torch.randn(4, 16, device=device)
    with pytest.raises(InvalidInputError, match=r"gate_up_weight must be \[2 I, H\]"):
        gate_up_silu(h, torch.randn(7, 16, device=device))
    with pytest.raises(InvalidInputError, match=r"weight.shape\[1\] \(H, h's last axis\)"):
        gate_up_silu(h, torch.randn(8, 12, device=device))
    with pytest.raises(InvalidInputError, match="weight.dtype"):
        gate_up_silu(h, torch.randn(8, 16, device=device).half())
    with pytest.raises(InvalidInputError, match="h must be contiguous in its last"):
        gate_up_silu(torch.randn(16, 4, device=device).t(), torch.randn(8, 16, device=device))
    hq, hkv, dim = 2, 1, 16
    cos = torch.ones(4, dim, device=device)
    kv = torch.empty(4, hkv, dim, device=device)
    weight = torch.randn((hq + 2 * hkv) * dim, 16, device=device)
    with pytest.raises(InvalidInputError, match=r"weight.shape\[0\] \(\(Hq \+ 2 Hkv\) \* D\)"):
        qkv_rotary_product(h, weight[:-1], None, cos, cos, hq, hkv, kv, kv)
    with pytest.raises(InvalidInputError, match=r"qkv_bias.shape\[0\]"):
        qkv_rotary_product(h, weight, torch.zeros(3, device=device), cos, cos, hq, hkv, kv, kv)
    with pytest.raises(InvalidInputError, match="cos must hold one"):
        qkv_rotary_product(h, weight, None, cos[:3], cos[:3], hq, hkv, kv, kv)
    with pytest.raises(InvalidInputError, match="k_out must hold one"):
        qkv_rotary_product(h, weight, None, cos, cos, hq, hkv, kv[:3], kv)
    with pytest.raises(InvalidInputError, match="q_norm and k_norm come together"):
        qkv_rotary_product(h, weight, None, cos, cos, hq, hkv, kv, kv,
                           q_norm=torch.ones(dim, device=device))


# ---- GPU: the model shapes, bf16, the table tiles and the sweep's candidates ----

QWEN2_05B = dict(hq=14, hkv=2, dim=64, hidden=896, inter=4864, bias=True, norm=False)
QWEN3_17B = dict(hq=16, hkv=8, dim=128, hidden=2048, inter=6144, bias=False, norm=True)
SWEEP_TILES = [ProductTile(64, 64, 64, 4, 4), ProductTile(64, 128, 64, 4, 3),
               ProductTile(128, 64, 64, 8, 3), ProductTile(32, 64, 128, 4, 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [256, 2048, 77])
@pytest.mark.parametrize("model", [QWEN2_05B, QWEN3_17B], ids=["qwen2-0.5b", "qwen3-1.7b"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_products_at_model_shapes(kt, gen, dtype, model, rows):
    seed = gen.initial_seed()
    h = kt.randn((rows, model["hidden"]), dtype, gen)
    weight = kt.randn((2 * model["inter"], model["hidden"]), dtype, gen, model["hidden"] ** -0.5)
    want = _gate_up_reference(h, weight)
    for tile in [GATE_UP_TILE, *SWEEP_TILES]:
        kt.check(gate_up_silu(h, weight, tile), want, dtype, f"gate_up_silu {tile}", seed)
    hq, hkv, dim = model["hq"], model["hkv"], model["dim"]
    h, weight, qkv_bias, cos, sin, norms = _qkv_case(kt, gen, (rows,), hq, hkv, dim,
                                                     model["hidden"], dtype, model["bias"],
                                                     model["norm"])
    want = _qkv_reference(h, weight, qkv_bias, cos, sin, hq, hkv, norms)
    for tile in [QKV_TILE, *SWEEP_TILES]:
        k_out = torch.full((rows, hkv, dim), float("nan"), dtype=dtype, device=gen.device)
        v_out = torch.full_like(k_out, float("nan"))
        q = qkv_rotary_product(h, weight, qkv_bias, cos, sin, hq, hkv, k_out, v_out, *norms,
                               eps=1e-6, tile=tile)
        for got, ref, name in zip((q, k_out, v_out), want, "qkv"):
            kt.check(got, ref, dtype, f"{name} {tile}", seed)
