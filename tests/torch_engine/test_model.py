"""Model: parity with Hugging Face Qwen2/Qwen3, checkpoint I/O, prefill + decode == forward."""

import pytest
import torch

from torch_engine import attention as attn
from torch_engine import reference
from torch_engine.config import PRESETS, ModelConfig
from xgr_common.errors import ConfigError, InvalidInputError
from torch_engine.kv_cache import BeamKV, PackedPrompt
from xgr_common.layout import MaskMode
from torch_engine.model import Model
from xgr_common.tolerances import tolerance_for

FP32 = tolerance_for(torch.float32)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _hf_model(family: str):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, rope_theta=5000.0)
    if family == "qwen2":
        config = transformers.Qwen2Config(tie_word_embeddings=False, **common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.Qwen3Config(head_dim=24, tie_word_embeddings=True, **common)
        model = transformers.Qwen3ForCausalLM(config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF zeroes biases and sets norms to one: randomise every tensor
        for name, param in model.named_parameters():
            offset = 1.0 if "norm" in name else 0.0
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1 + offset)
    return model.eval()


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_from_pretrained_matches_hf_logits(tmp_path, family):
    hf = _hf_model(family)
    hf.save_pretrained(tmp_path)
    ours = Model.from_pretrained(tmp_path)
    assert ours.config.architecture == family
    ids = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert rel_error(got, expected) <= FP32.rel_norm


def test_save_pretrained_loads_in_hf_and_sharded_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = Model.from_preset("tiny", seed=3)
    ids = torch.randint(0, 1024, (2, 9))
    with torch.no_grad():
        expected = model(ids)
    model.save_pretrained(tmp_path / "single")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "single").eval()
    with torch.no_grad():
        assert rel_error(hf(ids).logits, expected) <= FP32.rel_norm
    model.save_pretrained(tmp_path / "sharded", max_shard_bytes=50_000)
    assert len(list((tmp_path / "sharded").glob("model-*-of-*.safetensors"))) > 2
    again = Model.from_pretrained(tmp_path / "sharded")
    with torch.no_grad():
        assert torch.equal(again(ids), expected)


def test_from_pretrained_rejects_mismatched_checkpoint(tmp_path):
    Model.from_preset("tiny").save_pretrained(tmp_path)
    config = ModelConfig.from_hf_dict({**PRESETS["tiny"].to_hf_dict(), "num_hidden_layers": 3})
    (tmp_path / "config.json").write_text(__import__("json").dumps(config.to_hf_dict()))
    with pytest.raises(ConfigError, match="missing.*model.layers.2"):
        Model.from_pretrained(tmp_path)


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="num_kv_heads"):
        PRESETS["tiny"].replace(num_kv_heads=3)
    with pytest.raises(ConfigError, match="model_type"):
        ModelConfig.from_hf_dict({"model_type": "llama"})


def test_forward_rejects_bad_inputs():
    model = Model.from_preset("tiny")
    with pytest.raises(InvalidInputError, match="exactly one"):
        model()
    with pytest.raises(InvalidInputError, match="segment_ids shape"):
        model(torch.zeros(2, 5, dtype=torch.long), segment_ids=torch.zeros(2, 4))


def _segments(length: int, generator: torch.Generator) -> torch.Tensor:
    """Non-decreasing segment ids starting at 0 with random segment lengths."""
    steps = (torch.rand(length, generator=generator) < 0.3).to(torch.int32)
    steps[0] = 0
    return torch.cumsum(steps, 0).to(torch.int32)


@pytest.mark.parametrize("mode", [MaskMode.CAUSAL, MaskMode.ITEM_CAUSAL,
                                  MaskMode.PREFIX_BIDIRECTIONAL])
def test_padded_forward_equals_each_row_alone(mode):
    model = Model.from_preset("tiny", seed=4)
    gen = torch.Generator().manual_seed(5)
    lengths = [11, 4, 8]
    ids = torch.randint(8, 1024, (3, 11), generator=gen)
    segs = torch.full((3, 11), -1, dtype=torch.int32)
    for row, n in enumerate(lengths):
        segs[row, :n] = _segments(n, gen)
    with torch.no_grad():
        batched = model(ids, segment_ids=segs, mode=mode)
        for row, n in enumerate(lengths):
            alone = model(ids[row:row + 1, :n], segment_ids=segs[row:row + 1, :n], mode=mode)
            assert rel_error(batched[row, :n], alone[0]) <= FP32.rel_norm


