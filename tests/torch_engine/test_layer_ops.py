"""The fused layer kernels (Triton; the CPU interpreter here) against the torch ops they replace."""

import copy

import pytest
import torch
import torch.nn.functional as F

from torch_engine import reference
from torch_engine.config import PRESETS
from xgr_common.errors import InvalidInputError
from torch_engine.kernels import layer_ops
from torch_engine.layers import apply_rotary, rotary_cos_sin, rotary_inv_freq
from torch_engine.model import Model
from xgr_common.tolerances import tolerance_for

FP32 = tolerance_for(torch.float32)
QWEN3_TINY = PRESETS["tiny"].replace(qk_norm=True, attention_bias=False, head_dim=32)


def rel_error(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("into_beams", [False, True])
@pytest.mark.parametrize("folded", [False, True])
def test_qkv_rotary_equals_split_norm_and_rotary(qk_norm, into_beams, folded):
    """Queries, keys and values of the fused product, keys and values written into a strided
    beam-KV slot or a contiguous prompt buffer; every element written, nothing else touched.
    ``folded``: the product came from weights with the input norm folded in, so each row is
    first scaled by 1 / rms of its input row, then the bias is added."""
    gen = torch.Generator().manual_seed(0)
    hq, hkv, dim, batch, width, hidden = 6, 2, 32, 2, 3, 40
    rows = batch * width
    qkv = torch.randn(batch, width, (hq + 2 * hkv) * dim, generator=gen)
    positions = torch.randint(0, 500, (batch, width), generator=gen)
    cos, sin = rotary_cos_sin(positions, dim, 10000.0, torch.float32)
    q_norm = torch.rand(dim, generator=gen) + 0.5 if qk_norm else None
    k_norm = torch.rand(dim, generator=gen) + 0.5 if qk_norm else None
    extra = {}
    full = qkv
    if folded:
        inputs = torch.randn(batch, width, hidden, generator=gen) * 3.0
        bias = torch.randn(qkv.shape[-1], generator=gen)
        extra = dict(inputs=inputs, input_eps=1e-5, bias=bias)
        full = qkv * torch.rsqrt(inputs.pow(2).mean(-1, keepdim=True) + 1e-5) + bias
    heads = full.view(batch, width, hq + 2 * hkv, dim)
    q, k, v = heads[..., :hq, :], heads[..., hq:hq + hkv, :], heads[..., hq + hkv:, :]
    if qk_norm:
        q, k = F.rms_norm(q, (dim,), q_norm, 1e-6), F.rms_norm(k, (dim,), k_norm, 1e-6)
    want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if into_beams:                                   # [B, W, slots, Hkv, D], slot 1
        keys = torch.full((batch, width, 2, hkv, dim), float("nan"))
        values = torch.full_like(keys, float("nan"))
        k_out, v_out = keys[:, :, 1], values[:, :, 1]
    else:
        k_out = torch.full((rows, hkv, dim), float("nan"))
        v_out = torch.full_like(k_out, float("nan"))
    got_q = layer_ops.qkv_rotary(qkv, cos, sin, hq, hkv, k_out, v_out, q_norm, k_norm, 1e-6,
                                 **extra)
    assert got_q.shape == (batch, width, hq, dim)
    assert rel_error(got_q, want_q) <= FP32.rel_norm
    assert rel_error(k_out.reshape(want_k.shape), want_k) <= FP32.rel_norm
    if folded:
        assert rel_error(v_out.reshape(v.shape), v) <= FP32.rel_norm
    else:
        assert torch.equal(v_out.reshape(v.shape), v)
    if into_beams:
        assert bool(keys[:, :, 0].isnan().all()) and bool(values[:, :, 0].isnan().all())


def test_silu_mul_equals_torch_with_and_without_the_row_scale():
    gen = torch.Generator().manual_seed(1)
    gate_up = torch.randn(2, 3, 2 * 80, generator=gen)
    gate, up = gate_up.chunk(2, dim=-1)
    assert rel_error(layer_ops.silu_mul(gate_up), F.silu(gate) * up) <= FP32.rel_norm
    inputs = torch.randn(2, 3, 24, generator=gen) * 5.0
    scale = torch.rsqrt(inputs.pow(2).mean(-1, keepdim=True) + 1e-5)
    got = layer_ops.silu_mul(gate_up, inputs, 1e-5)
    assert rel_error(got, F.silu(gate * scale) * (up * scale)) <= FP32.rel_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("folded", [False, True], ids=["plain", "folded"])
def test_qkv_rotary_matches_the_float64_reference(dtype, folded):
    """Fresh random inputs in each dtype; outputs poisoned first; against
    ``torch_engine.reference.layer_ops`` on the same inputs in float64. ``folded``: the
    product came from norm-folded weights (row scale from ``inputs``, then ``bias``)."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    tol = tolerance_for(dtype)
    hq, hkv, dim, rows = 4, 2, 16, 7
    qkv = torch.randn(rows, (hq + 2 * hkv) * dim, generator=gen).to(dtype)
    cos, sin = rotary_cos_sin(torch.randint(0, 4000, (rows,), generator=gen), dim, 1e6,
                              torch.float32)
    norms = (torch.rand(dim, generator=gen) + 0.5).to(dtype), (torch.rand(dim, generator=gen)
                                                               + 0.5).to(dtype)
    k_out = torch.full((rows, hkv, dim), float("nan"), dtype=dtype)
    v_out = torch.full_like(k_out, float("nan"))
    extra = {}
    if folded:
        inputs = (torch.randn(rows, 48, generator=gen) * 4.0).to(dtype)
        bias = torch.randn(qkv.shape[-1], generator=gen).to(dtype)
        extra = dict(inputs=inputs, input_eps=1e-5, bias=bias)
    q = layer_ops.qkv_rotary(qkv, cos, sin, hq, hkv, k_out, v_out, *norms, eps=1e-6, **extra)
    want = reference.qkv_rotary(qkv.double(), cos.double(), sin.double(), hq, hkv,
                                *(n.double() for n in norms), eps=1e-6,
                                **{k: v.double() if isinstance(v, torch.Tensor) else v
                                   for k, v in extra.items()})
    for name, got, ref in zip(("q", "k_out", "v_out"), (q, k_out, v_out), want):
        assert not got.isnan().any(), name
        assert rel_error(got, ref) <= tol.rel_norm, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_norm_and_swiglu_match_the_float64_references(dtype):
    """``rms_norm`` and ``silu_mul`` (with and without the row scale) on fresh random inputs
    in each dtype, against their float64 references."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    tol = tolerance_for(dtype)
    x = torch.randn(5, 48, generator=gen).to(dtype)
    weight = torch.rand(48, generator=gen).to(dtype)
    before = x.clone()
    got = layer_ops.rms_norm(x, weight, 1e-6)
    assert not got.isnan().any() and torch.equal(x, before)   # x itself is left as it was
    assert rel_error(got, F.rms_norm(x.double(), (48,), weight.double(), 1e-6)) <= tol.rel_norm
    gate_up = torch.randn(3, 2 * 40, generator=gen).to(dtype)
    assert rel_error(layer_ops.silu_mul(gate_up),
                     reference.silu_mul(gate_up.double())) <= tol.rel_norm
    rows_in = (torch.randn(3, 48, generator=gen) * 4.0).to(dtype)
    assert rel_error(layer_ops.silu_mul(gate_up, rows_in, 1e-5),
                     reference.silu_mul(gate_up.double(), rows_in.double(), 1e-5)
                     ) <= tol.rel_norm


def _rotary_args(**change):
    hq, hkv, dim, rows = 4, 2, 16, 3
    args = dict(qkv=torch.randn(rows, (hq + 2 * hkv) * dim), cos=torch.ones(rows, dim),
                sin=torch.zeros(rows, dim), num_heads=hq, num_kv_heads=hkv,
                k_out=torch.empty(rows, hkv, dim), v_out=torch.empty(rows, hkv, dim))
    args.update(change)
    return args


@pytest.mark.parametrize("change, words", [
    (dict(qkv=torch.randn(3, 100)), "qkv.shape[-1]"),
    (dict(qkv=torch.randn(3, 128).to(torch.int32)), "qkv.dtype"),
    (dict(cos=torch.ones(3, 12), sin=torch.zeros(3, 12)), "head_dim must be a power of two"),
    (dict(cos=torch.ones(2, 16), sin=torch.zeros(2, 16)), "cos must hold one"),
    (dict(k_out=torch.empty(3, 2, 16).to(torch.float16)), "k_out.dtype"),
    (dict(v_out=torch.empty(3, 16, 2).transpose(1, 2)), "v_out's last two axes"),
    (dict(k_out=torch.empty(4, 2, 16)), "k_out must hold one"),
    (dict(q_norm=torch.ones(16)), "q_norm and k_norm come together"),
    (dict(num_heads=1), "num_heads >= num_kv_heads"),
    (dict(inputs=torch.randn(2, 40)), "inputs must hold one contiguous"),
    (dict(inputs=torch.randn(40, 3).t()), "inputs must hold one contiguous"),
    (dict(inputs=torch.randn(3, 40), input_eps=0.0), "input_eps must be a positive float"),
    (dict(inputs=torch.randn(3, 40).long()), "inputs.dtype"),
    (dict(bias=torch.randn(100)), r"bias.shape[0]"),
    (dict(bias=torch.randn(2, 64)), "bias must have shape"),
])
def test_qkv_rotary_rejects_bad_inputs_by_name(change, words):
    with pytest.raises(InvalidInputError, match=words.replace("[", r"\[").replace("]", r"\]")):
        layer_ops.qkv_rotary(**_rotary_args(**change))


def test_norm_and_swiglu_reject_bad_inputs_by_name():
    x = torch.randn(2, 8)
    with pytest.raises(InvalidInputError, match=r"weight.shape\[0\]"):
        layer_ops.rms_norm(x, torch.ones(9), 1e-6)
    with pytest.raises(InvalidInputError, match="x.dtype"):
        layer_ops.rms_norm(x.long(), torch.ones(8), 1e-6)
    with pytest.raises(InvalidInputError, match="eps must be a positive float"):
        layer_ops.rms_norm(x, torch.ones(8), -1.0)
    with pytest.raises(InvalidInputError, match="last axis must be even"):
        layer_ops.silu_mul(torch.randn(2, 7))
    with pytest.raises(InvalidInputError, match="gate_up.dtype"):
        layer_ops.silu_mul(torch.ones(2, 8, dtype=torch.int64))
    with pytest.raises(InvalidInputError, match="inputs must hold one contiguous"):
        layer_ops.silu_mul(torch.randn(2, 8), torch.randn(3, 5))
    with pytest.raises(InvalidInputError, match="input_eps must be a positive float"):
        layer_ops.silu_mul(torch.randn(2, 8), torch.randn(2, 5), 0)


def _rotary_case(device: str, dtype: torch.dtype, dim: int, theta: float, repeat: int):
    positions = torch.tensor([[0, 1, 7], [999, 4999, 120_000]], device=device)
    freqs = rotary_inv_freq(dim, theta, torch.device(device))
    got = layer_ops.rotary_cos_sin(positions, freqs, dtype, repeat)
    rows = positions[..., None].expand(2, 3, repeat) if repeat > 1 else positions
    want = rotary_cos_sin(rows, dim, theta, dtype)
    shape = (2, 3, *((repeat,) if repeat > 1 else ()), dim)
    # Same float32 steps; cos and sin of two math libraries may differ in the last bit.
    tol = tolerance_for(dtype)
    for name, a, b in zip(("cos", "sin"), got, want):
        assert a.shape == shape and a.dtype == dtype, (name, a.shape, a.dtype)
        torch.testing.assert_close(a, b, atol=tol.atol, rtol=tol.rtol, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim,theta,repeat", [(64, 1e6, 1), (128, 1e4, 4), (16, 1e4, 3)])
def test_rotary_kernel_equals_the_torch_rows(dtype, dim, theta, repeat):
    _rotary_case("cpu", dtype, dim, theta, repeat)


def test_rotary_kernel_rejects_bad_inputs_by_name():
    freqs = rotary_inv_freq(8, 1e4, torch.device("cpu"))
    with pytest.raises(InvalidInputError, match="positions must be an integer tensor"):
        layer_ops.rotary_cos_sin(torch.zeros(3), freqs, torch.float32)
    with pytest.raises(InvalidInputError, match="inv_freq must be a contiguous float32"):
        layer_ops.rotary_cos_sin(torch.zeros(3, dtype=torch.int64), freqs.double(),
                                 torch.float32)
    with pytest.raises(InvalidInputError, match="repeat must be an int >= 1"):
        layer_ops.rotary_cos_sin(torch.zeros(3, dtype=torch.int64), freqs, torch.float32, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim,theta,repeat", [(64, 1e6, 256), (128, 1e6, 1)],
                         ids=["D64-repeat256", "D128"])
def test_gpu_rotary_kernel_equals_the_torch_rows(dtype, dim, theta, repeat):
    _rotary_case("cuda", dtype, dim, theta, repeat)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_engine_layer_kernels_equal_torch_ops_on_cuda(family):
    """Prefill and a decode step of the tiny model on CUDA (float32): the layer kernels give
    the torch ops' hidden states and KV."""
    from torch_engine.kv_cache import BeamKV, PackedPrompt
    from xgr_common.layout import MaskMode
    model = Model(PRESETS["tiny"] if family == "qwen2" else QWEN3_TINY)
    model.init_weights(5)
    model = model.cuda().eval()
    cfg = model.config
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(8, 1024, (2, 12), generator=gen).cuda()
    valid = torch.arange(12, device="cuda")[None] < torch.tensor([[12], [7]], device="cuda")
    prompt = PackedPrompt.from_padded(valid, torch.zeros_like(ids, dtype=torch.int32),
                                      MaskMode.CAUSAL)
    tokens = torch.randint(256, 1024, (2, 4), generator=gen).cuda()
    outs = []
    for kernels in (False, True):
        model.fuse_projections(kernels)
        with torch.no_grad():
            last, shared = model.prefill(prompt.pack(model.embed(ids)), prompt)
            beams = BeamKV(cfg.num_layers, 2, 4, 2, cfg.num_kv_heads, cfg.head_dim,
                           torch.float32, torch.device("cuda"))
            hidden = model.decode_step(tokens, prompt.lengths, shared, prompt, beams, 0)
        outs.append((last, shared.keys[1], hidden, beams.keys[:, :, 0]))
    for got, want in zip(outs[1], outs[0]):
        assert rel_error(got, want) <= FP32.rel_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_layer_kernel_composition_equals_the_unfused_layer(family, dtype):
    """The CUDA path's composition of a layer (both norms' weights folded into the products,
    their row scales applied by ``qkv_rotary`` and ``silu_mul``, both residual adds on the
    products), run through the interpreter on the CPU, against the layer's separate torch
    products in float64, within the dtype's tolerance. The caller's x is left as it was unless
    the caller owns it."""
    cfg = PRESETS["tiny"] if family == "qwen2" else QWEN3_TINY
    model = Model(cfg)
    model.init_weights(2)
    layer = model.model.layers[0]
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():                     # norms and biases away from their init values
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=gen) + 0.5)
        attn = layer.self_attn
        if cfg.attention_bias:
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * 0.1)
    rows, hkv, dim = 5, cfg.num_kv_heads, cfg.head_dim
    x = (torch.randn(rows, cfg.hidden_size, generator=gen) * 3.0).to(dtype)
    cos, sin = rotary_cos_sin(torch.arange(rows) * 7, dim, cfg.rope_theta, torch.float64)
    attended = torch.randn(rows, cfg.num_heads, dim, generator=gen).to(dtype)
    tol = tolerance_for(dtype)
    with torch.no_grad():
        layer = layer.to(dtype)
        exact = copy.deepcopy(layer).double()          # the same weights, in float64
        want_q, want_k, want_v = exact.project_qkv(x.double(), cos, sin)
        want = exact.finish(x.double(), attended.double())
        layer.fuse_projections(kernels=True)
        fused = layer._live_fused()
        k_out, v_out = (torch.empty(rows, hkv, dim, dtype=dtype) for _ in range(2))
        q = layer._qkv_kernel(x, cos.to(dtype), sin.to(dtype), fused, k_out, v_out)
        for got, ref in ((q, want_q), (k_out, want_k), (v_out, want_v)):
            assert got.dtype == dtype and rel_error(got, ref) <= tol.rel_norm
        before = x.clone()
        got = layer._finish_kernels(x, attended, fused, owned=False)
        assert torch.equal(x, before) and rel_error(got, want) <= tol.rel_norm
        mine = x.clone()
        got_owned = layer._finish_kernels(mine, attended, fused, owned=True)
        assert got_owned.data_ptr() == mine.data_ptr()
        assert rel_error(got_owned, want) <= tol.rel_norm


