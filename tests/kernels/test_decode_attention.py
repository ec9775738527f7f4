"""Triton xAttention decode against the float64 reference (``torch_engine.reference``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from torch_engine import reference
from xgr_common.errors import InvalidInputError
from torch_engine.kernels import decode_attention
from torch_engine.kernels.decode_attention import (_check_inputs, decode_attention_counted,
                                                   launch_decode)
from torch_engine.kernels.decode_tiling import (DECODE_TILES, DecodeConfig, decode_config_for,
                                                merge_counters, split_count)

CPU_DTYPES = [torch.float32, torch.float16]


def _inputs(kt, gen, lengths, width, hq, hkv, dim, slots, dtype, logit_scale=1.0):
    batch = len(lengths)
    cu = kt.cu_seqlens_of(lengths, gen.device)
    total = sum(lengths)
    s = logit_scale
    return dict(q=kt.randn((batch, width, hq, dim), dtype, gen, s),
                shared_k=kt.randn((total, hkv, dim), dtype, gen, s),
                shared_v=kt.randn((total, hkv, dim), dtype, gen),
                cu_seqlens=cu,
                beam_k=kt.randn((batch, width, slots, hkv, dim), dtype, gen, s),
                beam_v=kt.randn((batch, width, slots, hkv, dim), dtype, gen))


def _reference(inputs, num_own, scale=None):
    up = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    return reference.decode_attention(**up, num_own=num_own, scale=scale)


def _poisoned_run(inputs, num_own, config, scale=None):
    scale = _check_inputs(**inputs, num_own=num_own, scale=scale)
    out = torch.full_like(inputs["q"], float("nan"))
    return launch_decode(**inputs, num_own=num_own, scale=scale, config=config, out=out)


def _config(inputs):
    q, k = inputs["q"], inputs["shared_k"]
    return decode_config_for(q.shape[0], q.shape[1], q.shape[2] // k.shape[1], k.shape[1],
                             k.shape[0], q.shape[3], q.device)


@pytest.mark.parametrize("acc_in_dot, tma, maxnreg",
                         [(True, False, None), (False, False, None), (True, True, None),
                          (True, False, 128)],
                         ids=["acc-in-dot", "acc-added", "tma", "register-cap"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("hq,hkv,dim", [(2, 2, 64), (7, 1, 128)], ids=["G1-D64", "G7-D128"])
def test_ragged_batch_matches_reference(kt, gen, dtype, hq, hkv, dim, acc_in_dot, tma,
                                        maxnreg):
    # A one-token prompt, a prompt over several key tiles, one in between; 2 own tokens;
    # whole prompt key tiles also read through tensor-memory-access descriptors, and a launch
    # with registers capped.
    inputs = _inputs(kt, gen, [1, 37, 20], width=3, hq=hq, hkv=hkv, dim=dim, slots=2,
                     dtype=dtype)
    config = dataclasses.replace(_config(inputs), acc_in_dot=acc_in_dot, tma=tma,
                                 maxnreg=maxnreg)
    out = _poisoned_run(inputs, 2, config)
    kt.check(out, _reference(inputs, 2), dtype, "decode", gen.initial_seed())


@pytest.mark.parametrize("splits", [1, 3])
def test_prompt_alone_matches_reference(kt, gen, splits):
    """num_own = 0: one query row per request attends its prompt only (how prefill's last
    layer serves each request's last token); the own slots hold garbage that must not leak."""
    inputs = _inputs(kt, gen, [1, 50, 17], width=1, hq=4, hkv=2, dim=64, slots=1,
                     dtype=torch.float32)
    inputs["beam_k"].fill_(1e4)
    config = DecodeConfig(block_m=16, block_n=16, splits=splits, fused_merge=splits > 1)
    out = _poisoned_run(inputs, 0, config)
    kt.check(out, _reference(inputs, 0), torch.float32, f"prompt alone, splits={splits}",
             gen.initial_seed())


@pytest.mark.parametrize("fused", [False, True], ids=["merge-launch", "fused-merge"])
@pytest.mark.parametrize("splits", [2, 5])
def test_split_prompt_merges_to_reference(kt, gen, splits, fused):
    # 5 splits of a 1-token prompt leave empty splits: their -inf log-sum-exp must drop out.
    # Width 5 x 4 heads / 2 KV heads: 10 rows, so a 16-row tile holds padded rows too.
    inputs = _inputs(kt, gen, [1, 45], width=5, hq=4, hkv=2, dim=64, slots=3,
                     dtype=torch.float32)
    config = DecodeConfig(block_m=16, block_n=16, splits=splits, fused_merge=fused)
    out = _poisoned_run(inputs, 3, config)
    kt.check(out, _reference(inputs, 3), torch.float32, f"decode splits={splits}",
             gen.initial_seed())


def _request_major(kt, gen, lengths, stride, dtype, **shape):
    """Inputs whose prompts sit request-major (request b at ``b * stride``, ``seq_lens`` for its
    tokens) with every padding key large enough to dominate any row that read it."""
    inputs = _inputs(kt, gen, [stride] * len(lengths), dtype=dtype, **shape)
    lens = torch.tensor(lengths, dtype=torch.int32, device=gen.device)
    slot = torch.arange(stride * len(lengths), device=gen.device) % stride
    padding = slot >= lens.repeat_interleave(stride)
    inputs["shared_k"][padding] = 30.0
    inputs["shared_v"][padding] = 1.0e3
    return inputs, lens


@pytest.mark.parametrize("splits", [1, 3])
def test_request_major_prompts_read_only_their_tokens(kt, gen, splits):
    inputs, lens = _request_major(kt, gen, [5, 40, 1], 48, torch.float32, width=5, hq=4,
                                  hkv=2, dim=64, slots=2)
    config = DecodeConfig(block_m=16, block_n=16, splits=splits, fused_merge=splits > 1)
    scale = _check_inputs(**inputs, num_own=2, scale=None, seq_lens=lens)
    out = torch.full_like(inputs["q"], float("nan"))
    launch_decode(**inputs, num_own=2, scale=scale, config=config, out=out, seq_lens=lens)
    want = reference.decode_attention(**{k: (v.double() if v.is_floating_point() else v)
                                         for k, v in inputs.items()}, num_own=2, seq_lens=lens)
    kt.check(out, want, torch.float32, f"request-major splits={splits}", gen.initial_seed())
    # The public op takes the same argument.
    kt.check(decode_attention(**inputs, num_own=2, seq_lens=lens), want, torch.float32,
             "request-major op", gen.initial_seed())


def _counter_count(inputs) -> int:
    q, k = inputs["q"], inputs["shared_k"]
    return merge_counters(q.shape[0], q.shape[1], q.shape[2], k.shape[1], k.shape[0],
                          q.shape[3], q.device)


def test_shared_counters_serve_launch_after_launch_and_come_back_zeroed(kt, gen):
    """Launches of one shape share one zeroed counter buffer, as a search's layers do: each
    merges its splits correctly and leaves the counters at zero for the next."""
    inputs = _inputs(kt, gen, [200], width=2, hq=4, hkv=2, dim=64, slots=2,
                     dtype=torch.float32)
    assert _config(inputs).splits > 1 and _config(inputs).fused_merge
    count = _counter_count(inputs)
    assert count == 2                              # one row tile x 2 KV heads
    counters = torch.zeros(count + 3, dtype=torch.int32, device=inputs["q"].device)
    for step in range(3):
        inputs["q"] = kt.randn(inputs["q"].shape, torch.float32, gen)
        out = decode_attention_counted(**inputs, num_own=step % 3, counters=counters)
        kt.check(out, _reference(inputs, step % 3), torch.float32, f"shared counters {step}",
                 gen.initial_seed())
        assert not bool(counters.any()), counters


def test_shapes_that_do_not_split_need_no_counters(kt, gen):
    inputs = _inputs(kt, gen, [3], width=1, hq=2, hkv=2, dim=64, slots=1, dtype=torch.float32)
    assert _config(inputs).splits == 1 and _counter_count(inputs) == 0


@pytest.mark.parametrize("bad,match", [
    (lambda n: torch.zeros(n - 1, dtype=torch.int32), "at least 2 entries"),
    (lambda n: torch.zeros(n, dtype=torch.int64), "contiguous 1-D int32"),
    (lambda n: torch.zeros((n, 1), dtype=torch.int32), "contiguous 1-D int32")])
def test_bad_counters_name_the_rule(kt, gen, bad, match):
    inputs = _inputs(kt, gen, [200], width=2, hq=4, hkv=2, dim=64, slots=2,
                     dtype=torch.float32)
    counters = bad(_counter_count(inputs)).to(inputs["q"].device)
    with pytest.raises(InvalidInputError, match=match):
        decode_attention_counted(**inputs, num_own=1, counters=counters)


def test_public_op_one_own_token_and_custom_scale(kt, gen):
    inputs = _inputs(kt, gen, [9, 16], width=4, hq=7, hkv=1, dim=64, slots=2,
                     dtype=torch.float32)
    out = decode_attention(**inputs, num_own=1, scale=0.3)
    kt.check(out, _reference(inputs, 1, scale=0.3), torch.float32, "decode op",
             gen.initial_seed())


def _large_logits(inputs, kind: str, dim: int, keys=("shared_k", "beam_k")):
    """Make logits reach ~1e4 in magnitude, in place.

    spread: entries of std a with a^2 * sqrt(D) = 1e4, so logits differ by ~1e4 (one-hot
    softmax); offset: a shared component of +-100 in q and 100 in every key, so all logits sit
    near +-1e4 and differ by ~10 (a naive exp overflows, a max-subtracted one does not).
    """
    if kind == "spread":
        a = math.sqrt(1e4 / math.sqrt(dim))
        for name in ("q", *keys):
            inputs[name].mul_(a)
    else:
        sign = torch.where(torch.arange(inputs["q"].shape[0]) % 2 == 0, 1.0, -1.0)
        sign = sign.to(inputs["q"].device).view(-1, *([1] * (inputs["q"].dim() - 1)))
        inputs["q"][..., 0] = 100.0 * sign[..., 0]
        for name in keys:
            inputs[name][..., 0] = 100.0


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("kind", ["spread", "offset"])
def test_logits_of_1e4_stay_finite_and_accurate(kt, gen, splits, kind):
    dim = 64
    inputs = _inputs(kt, gen, [30, 18], width=2, hq=2, hkv=1, dim=dim, slots=2,
                     dtype=torch.float32)
    _large_logits(inputs, kind, dim)
    config = DecodeConfig(block_m=16, block_n=16, splits=splits)
    out = _poisoned_run(inputs, 2, config, scale=1.0)
    ref = _reference(inputs, 2, scale=1.0)
    assert bool(torch.isfinite(out).all()), "NaN/Inf at logits of 1e4"
    # fp32 logits of 1e4 carry ~1e-3 absolute rounding, which moves softmax weights by ~1e-3:
    # the fp32 norm tolerance cannot apply; 1e-2 still fails any unstable softmax.
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel <= 1e-2, f"rel error {rel:.3g} at logits of 1e4; seed {gen.initial_seed()}"


def test_config_splits_only_when_tiles_leave_the_gpu_idle():
    cuda = torch.device("cuda")
    # 0.5b heads at batch 1 (28 tiles for 132 SMs) split; batch 16 (448 tiles) does not.
    one = decode_config_for(1, 256, 7, 2, 1024, 64, cuda) if torch.cuda.is_available() else None
    if one is not None:
        assert one.splits > 1
        assert decode_config_for(16, 256, 7, 2, 16 * 1024, 64, cuda).splits == 1
    # Never split a short prompt into chunks below two key tiles.
    cpu = torch.device("cpu")
    assert decode_config_for(1, 2, 1, 1, 8, 64, cpu).splits == 1


@pytest.mark.parametrize("head_dim, tiles, length, want", [
    (64, 56, 1024, 4),     # qwen2-0.5b W 256: the measured best (8 splits: 13.4 against 10.0 us)
    (128, 64, 1024, 4),    # qwen3-1.7b W 256
    (128, 64, 5120, 4),    # 256 programs fill one wave of 2 x 132; 5 spilled into a second
    (128, 128, 4096, 2),   # qwen3-1.7b W 512: 3 splits made 1.45 waves
    (64, 14, 4096, 8),     # qwen2-0.5b W 64: few tiles, long prompt: more splits
    (64, 56, 100, 1),      # under two key tiles per chunk: no split
])
def test_split_count_fills_whole_waves(head_dim, tiles, length, want):
    """The split rule on an H200's 132 multiprocessors, at shapes of the batch-1 split sweep."""
    split_tile = DECODE_TILES[head_dim][1]
    got = split_count(tiles, length, split_tile, 132)
    assert got == want
    assert tiles * got <= split_tile.per_sm * 132 or got == 1
    # Each split holds whole key tiles, at least two, and at most 16 splits.
    assert 1 <= got <= 16 and (got == 1 or length / got >= 2 * split_tile.block_n - 1)


def _bad_cases():
    def base():
        return dict(q=torch.zeros(2, 3, 4, 64), shared_k=torch.zeros(10, 2, 64),
                    shared_v=torch.zeros(10, 2, 64),
                    cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32),
                    beam_k=torch.zeros(2, 3, 2, 2, 64), beam_v=torch.zeros(2, 3, 2, 2, 64),
                    num_own=2)

    def with_(**changes):
        case = base()
        case.update(changes)
        return case

    return {
        "q-rank": (with_(q=torch.zeros(3, 4, 64)), "q must have shape [B, W, Hq, D]"),
        "heads": (with_(q=torch.zeros(2, 3, 5, 64)), "multiple of shared_k heads"),
        "head-dim": (with_(q=torch.zeros(2, 3, 4, 48), shared_k=torch.zeros(10, 2, 48),
                           shared_v=torch.zeros(10, 2, 48),
                           beam_k=torch.zeros(2, 3, 2, 2, 48),
                           beam_v=torch.zeros(2, 3, 2, 2, 48)), "power of two"),
        "dtype": (with_(shared_v=torch.zeros(10, 2, 64, dtype=torch.float16)),
                  "shared_v.dtype must equal q.dtype"),
        "int-q": (with_(q=torch.zeros(2, 3, 4, 64, dtype=torch.int32)), "q.dtype must be"),
        "cu-len": (with_(cu_seqlens=torch.tensor([0, 10], dtype=torch.int32)), "B+1"),
        "cu-dtype": (with_(cu_seqlens=torch.tensor([0., 4., 10.])), "cu_seqlens.dtype"),
        "beam-shape": (with_(beam_v=torch.zeros(2, 3, 2, 1, 64)), "beam_v must have shape"),
        "num-own": (with_(num_own=3), "num_own must be an int in [0, S=2]"),
        "num-own-negative": (with_(num_own=-1), "num_own must be an int in [0, S=2]"),
        "stride": (with_(q=torch.zeros(2, 3, 64, 4).transpose(-1, -2)), "stride(-1) == 1"),
        "seq-lens-len": (with_(seq_lens=torch.tensor([4, 6, 1], dtype=torch.int32)),
                         "seq_lens.shape[0] (B, as q) must be 2"),
        "seq-lens-dtype": (with_(seq_lens=torch.tensor([4., 6.])), "seq_lens.dtype"),
        "seq-lens-rank": (with_(seq_lens=torch.tensor([[4, 6]], dtype=torch.int32)),
                          "seq_lens must have shape [B]"),
    }