def test_torch_backends_match_reference_attention():
    gen = torch.Generator().manual_seed(6)
    lengths = torch.tensor([9, 3, 6])
    width, hq, hkv, dim, beams, slots = 9, 4, 2, 16, 5, 2
    valid = torch.arange(width)[None] < lengths[:, None]
    segs = torch.stack([_segments(width, gen) for _ in range(3)])
    prompt = PackedPrompt.from_padded(valid, segs, MaskMode.ITEM_CAUSAL)
    total = int(lengths.sum())
    q, k, v = (torch.randn(total, h, dim, generator=gen, dtype=torch.float64)
               for h in (hq, hkv, hkv))
    got = attn.prefill_attention(q, k, v, prompt, "torch")
    ref = reference.prefill_attention(q, k, v, prompt.cu_seqlens, prompt.segment_ids,
                                      MaskMode.ITEM_CAUSAL)
    assert rel_error(got, ref) <= 1e-12
    qd = torch.randn(3, beams, hq, dim, generator=gen, dtype=torch.float64)
    bk, bv = (torch.randn(3, beams, slots, hkv, dim, generator=gen, dtype=torch.float64)
              for _ in range(2))
    got = attn.decode_attention(qd, k, v, prompt, bk, bv, 2, "torch")
    ref = reference.decode_attention(qd, k, v, prompt.cu_seqlens, bk, bv, 2)
    assert rel_error(got, ref) <= 1e-12


QWEN3_TINY = PRESETS["tiny"].replace(qk_norm=True, attention_bias=False, head_dim=24)


def _tiny_model(family: str, seed: int) -> Model:
    """The tiny preset (Qwen2 layout) or its Qwen3 twin, random weights, eval mode."""
    if family == "qwen2":
        return Model.from_preset("tiny", seed=seed)
    model = Model(QWEN3_TINY)
    model.init_weights(seed)
    return model.eval()


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("segmented,static", [(False, False), (True, False), (True, True)])
def test_prefill_then_decode_equals_full_forward(family, segmented, static):
    """Packed prefill + two decode steps give the logits of forward() over prompt + tokens,
    where (hybrid mask) each generated token sits in a new segment of its own."""
    model = _tiny_model(family, seed=7)
    cfg = model.config
    gen = torch.Generator().manual_seed(8)
    lengths = torch.tensor([10, 6])
    width, beams, steps = 10, 3, 2
    ids = torch.randint(8, 1024, (2, width), generator=gen)
    segs = torch.stack([_segments(width, gen) for _ in range(2)]) if segmented else \
        torch.zeros(2, width, dtype=torch.int32)
    mode = MaskMode.ITEM_CAUSAL if segmented else MaskMode.CAUSAL
    valid = torch.arange(width)[None] < lengths[:, None]
    generated = torch.randint(256, 1024, (2, beams, steps), generator=gen)
    with torch.no_grad():
        prompt = PackedPrompt.from_padded(valid, segs, mode, static=static)
        last, shared = model.prefill(prompt.pack(model.embed(ids)), prompt)
        assert shared.keys[0].shape[0] == (valid.numel() if static else int(lengths.sum()))
        kv = BeamKV(cfg.num_layers, 2, beams, steps, cfg.num_kv_heads, cfg.head_dim,
                    torch.float32, torch.device("cpu"))
        hidden = [model.decode_step(generated[:, :, s], lengths + s, shared, prompt, kv, s)
                  for s in range(steps)]
        for row in range(2):
            n = int(lengths[row])
            for beam in range(beams):
                seq = torch.cat([ids[row, :n], generated[row, beam]])[None]
                seg = torch.cat([segs[row, :n], segs[row, n - 1] + 1 + torch.arange(steps,
                                 dtype=torch.int32)])[None]
                full = model(seq, segment_ids=seg, mode=mode)[0]
                ours = [model.level_logits(last[row], 0, cfg.vocab_size)] + [
                    model.level_logits(h[row, beam], 0, cfg.vocab_size) for h in hidden]
                for step, logits in enumerate(ours):
                    assert rel_error(logits, full[n - 1 + step]) <= FP32.rel_norm


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("mode", list(MaskMode))
@pytest.mark.parametrize("static", [False, True])
def test_prefill_last_hidden_equals_forward_under_every_mask_rule(mode, backend, static):
    """Prefill's last layer attends from each request's last token only (the prompt alone
    through the decode kernel, or the full masked attention's last rows when the rule hides
    part of the request from that token): its logits equal forward() at the last position."""
    model = _tiny_model("qwen2", seed=9)
    gen = torch.Generator().manual_seed(10)
    lengths = torch.tensor([13, 1, 7])
    width = 13
    ids = torch.randint(8, 1024, (3, width), generator=gen)
    segs = torch.stack([_segments(width, gen) for _ in range(3)])
    valid = torch.arange(width)[None] < lengths[:, None]
    with torch.no_grad():
        prompt = PackedPrompt.from_padded(valid, segs, mode, static=static)
        last, _ = model.prefill(prompt.pack(model.embed(ids)), prompt, backend)
        for row in range(3):
            n = int(lengths[row])
            full = model(ids[row:row + 1, :n], segment_ids=segs[row:row + 1, :n], mode=mode)[0]
            got = model.level_logits(last[row], 0, model.config.vocab_size)
            assert rel_error(got, full[n - 1]) <= FP32.rel_norm, (mode, row)