# The layer kernels compiled for sm_90 as an AOTInductor package launches them: its
# signature types a Python float argument float64 (the Triton JIT passes float32). Prints,
# per kernel, the float64 instructions of its PTX other than loading and narrowing the
# scalar itself.
_AS_INDUCTOR_TYPES_THEM = """
import re
from torch_engine.kernels import layer_ops as L
cases = {
    "silu_mul": (L._silu_mul_kernel, dict(gu_ptr="*bf16", x_ptr="*bf16", out_ptr="*bf16",
                 size="i32", hidden="i32", eps="fp64"),
                 dict(BLOCK=4096, SCALE=True, HIDDEN_P2=2048), 8),
    "rms_norm": (L._rms_norm_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16",
                 size="i32", eps="fp64"), dict(BLOCK=2048), 4),
    "qkv_rotary": (L._qkv_rotary_kernel, dict(
        qkv_ptr="*bf16", x_ptr="*bf16", bias_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16",
        qn_ptr="*bf16", kn_ptr="*bf16", q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16",
        width="i32", hidden="i32", in_eps="fp64", eps="fp64",
        **{n: "i32" for n in ("s_qkv", "s_cos", "s_q", "s_kb", "s_kw", "s_vb", "s_vw")}),
        dict(HQ=16, HKV=8, D=128, HQ_P2=16, HKV_P2=8, NORM=True, SCALE=True, BIAS=False,
             HIDDEN_P2=2048), 4),
}
for name, (fn, types, constexprs, warps) in cases.items():
    signature = {**types, **{n: "constexpr" for n in constexprs}}
    pointers = [i for i, n in enumerate(fn.arg_names) if n.endswith("_ptr")]
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                  attrs={(i,): [["tt.divisibility", 16]] for i in pointers}),
        target=TARGET, options=dict(num_warps=warps))
    narrowing = r"(\\.param|ld\\.param|cvt\\.rn\\.f32)"
    wide = [line.strip() for line in compiled.asm["ptx"].splitlines()
            if ".f64" in line and not re.match(narrowing, line.strip())]
    print("COMPILED", name, len(wide), wide[:3], usage(compiled))
"""


@pytest.mark.heavy
def test_the_layer_kernels_compute_in_float32_as_a_package_launches_them():
    """An AOTInductor package passes ``eps`` as a float64 scalar: a kernel that used it as
    given computed the row scale, and every product it scaled (the silu of a whole row),
    in float64 (three times the engine's time for ``silu_mul`` inside a package). Each
    kernel narrows it at entry, so its PTX holds no float64 arithmetic."""
    from tests.sm90_compile import assert_no_spills, compiled_lines
    lines = compiled_lines(_AS_INDUCTOR_TYPES_THEM, 3)
    for line in lines:
        assert line.split()[2] == "0", line
    assert_no_spills(lines)