@pytest.mark.parametrize("name", sorted(_bad_cases()))
def test_bad_input_names_argument_and_rule(name):
    case, message = _bad_cases()[name]
    with pytest.raises(InvalidInputError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        decode_attention(**case)


def test_cpu_tensors_without_interpreter_are_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    case, _ = _bad_cases()["q-rank"]
    case["q"] = torch.zeros(2, 3, 4, 64)
    with pytest.raises(InvalidInputError, match="needs CUDA tensors"):
        decode_attention(**case)


def test_inputs_beyond_int32_offsets_are_refused_while_tracing():
    # Meta tensors: the shape-only checks of the fake run without allocating 2**31 elements.
    def meta(*shape):
        return torch.empty(*shape, device="meta")

    total = 2**31 // (2 * 128) + 1
    with pytest.raises(InvalidInputError, match="shared_k spans"):
        _check_inputs(meta(1, 4, 16, 128), meta(total, 2, 128), meta(total, 2, 128),
                      torch.empty(2, dtype=torch.int32, device="meta"), meta(1, 4, 2, 2, 128),
                      meta(1, 4, 2, 2, 128), 2, None, devices=False)


def test_beam_kv_beyond_int32_offsets_is_accepted():
    """The own stage indexes the beam KV in int64: a beam-major cache whose layer view spans
    more than 2**31 elements (all layers' slots) passes the checks."""
    def meta(*shape):
        return torch.empty(*shape, device="meta")

    # [B, W, S, layers, Hkv, D] = 32 x 1024 x 2 x 40 x 8 x 128 (2.7e9), viewed per layer.
    cache = meta(32, 1024, 2, 40, 8, 128)
    layer = cache[:, :, :, 3]
    assert 1 + sum((n - 1) * st for n, st in zip(layer.shape, layer.stride())) > 2**31
    _check_inputs(meta(32, 1024, 16, 128), meta(32 * 64, 8, 128), meta(32 * 64, 8, 128),
                  torch.empty(33, dtype=torch.int32, device="meta"), layer, layer, 2, None,
                  devices=False)


def test_more_request_heads_than_the_grid_allows_are_refused():
    def meta(*shape):
        return torch.empty(*shape, device="meta")

    batch = 65535 // 2 + 1            # x 2 KV heads: one past the grid's second axis
    with pytest.raises(InvalidInputError, match="batch x KV heads must be at most 65535"):
        _check_inputs(meta(batch, 4, 4, 64), meta(batch, 2, 64), meta(batch, 2, 64),
                      torch.empty(batch + 1, dtype=torch.int32, device="meta"),
                      meta(batch, 4, 2, 2, 64), meta(batch, 4, 2, 2, 64), 2, None,
                      devices=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hq,hkv,dim", [(14, 2, 64), (16, 8, 128), (7, 7, 64)],
                         ids=["qwen2-0.5b", "qwen3-1.7b", "G1"])
@pytest.mark.parametrize("width", [64, 256])
def test_gpu_grid_matches_reference(kt, gen, dtype, hq, hkv, dim, width):
    inputs = _inputs(kt, gen, [1024, 1, 700], width=width, hq=hq, hkv=hkv, dim=dim, slots=2,
                     dtype=dtype)
    out = _poisoned_run(inputs, 2, _config(inputs))
    kt.check(out, _reference(inputs, 2), dtype, f"decode {dtype}", gen.initial_seed())


@pytest.mark.gpu
def test_gpu_decode_replays_in_a_cuda_graph(kt, gen):
    inputs = _inputs(kt, gen, [512, 300], width=64, hq=14, hkv=2, dim=64, slots=2,
                     dtype=torch.bfloat16)
    decode_attention(**inputs, num_own=2)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(**inputs, num_own=2)
    fresh = kt.randn(inputs["q"].shape, torch.bfloat16, gen)
    inputs["q"].copy_(fresh)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    kt.check(out, _reference(inputs, 2), torch.bfloat16, "graph replay", gen.initial_seed())


@pytest.mark.gpu
@pytest.mark.parametrize("splits,fused", [(1, False), (4, True), (4, False), (7, True)])
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("regime", [0, 1], ids=["full-tile", "split-tile"])
def test_gpu_every_table_tile_matches_reference(kt, gen, regime, dim, splits, fused):
    # The tiles decode_config_for may pick, with and without split prompts, in bf16.
    tile = DECODE_TILES[dim][regime]
    hq, hkv = (14, 2) if dim == 64 else (16, 8)
    inputs = _inputs(kt, gen, [1024, 1, 700], width=64, hq=hq, hkv=hkv, dim=dim, slots=2,
                     dtype=torch.bfloat16)
    config = DecodeConfig(tile.block_m, tile.block_n, splits, tile.num_warps, tile.num_stages,
                          fused_merge=fused, acc_in_dot=tile.acc_in_dot, tma=tile.tma)
    out = _poisoned_run(inputs, 2, config)
    kt.check(out, _reference(inputs, 2), torch.bfloat16, f"decode {config}", gen.initial_seed())


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[1000, 1, 700], [5000]], ids=["batch", "split-prompt"])
@pytest.mark.parametrize("hq,hkv,dim", [(14, 2, 64), (16, 8, 128)],
                         ids=["qwen2-0.5b", "qwen3-1.7b"])