def test_beam_kv_reorder_copies_only_used_slots():
    """Beam w of request b takes its parent's first used slots in every layer, keys and values;
    later slots stay as they were."""
    gen = torch.Generator().manual_seed(3)
    kv = BeamKV(3, 2, 4, 2, 2, 8, torch.float32, torch.device("cpu"))
    kv.keys.copy_(torch.randn(kv.keys.shape, generator=gen))
    kv.values.copy_(torch.randn(kv.values.shape, generator=gen))
    keys, values = kv.keys.clone(), kv.values.clone()
    parents = torch.tensor([[2, 2, 0, 3], [1, 0, 0, 0]])
    kv.reorder(parents, used_slots=1)
    for b in range(2):
        for w in range(4):
            for layer in range(3):
                got_k, got_v = (t[b, w] for t in kv.layer(layer))
                want = int(parents[b, w])
                assert torch.equal(got_k[0], keys[b, want, 0, layer])
                assert torch.equal(got_v[0], values[b, want, 0, layer])
                assert torch.equal(got_k[1], keys[b, w, 1, layer])      # slot 1 untouched
                assert torch.equal(got_v[1], values[b, w, 1, layer])
    kv.reorder(parents, used_slots=0)                                   # nothing to copy
    assert torch.equal(kv.keys[:, :, 1], keys[:, :, 1])


@pytest.mark.parametrize("mode", list(MaskMode))
def test_request_major_packing_gives_real_rows_their_dynamic_result(mode):
    """Static packing is the padded rows flattened: request b at rows ``b * Lmax`` on, with
    ``seq_lens`` for its tokens and its padding tail in a segment after its last token's. A
    kernel reading ``prefill_cu_seqlens`` there gives every real row its dynamic (compact)
    result, and the last rows, packing and unpacking agree with the compact layout."""
    gen = torch.Generator().manual_seed(9)
    lengths = torch.tensor([4, 9, 2])
    valid = torch.arange(9)[None] < lengths[:, None]
    segs = torch.stack([_segments(9, gen) for _ in range(3)])
    dynamic = PackedPrompt.from_padded(valid, segs, mode)
    static = PackedPrompt.from_padded(valid, segs, mode, static=True)
    assert static.request_major and not dynamic.request_major
    assert static.cu_seqlens.tolist() == static.prefill_cu_seqlens.tolist() == [0, 9, 18, 27]
    assert static.seq_lens.tolist() == [4, 9, 2] and static.seq_lens.dtype == torch.int32
    assert torch.equal(static.rows, torch.arange(27))
    real = valid.flatten()
    assert torch.equal(static.rows[real], dynamic.rows)
    assert torch.equal(static.rows[static.last_rows()], dynamic.rows[dynamic.last_rows()])
    assert static.last_rows().tolist() == [3, 17, 19]
    padded = torch.randn(3, 9, 5, generator=gen)
    packed = static.pack(padded)
    assert packed.data_ptr() == padded.data_ptr()              # a view: no gather launch
    assert torch.equal(static.unpack(packed), padded)
    assert torch.equal(packed[real], dynamic.pack(padded))
    assert torch.equal(static.padded_segments(), dynamic.padded_segments())
    q, k, v = (torch.randn(valid.numel(), h, 16, generator=gen, dtype=torch.float64)
               for h in (4, 2, 2))
    got = reference.prefill_attention(q, k, v, static.prefill_cu_seqlens, static.segment_ids,
                                      mode)[real]
    want = reference.prefill_attention(q[real], k[real], v[real], dynamic.cu_seqlens,
                                       dynamic.segment_ids, mode)
    assert rel_error(got, want) <= 1e-12


