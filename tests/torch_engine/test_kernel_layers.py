"""The layer kernels as an exported package runs them (``torch_engine.kernel_layers``): the
fused kernels as traced ops (``xgr::qkv_rotary``, ``xgr::silu_mul``, ``xgr::rms_norm``,
``xgr::rotary_cos_sin``) equal to their launchers, ``kernel_model`` searching like the model it
copies, each weight once, and ``torch.export`` of the engine's program holding the ops
(Triton's interpreter on the CPU here; the CUDA package in ``test_gpu_engine_package``)."""

from __future__ import annotations

import pytest
import torch

from tests.torch_engine.engine_worlds import prompts, small_world
from torch_engine.catalog import Catalog
from torch_engine.config import PRESETS, EngineConfig
from torch_engine.engine import Engine
from torch_engine.kernel_layers import KernelLayer, kernel_model
from torch_engine.kernels import layer_ops
from torch_engine.layers import rotary_cos_sin, rotary_inv_freq
from torch_engine.model import Model
from torch_engine.search import search_features
from xgr_common.errors import ConfigError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.tolerances import tolerance_for
from xgr_export.config import ExportConfig
from xgr_export.export import resolve_layer_kernels
from xgr_export.torch_package import is_triton_op

FP32 = tolerance_for(torch.float32)
QWEN3_TINY = PRESETS["tiny"].replace(qk_norm=True, attention_bias=False, head_dim=32)


def fused_model(qwen3: bool, seed: int = 0) -> Model:
    model = Model(QWEN3_TINY) if qwen3 else Model(PRESETS["tiny"])
    model.init_weights(seed)
    with torch.no_grad():  # biases and norm weights that are not all zero and one
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.rand(param.shape, generator=torch.Generator().manual_seed(
                    len(name))) * 0.5)
    model.eval().fuse_projections(kernels=True)
    return model


def test_the_layer_ops_are_embeddable_and_asked_for_by_name():
    assert [name for name in layer_ops.LAYER_OPS if not is_triton_op(name)] == []
    assert resolve_layer_kernels("on", "cuda:0") is True
    assert resolve_layer_kernels("off", "cuda:0") is False
    assert ExportConfig(out="x").layer_kernels == "off"
    with pytest.raises(ConfigError, match="layer_kernels 'on' needs a CUDA export"):
        ExportConfig(out="x", layer_kernels="on")
    with pytest.raises(ConfigError, match="layer_kernels must be one of"):
        ExportConfig(out="x", layer_kernels="auto")


def _op_inputs(gen, rows_shape, hq=4, hkv=2, dim=32, hidden=48):
    qkv = torch.randn(*rows_shape, (hq + 2 * hkv) * dim, generator=gen)
    inputs = torch.randn(*rows_shape, hidden, generator=gen) * 2.0
    positions = torch.randint(0, 300, rows_shape, generator=gen)
    cos, sin = rotary_cos_sin(positions, dim, 10000.0, torch.float32)
    return qkv, cos, sin, inputs


@pytest.mark.parametrize("rows_shape", [(7,), (2, 3)])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_traced_qkv_rotary_equals_the_launcher(rows_shape, qk_norm):
    gen = torch.Generator().manual_seed(len(rows_shape) * 10 + qk_norm)
    qkv, cos, sin, inputs = _op_inputs(gen, rows_shape)
    bias = torch.randn(qkv.shape[-1], generator=gen)
    norms = ((torch.rand(32, generator=gen) + 0.5, torch.rand(32, generator=gen) + 0.5)
             if qk_norm else (None, None))
    q, k, v = layer_ops.traced_qkv_rotary(qkv, cos, sin, inputs, bias, *norms, 4, 2, 1e-6,
                                          1e-5)
    k_out = torch.full((*rows_shape, 2, 32), float("nan"))
    v_out = torch.full_like(k_out, float("nan"))
    want_q = layer_ops.qkv_rotary(qkv, cos, sin, 4, 2, k_out, v_out, *norms, eps=1e-6,
                                  inputs=inputs, input_eps=1e-5, bias=bias)
    assert torch.equal(q, want_q) and torch.equal(k, k_out) and torch.equal(v, v_out)
    assert k.shape == (*rows_shape, 2, 32) and q.shape == (*rows_shape, 4, 32)