def test_gpu_request_major_prompts_read_only_their_tokens(kt, gen, lengths, hq, hkv, dim):
    # The table's tiles (TMA key loads included) over request-major KV, as the static engine
    # packs it: bucket stride 1024 or 5120, padding keys poisoned.
    stride = 1024 if len(lengths) > 1 else 5120
    inputs, lens = _request_major(kt, gen, lengths, stride, torch.bfloat16, width=256, hq=hq,
                                  hkv=hkv, dim=dim, slots=2)
    out = decode_attention(**inputs, num_own=2, seq_lens=lens)
    want = reference.decode_attention(**{k: (v.double() if v.is_floating_point() else v)
                                         for k, v in inputs.items()}, num_own=2, seq_lens=lens)
    kt.check(out, want, torch.bfloat16, "request-major", gen.initial_seed())


@pytest.mark.gpu
def test_gpu_fused_merge_is_race_free_over_many_replays(kt, gen):
    # The last-finishing split merges: a missing release/acquire would show as a moving error.
    inputs = _inputs(kt, gen, [1024, 2048], width=64, hq=16, hkv=8, dim=128, slots=2,
                     dtype=torch.bfloat16)
    config = DecodeConfig(64, 64, 8, 4, 3, fused_merge=True)
    scale = _check_inputs(**inputs, num_own=2, scale=None)
    out = torch.empty_like(inputs["q"])
    launch_decode(**inputs, num_own=2, scale=scale, config=config, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_decode(**inputs, num_own=2, scale=scale, config=config, out=out)
    for replay in range(20):
        inputs["q"].copy_(kt.randn(inputs["q"].shape, torch.bfloat16, gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        kt.check(out, _reference(inputs, 2), torch.bfloat16, f"fused merge replay {replay}",
                 gen.initial_seed())


@pytest.mark.gpu
def test_gpu_shared_counters_over_layers_and_replays(kt, gen):
    """The engine's use: 24 launches of one shape (a search's layers) share one counter fill
    in a captured graph; each replay's every launch equals the reference."""
    inputs = _inputs(kt, gen, [1000], width=256, hq=14, hkv=2, dim=64, slots=2,
                     dtype=torch.bfloat16)
    count = _counter_count(inputs)
    assert count > 0
    outs = [torch.empty_like(inputs["q"]) for _ in range(24)]
    queries = [kt.randn(inputs["q"].shape, torch.bfloat16, gen) for _ in range(24)]

    def layers():
        counters = torch.zeros(count, dtype=torch.int32, device="cuda")
        for q, out in zip(queries, outs):
            out.copy_(decode_attention_counted(**{**inputs, "q": q}, num_own=2,
                                               counters=counters))
        return counters
    layers()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        counters = layers()
    for replay in range(3):
        for q in queries:
            q.copy_(kt.randn(q.shape, torch.bfloat16, gen))
        graph.replay()
        torch.cuda.synchronize()
        assert not bool(counters.any())
        for layer in (0, 11, 23):
            kt.check(outs[layer], _reference({**inputs, "q": queries[layer]}, 2),
                     torch.bfloat16, f"replay {replay} layer {layer}", gen.initial_seed())