def test_request_major_decode_attends_each_requests_tokens_only():
    """The decode kernel (interpreter) over request-major KV with ``seq_lens``: each request's
    prompt is its tokens, not its padding tail; equal to the compact layout's result."""
    gen = torch.Generator().manual_seed(10)
    lengths = torch.tensor([5, 16, 1])
    valid = torch.arange(16)[None] < lengths[:, None]
    static = PackedPrompt.from_padded(valid, torch.zeros(3, 16, dtype=torch.int32),
                                      MaskMode.CAUSAL, static=True)
    dynamic = PackedPrompt.from_padded(valid, torch.zeros(3, 16, dtype=torch.int32),
                                       MaskMode.CAUSAL)
    q = torch.randn(3, 4, 4, 16, generator=gen)
    k, v = (torch.randn(48, 2, 16, generator=gen) for _ in range(2))
    k[~valid.flatten()] = 1.0e4                    # padding keys that would dominate if read
    beam_k, beam_v = (torch.randn(3, 4, 2, 2, 16, generator=gen) for _ in range(2))
    real = valid.flatten()
    want = reference.decode_attention(q.double(), k[real].double(), v[real].double(),
                                      dynamic.cu_seqlens, beam_k.double(), beam_v.double(), 2)
    got_ref = reference.decode_attention(q.double(), k.double(), v.double(), static.cu_seqlens,
                                         beam_k.double(), beam_v.double(), 2,
                                         seq_lens=static.seq_lens)
    assert rel_error(got_ref, want) <= 1e-12
    got = attn.decode_attention(q, k, v, static, beam_k, beam_v, 2, "triton")
    assert rel_error(got.double(), want) <= FP32.rel_norm


# (lengths, mask rule, takes the library kernel when compact, when packed request-major)
LIBRARY_ROUTING = {"lone-causal": ([11], MaskMode.CAUSAL, True, True),
                   "batch-causal": ([11, 6, 16], MaskMode.CAUSAL, False, True),
                   "lone-item-causal": ([11], MaskMode.ITEM_CAUSAL, False, False)}


@pytest.mark.parametrize("case", LIBRARY_ROUTING)
@pytest.mark.parametrize("static", [False, True], ids=["compact", "request-major"])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)], ids=["grouped", "mha"])
def test_causal_rows_take_the_library_kernel_and_equal_the_reference(case, static, heads,
                                                                     monkeypatch):
    """With the "triton" backend a causal batch packed request-major, or a lone causal
    request, goes to SDPA's causal kernel (grouped heads included); its real rows equal the
    float64 reference. A compact batch of two, or a segmented rule, keeps the Triton kernel."""
    gen = torch.Generator().manual_seed(12)
    hq, hkv = heads
    lengths, mode, library_compact, library_static = LIBRARY_ROUTING[case]
    library = library_static if static else library_compact
    launched = []
    kernel = attn._kernel("prefill_attention")
    monkeypatch.setattr(attn, "_kernel",
                        lambda name: lambda *a: launched.append(name) or kernel(*a))
    lengths = torch.tensor(lengths)
    valid = torch.arange(16)[None] < lengths[:, None]
    segs = torch.stack([_segments(16, gen) for _ in lengths])
    prompt = PackedPrompt.from_padded(valid, segs, mode, static=static)
    rows = prompt.segment_ids.shape[0]
    q, k, v = (torch.randn(rows, h, 16, generator=gen, dtype=torch.float64)
               for h in (hq, hkv, hkv))
    got = attn.prefill_attention(q.float(), k.float(), v.float(), prompt, "triton")
    assert launched == ([] if library else ["prefill_attention"])
    real = valid.flatten() if static else slice(None)
    want = reference.prefill_attention(q, k, v, prompt.prefill_cu_seqlens,
                                       prompt.segment_ids, mode)
    assert rel_error(got[real].double(), want[real]) <= FP32.rel_norm