def test_traced_elementwise_ops_equal_the_launchers():
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(5, 2 * 40, generator=gen)
    inputs = torch.randn(5, 48, generator=gen)
    assert torch.equal(layer_ops.traced_silu_mul(gate_up, inputs, 1e-5),
                       layer_ops.silu_mul(gate_up, inputs, 1e-5))
    assert torch.equal(layer_ops.traced_silu_mul(gate_up, None, 1e-5),
                       layer_ops.silu_mul(gate_up))
    weight = torch.rand(48, generator=gen) + 0.5
    assert torch.equal(layer_ops.traced_rms_norm(inputs, weight, 1e-6),
                       layer_ops.rms_norm(inputs, weight, 1e-6))
    freqs = rotary_inv_freq(32, 10000.0, torch.device("cpu"))
    positions = torch.randint(0, 900, (3,), generator=gen)
    for repeat in (1, 4):
        got = layer_ops.traced_rotary_cos_sin(positions, freqs, torch.bfloat16, repeat)
        want = layer_ops.rotary_cos_sin(positions, freqs, torch.bfloat16, repeat)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_ops_pass_opcheck():
    gen = torch.Generator().manual_seed(4)
    qkv, cos, sin, inputs = _op_inputs(gen, (6,))
    torch.library.opcheck(torch.ops.xgr.qkv_rotary.default,
                          (qkv, cos, sin, inputs, None, None, None, 4, 2, 1e-6, 1e-6))
    torch.library.opcheck(torch.ops.xgr.silu_mul.default,
                          (torch.randn(6, 80, generator=gen), inputs, 1e-6))
    torch.library.opcheck(torch.ops.xgr.rms_norm.default,
                          (inputs, torch.rand(48, generator=gen), 1e-6))
    torch.library.opcheck(torch.ops.xgr.rotary_cos_sin.default,
                          (torch.arange(5), rotary_inv_freq(32, 1e4, torch.device("cpu")),
                           torch.float32, 3))