@pytest.mark.gpu
@pytest.mark.parametrize("heads,dim", [((14, 2), 64), ((16, 8), 128)])
def test_a_lone_causal_request_in_bf16_on_cuda_meets_the_reference(heads, dim):
    """The library path in bf16 at the presets' heads (cuDNN on Hopper), static padding tail
    included: within the bf16 tolerance of the float64 reference, every real row finite."""
    gen = torch.Generator().manual_seed(14)
    valid = torch.arange(384)[None] < 301
    segs = torch.zeros(1, 384, dtype=torch.int32)
    prompt = PackedPrompt.from_padded(valid.cuda(), segs.cuda(), MaskMode.CAUSAL, static=True)
    q, k, v = (torch.randn(384, h, dim, generator=gen, dtype=torch.float64)
               for h in (heads[0], heads[1], heads[1]))
    got = attn.prefill_attention(*(t.to("cuda", torch.bfloat16) for t in (q, k, v)), prompt,
                                 "triton")[:301].double().cpu()
    want = reference.prefill_attention(q, k, v, prompt.prefill_cu_seqlens.cpu(),
                                       prompt.segment_ids.cpu(), MaskMode.CAUSAL)[:301]
    assert bool(torch.isfinite(got).all())
    assert rel_error(got, want) <= tolerance_for(torch.bfloat16).rel_norm


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_fused_projections_equal_separate_and_yield_to_changed_weights(family):
    """The fused q/k/v and gate/up products (the norms' weights folded in) give the separate
    products' result; once a weight or a norm's weight changes in place (an optimizer step) or
    is replaced, the stale copies are not used."""
    model = _tiny_model(family, seed=3)
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(8, 1024, (2, 9), generator=gen)
    with torch.no_grad():
        for name, param in model.named_parameters():    # norms folded into the copies
            if name.endswith("layernorm.weight"):
                param.copy_(torch.rand(param.shape, generator=gen) + 0.5)
        separate = model(ids)
        model.fuse_projections()
        layer = model.model.layers[0]
        assert layer._live_fused() is not None
        fused = model(ids)
        assert rel_error(fused, separate) <= FP32.rel_norm
        layer.self_attn.v_proj.weight.mul_(1.5)        # in place: version counter moves
        assert layer._live_fused() is None
        changed = model(ids)
        assert rel_error(changed, separate) > 1e-3
        model.fuse_projections()
        assert rel_error(model(ids), changed) <= FP32.rel_norm
        layer.mlp.up_proj.weight = torch.nn.Parameter(layer.mlp.up_proj.weight * 2)
        assert layer._live_fused() is None
        # The norms' weights are folded into the copies: changing one retires them too.
        model.fuse_projections()
        before = model(ids)
        layer.post_attention_layernorm.weight.mul_(1.5)
        assert layer._live_fused() is None
        assert rel_error(model(ids), before) > 1e-3
        model.fuse_projections()
        layer.input_layernorm.weight.mul_(0.5)
        assert layer._live_fused() is None
        # A dtype change (Module.to gives the same parameters new data, no version) retires
        # them too, and fusing again copies in the new dtype.
        model.fuse_projections()
        want = model(ids)
        model.to(torch.float64)
        assert layer._live_fused() is None
        model.fuse_projections()
        assert layer._live_fused().qkv_weight.dtype == torch.float64
        assert rel_error(model(ids), want) <= FP32.rel_norm
    assert "fused" not in " ".join(model.state_dict())