@pytest.mark.parametrize("qwen3", [False, True])
def test_kernel_model_holds_each_weight_once_and_shares_them(qwen3):
    model = fused_model(qwen3)
    copy = kernel_model(model)
    names = [name for name, _ in copy.named_parameters()]
    assert not [n for n in names if any(part in n for part in (
        "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "layernorm"))]
    source = {id(p) for p in model.parameters()}
    assert all(id(p) in source for p in copy.parameters())
    assert all(isinstance(layer, KernelLayer) for layer in copy.model.layers)
    # The source model is untouched: its layers and their weights are still there.
    assert len(list(model.parameters())) > len(names)
    assert not any(isinstance(layer, KernelLayer) for layer in model.model.layers)
    fused = model.model.layers[0].fused
    assert copy.model.layers[0].qkv_weight is fused.qkv_weight


def test_kernel_model_needs_the_fused_copies():
    model = Model(PRESETS["tiny"]).eval()
    with pytest.raises(ConfigError, match="fuse_projections"):
        kernel_model(model)


@pytest.mark.parametrize("qwen3", [False, True])
@pytest.mark.parametrize("segmented", [True, False])
def test_kernel_model_searches_like_the_model(qwen3, segmented):
    model = fused_model(qwen3, seed=int(qwen3))
    ids, codes = small_world(seed=2, n=80)
    catalog = Catalog.from_arrays(ids, codes)
    tokens, lengths, segments = prompts(5, [9, 14, 6], segmented=segmented)
    tokens = tokens % model.config.vocab_size
    exclude = torch.tensor([[int(ids[0]), -1], [int(ids[3]), int(ids[4])], [-1, -1]])
    with torch.no_grad():
        want = search_features(model, catalog, tokens, lengths, segments, None, exclude, 8, 10)
        got = search_features(kernel_model(model), catalog, tokens, lengths, segments, None,
                              exclude, 8, 10)
    assert torch.equal(got[2], want[2])              # the value rules' flags
    assert torch.equal(got[0], want[0]), (got[0], want[0])
    finite = torch.isfinite(want[1])
    assert torch.equal(torch.isfinite(got[1]), finite)
    torch.testing.assert_close(got[1][finite], want[1][finite], rtol=FP32.rtol, atol=FP32.atol)


@pytest.mark.heavy  # torch.export of the whole search
def test_the_exported_program_holds_the_layer_ops_and_answers_like_the_engine():
    from xgr_export.engine_package import RecommendProgram, example_inputs

    model = fused_model(qwen3=True)
    ids, codes = small_world(seed=1, n=80)
    engine = Engine(model, Catalog.from_arrays(ids, codes), EngineConfig(cuda_graphs=False))
    spec = PromptSpec(model_hidden=model.config.hidden_size, keep_last=3)
    program = RecommendProgram(engine, 8, 10, layer_kernels=True)
    batch = torch.export.Dim("batch", min=1, max=8)
    length = torch.export.Dim.DYNAMIC
    dynamic = ({0: batch, 1: length}, {0: batch}, {0: batch, 1: length}, {0: batch},
               {0: batch, 1: torch.export.Dim("exclude", min=1, max=8)})
    exported = torch.export.export(program, example_inputs(engine, spec),
                                   dynamic_shapes=dynamic, strict=False)
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    for op in ("qkv_rotary", "silu_mul", "rms_norm", "rotary_cos_sin"):
        assert any(f"xgr.{op}" in t for t in targets), (op, sorted(targets))
    held = set(exported.state_dict) | set(exported.constants)
    assert not [n for n in held if "q_proj" in n or "gate_proj" in n], sorted(held)
    # Another batch size and prompt length than the trace's, against the eager engine.
    tokens, lengths, segments = prompts(9, [7, 12, 10], width=12)
    tokens = (tokens % (model.config.vocab_size - 8)).to(torch.int32)
    soft = torch.randn(3, spec.profile_tokens, model.config.hidden_size,
                       generator=torch.Generator().manual_seed(1))
    exclude = torch.tensor([[int(ids[1]), -1, -1], [-1, -1, -1], [int(ids[2]), int(ids[5]), -1]])
    with torch.no_grad():
        items, scores = exported.module()(tokens, lengths.to(torch.int32), segments, soft,
                                          exclude)
        want_items, want_scores = engine.recommend(
            tokens, lengths, segments, beam_width=8, top_k=10, prefix_embeds=soft,
            exclude_items=exclude)[:2]
    assert torch.equal(items, want_items)
    torch.testing.assert_close(scores, want_scores, rtol=FP32.rtol, atol=FP32.atol)


def _cached_search(model, catalog, tokens, lengths, pool, table, cached, slots):
    from torch_engine.cached_search import search_features_cached
    from torch_engine.search import SearchOptions

    return search_features_cached(model, catalog, tokens, lengths, None, None, None, 8, 10,
                                  SearchOptions(), None, None, pool, table, cached, slots)


def test_the_traced_kernel_model_stores_and_hits_like_the_engine():
    """A cached package's program (the kernel model, traced with gradients on) stores each
    layer's keys and values from where ``qkv_rotary`` returned them, one write a layer's keys
    or values; the engine (the model under no_grad) stores its packed buffer in one write.
    The pool a miss writes and the answers of the miss and of a hit from that pool agree."""
    model = fused_model(qwen3=True, seed=1)
    model.requires_grad_(False)
    ids, codes = small_world(seed=2, n=80)
    catalog = Catalog.from_arrays(ids, codes)
    tokens, lengths, _ = prompts(6, [13, 11], segmented=False)
    tokens = tokens % model.config.vocab_size
    cfg, page_tokens, frozen = model.config, 4, 6
    pages = -(-tokens.shape[1] // page_tokens)
    table = (torch.arange(2 * pages, dtype=torch.int32).reshape(2, pages) + 1)
    position = torch.arange(tokens.shape[1])
    flat = table[:, position // page_tokens].long() * page_tokens + position % page_tokens
    miss_slots = torch.where(position < frozen, flat, 0)            # frozen tokens kept
    cached = {"miss": torch.zeros(2, dtype=torch.int64),
              "hit": torch.full((2,), frozen, dtype=torch.int64)}
    hit_slots = torch.zeros((2, tokens.shape[1] - frozen), dtype=torch.int64)   # the sink
    answers, pools = {}, {}
    for name, runs, grad in (("engine", model, False), ("program", kernel_model(model), True)):
        pool = torch.zeros((cfg.num_layers, 2, 2 * pages + 1, page_tokens, cfg.num_kv_heads,
                            cfg.head_dim))
        with torch.set_grad_enabled(grad):
            miss = _cached_search(runs, catalog, tokens, lengths, pool, table, cached["miss"],
                                  miss_slots)
            pools[name] = pool[:, :, 1:].clone()                    # the sink page aside
            hit = _cached_search(runs, catalog, tokens, lengths, pool, table, cached["hit"],
                                 hit_slots)
        answers[name] = (miss, hit)
    torch.testing.assert_close(pools["program"], pools["engine"], rtol=FP32.rtol,
                               atol=FP32.atol)
    assert pools["engine"].abs().sum() > 0
    with torch.no_grad():
        want = search_features(model, catalog, tokens, lengths, None, None, None, 8, 10)
    for got in (*answers["engine"], *answers["program"]):
        assert torch.equal(got[0], want[0]), (got[0], want[0])
        finite = torch.isfinite(want[1])
        torch.testing.assert_close(got[1][finite], want[1][finite], rtol=FP32.rtol,
                                   atol=FP32.atol)
