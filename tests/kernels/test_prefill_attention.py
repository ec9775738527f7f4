"""Triton segmented-mask prefill against the float64 reference (``torch_engine.reference``)."""

from __future__ import annotations

import math

import pytest
import torch

from torch_engine import reference
from xgr_common.errors import InvalidInputError
from torch_engine.kernels import prefill_attention
from torch_engine.kernels.prefill_attention import (FP32_TILE, PREFILL_TILES, PrefillConfig,
                                                    _check_inputs, launch_prefill, lpt_chunk,
                                                    prefill_config_for)
from xgr_common.layout import MaskMode

MODES = list(MaskMode)
# Ragged: a prompt over several 16-token tiles ending mid-tile, a one-token request, a prompt
# whose profile ends mid-tile.
LENGTHS = [45, 1, 30]


def _inputs(kt, gen, lengths, hq, hkv, dim, dtype, profile=10, item=4):
    total = sum(lengths)
    return dict(q=kt.randn((total, hq, dim), dtype, gen), k=kt.randn((total, hkv, dim), dtype, gen),
                v=kt.randn((total, hkv, dim), dtype, gen),
                cu_seqlens=kt.cu_seqlens_of(lengths, gen.device),
                segment_ids=kt.item_segments(lengths, profile, item, gen.device))


def _reference(inputs, mode, scale=None):
    up = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    return reference.prefill_attention(**up, mode=mode, scale=scale)


def _poisoned_run(inputs, mode, config=None, scale=None, stats=None, chunk=None):
    mode, scale = _check_inputs(**inputs, mode=mode, scale=scale)
    q = inputs["q"]
    config = config or prefill_config_for(q.shape[2], q.element_size())
    out = torch.full_like(inputs["q"], float("nan"))
    return launch_prefill(**inputs, mode=mode, scale=scale, config=config, stats=stats, out=out,
                          chunk=chunk)


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("hq,hkv,dim", [(2, 2, 128), (7, 1, 64)], ids=["G1-D128", "G7-D64"])
def test_every_mode_matches_reference_fp32(kt, gen, mode, hq, hkv, dim):
    inputs = _inputs(kt, gen, LENGTHS, hq, hkv, dim, torch.float32)
    kt.check(_poisoned_run(inputs, mode), _reference(inputs, mode), torch.float32,
             f"prefill {mode.value}", gen.initial_seed())


@pytest.mark.parametrize("mode", [MaskMode.ITEM_CAUSAL, MaskMode.SEGMENT_BIDIRECTIONAL],
                         ids=["item_causal", "segment"])
@pytest.mark.parametrize("acc_in_dot, tma, maxnreg",
                         [(True, False, None), (False, False, None), (True, True, None),
                          (True, False, 128)],
                         ids=["acc-in-dot", "acc-added", "tma", "register-cap"])
def test_fp16_matches_reference(kt, gen, mode, acc_in_dot, tma, maxnreg):
    # Both ways of accumulating P V (into the product, or added after it), whole key tiles
    # read through tensor-memory-access descriptors, and a launch with registers capped.
    inputs = _inputs(kt, gen, LENGTHS, 2, 1, 64, torch.float16)
    config = PrefillConfig(16, 16, 4, 1, acc_in_dot=acc_in_dot, tma=tma, maxnreg=maxnreg)
    kt.check(_poisoned_run(inputs, mode, config), _reference(inputs, mode), torch.float16,
             f"prefill fp16 {mode.value}", gen.initial_seed())


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
# The rule's own chunking runs in every loop; the forced chunkings are the slow part of the grid.
@pytest.mark.parametrize("chunk", [None, *(pytest.param(c, marks=pytest.mark.slow)
                                          for c in ((1, 1), (2, 1), (4, 2), (3, 1)))],
                         ids=["rule", "request-head", "two-requests", "all", "uneven-fallback"])
def test_equal_lengths_run_longest_first_in_every_chunking(kt, gen, mode, chunk):
    # Equal lengths take the longest-first order, chunk after chunk (requests x KV heads); a
    # chunk that does not divide the batch falls back to the ragged order. Every row is
    # written once (poisoned output) and matches the reference, and each program visits the
    # key tiles of its own query tile.
    lengths = [37] * 4
    inputs = _inputs(kt, gen, lengths, 4, 2, 16, torch.float32, profile=6, item=3)
    config = PrefillConfig(block_m=16, block_n=16, num_stages=1)
    num_tiles = sum(lengths) // 16 + len(lengths)
    stats = torch.full((num_tiles, 4), -1, dtype=torch.int32, device=gen.device)
    out = _poisoned_run(inputs, mode, config, stats=stats, chunk=chunk)
    kt.check(out, _reference(inputs, mode), torch.float32, f"prefill equal lengths {chunk}",
             gen.initial_seed())
    expected = _needed_tiles(inputs["cu_seqlens"], inputs["segment_ids"], mode, 16, 16,
                             num_tiles)
    for head in range(4):
        assert stats[:, head].cpu().tolist() == expected.tolist()


def test_chunks_keep_keys_and_values_within_a_third_of_l2():
    # (requests, KV heads) per chunk on the CPU's nominal 50 MB L2, for bf16 qwen3-1.7b heads
    # (8 KV heads of 128): a request's keys and values take 0.5 MB per KV head per 1024 tokens.
    cpu = torch.device("cpu")
    assert lpt_chunk(1, 1024, 8, 128, 2, cpu) == (1, 8)          # 4 MB: one chunk
    assert lpt_chunk(16, 16 * 1024, 8, 128, 2, cpu) == (16, 2)   # 8 MB a KV head
    assert lpt_chunk(16, 16 * 4096, 8, 128, 2, cpu) == (8, 1)    # 32 MB a KV head
    assert lpt_chunk(6, 6 * 8192, 8, 128, 2, cpu) == (3, 1)      # divisors of the batch
    assert lpt_chunk(1, 65536, 8, 128, 2, cpu) == (1, 1)         # one request overflows


@pytest.mark.parametrize("batch,length", [(4, 4096), (16, 8192), (3, 1000)],
                         ids=["4x4096", "16x8192", "3x1000"])
def test_chunks_divide_the_batch_and_heads_and_fit_the_budget(batch, length):
    # Equal lengths of bf16 qwen3-1.7b heads (8 KV heads of 128) on the CPU's nominal L2.
    from torch_engine.kernels import _common
    cpu = torch.device("cpu")
    budget = _common.l2_bytes(cpu) // 3
    requests, heads = lpt_chunk(batch, batch * length, 8, 128, 2, cpu)
    assert batch % requests == 0 and 8 % heads == 0
    assert requests * heads * length * 128 * 4 <= budget


def test_public_op_single_token_requests_and_custom_scale(kt, gen):
    inputs = _inputs(kt, gen, [1, 1, 20, 1], 2, 1, 64, torch.float32, profile=3, item=3)
    out = prefill_attention(**inputs, mode=MaskMode.ITEM_CAUSAL, scale=0.2)
    kt.check(out, _reference(inputs, MaskMode.ITEM_CAUSAL, 0.2), torch.float32, "prefill op",
             gen.initial_seed())


def test_batch_over_one_offset_load_with_empty_requests(kt, gen):
    # 70 requests (offsets read in two vector loads of 64), some empty, some of one token: each
    # tile finds its request and bounds from those loads alone.
    lengths = [(0, 1, 3, 7, 12)[i % 5] for i in range(70)]
    inputs = _inputs(kt, gen, lengths, 2, 1, 16, torch.float32, profile=2, item=3)
    mode = MaskMode.ITEM_CAUSAL
    kt.check(_poisoned_run(inputs, mode), _reference(inputs, mode), torch.float32,
             "prefill 70 requests", gen.initial_seed())


def test_config_table_picks_tiles_by_head_dim_and_dtype(monkeypatch):
    # The rule the GPU runs by (outside the interpreter): one tile per head size, whatever the
    # batch and lengths.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert prefill_config_for(64) == PREFILL_TILES[64] and PREFILL_TILES[64].maxnreg == 128
    assert prefill_config_for(128) == PREFILL_TILES[128] and PREFILL_TILES[128].tma
    assert prefill_config_for(256) == PREFILL_TILES[128]


@pytest.mark.parametrize("dim", [64, 128], ids=["D64", "D128"])
def test_config_table_gives_fp32_pointer_loads_without_a_register_cap(monkeypatch, dim):
    # The GPU's rule (outside the interpreter): fp32 inputs take pointer loads, no cap.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fp32 = prefill_config_for(dim, element_size=4)
    assert fp32 == FP32_TILE and not fp32.tma and fp32.maxnreg is None


def _needed_tiles(cu, seg, mode, block_m, block_n, num_tiles):
    """Key tiles each virtual query tile must visit, from the reference's dense mask: the
    allowed keys of a tile form one range [a, b), covered by ceil((b - a) / block_n) tiles."""
    bounds = cu.tolist()
    expected = torch.full((num_tiles,), -1, dtype=torch.int32)
    for b, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        mask = reference.request_mask(seg[start:end].cpu(), mode)
        for j, q0 in enumerate(range(0, end - start, block_m)):
            keys = mask[q0:q0 + block_m].any(0).nonzero().flatten()
            lo, hi = int(keys.min()), int(keys.max()) + 1
            assert keys.numel() == hi - lo, "allowed keys of a tile are not contiguous"
            expected[start // block_m + b + j] = math.ceil((hi - lo) / block_n)
    return expected


@pytest.mark.parametrize("profile", [20, 40], ids=["short-profile", "long-profile"])
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("block", [16, 32])
def test_visits_only_key_tiles_with_allowed_keys(kt, gen, mode, profile, block):
    # 6-token items in 16-token tiles: many tiles, many skipped. A 40-token profile outruns
    # the one-tile scan for segment bounds, so the binary-search fallback runs too. With
    # 32-token tiles an item running past a tile's last row takes one 16-key step, counted as
    # the one key tile it replaces.
    lengths = [70, 1, 37]
    inputs = _inputs(kt, gen, lengths, 1, 1, 16, torch.float32, profile=profile, item=6)
    config = PrefillConfig(block_m=block, block_n=block, num_stages=1)
    num_tiles = sum(lengths) // block + len(lengths)
    stats = torch.full((num_tiles, 1), -1, dtype=torch.int32, device=gen.device)
    out = _poisoned_run(inputs, mode, config, stats=stats)
    kt.check(out, _reference(inputs, mode), torch.float32, "prefill", gen.initial_seed())
    expected = _needed_tiles(inputs["cu_seqlens"], inputs["segment_ids"], mode, block, block,
                             num_tiles)
    assert stats[:, 0].cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("mode", [MaskMode.ITEM_CAUSAL, MaskMode.PREFIX_BIDIRECTIONAL],
                         ids=["item_causal", "prefix"])
def test_logits_of_1e4_stay_finite_and_accurate(kt, gen, mode):
    inputs = _inputs(kt, gen, [40, 9], 2, 1, 64, torch.float32)
    inputs["q"][..., 0] = 100.0
    inputs["q"][::2, :, 0] = -100.0
    inputs["k"][..., 0] = 100.0
    out = _poisoned_run(inputs, mode, scale=1.0)
    ref = _reference(inputs, mode, scale=1.0)
    assert bool(torch.isfinite(out).all()), "NaN/Inf at logits of 1e4"
    # fp32 logits near 1e4 carry ~1e-3 absolute rounding; 1e-2 fails any unstable softmax.
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel <= 1e-2, f"rel error {rel:.3g} at logits of 1e4; seed {gen.initial_seed()}"


def _bad_cases():
    def base():
        return dict(q=torch.zeros(10, 4, 64), k=torch.zeros(10, 2, 64), v=torch.zeros(10, 2, 64),
                    cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32),
                    segment_ids=torch.zeros(10, dtype=torch.int32))

    def with_(**changes):
        case = base()
        case.update(changes)
        return case

    return {
        "q-rank": (with_(q=torch.zeros(1, 10, 4, 64)), r"q must have shape \[T, Hq, D\]"),
        "tokens": (with_(k=torch.zeros(9, 2, 64), v=torch.zeros(9, 2, 64)), r"k.shape\[0\]"),
        "heads": (with_(k=torch.zeros(10, 3, 64), v=torch.zeros(10, 3, 64)), "multiple of k"),
        "v-shape": (with_(v=torch.zeros(10, 1, 64)), "v must have k's shape"),
        "dtype": (with_(k=torch.zeros(10, 2, 64, dtype=torch.bfloat16)), "k.dtype must equal"),
        "seg-dtype": (with_(segment_ids=torch.zeros(10, dtype=torch.int64)),
                      "segment_ids.dtype"),
        "seg-len": (with_(segment_ids=torch.zeros(9, dtype=torch.int32)),
                    r"segment_ids.shape\[0\]"),
        "cu-short": (with_(cu_seqlens=torch.tensor([0], dtype=torch.int32)), "B\\+1 >= 2"),
        "stride": (with_(q=torch.zeros(10, 64, 4).transpose(-1, -2)), r"stride\(-1\) == 1"),
        "mode": (with_(mode="diagonal"), "mode must be one of"),
        "scale": (with_(scale=-1.0), "scale must be a finite positive"),
    }


@pytest.mark.parametrize("name", sorted(_bad_cases()))
def test_bad_input_names_argument_and_rule(name):
    case, message = _bad_cases()[name]
    with pytest.raises(InvalidInputError, match=message):
        prefill_attention(**case)


def test_inputs_beyond_int32_offsets_are_refused_while_tracing():
    # Meta tensors: the shape-only checks of the fake run without allocating 2**31 elements.
    total = 2**31 // (4 * 64) + 1
    q = torch.empty(total, 4, 64, device="meta")
    k = torch.empty(total, 1, 64, device="meta")
    with pytest.raises(InvalidInputError, match="indexes in int32"):
        _check_inputs(q, k, k, torch.empty(2, dtype=torch.int32, device="meta"),
                      torch.empty(total, dtype=torch.int32, device="meta"),
                      MaskMode.ITEM_CAUSAL, None, devices=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("hq,hkv,dim", [(14, 2, 64), (16, 8, 128), (4, 4, 64)],
                         ids=["qwen2-0.5b", "qwen3-1.7b", "G1"])
def test_gpu_grid_matches_reference(kt, gen, dtype, mode, hq, hkv, dim):
    # The tile prefill_config_for picks for each head size and dtype, on one ragged batch.
    inputs = _inputs(kt, gen, [700, 1, 300, 129], hq, hkv, dim, dtype, profile=64, item=4)
    config = prefill_config_for(dim, inputs["q"].element_size())
    kt.check(_poisoned_run(inputs, mode, config), _reference(inputs, mode), dtype,
             f"prefill {mode.value} {dtype} {config}", gen.initial_seed())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("hq,hkv,dim", [(14, 2, 64), (16, 8, 128)],
                         ids=["qwen2-0.5b", "qwen3-1.7b"])
@pytest.mark.parametrize("chunk", [None, (1, 1)], ids=["rule", "request-head"])
def test_gpu_equal_lengths_longest_first(kt, gen, mode, hq, hkv, dim, chunk):
    # The engine's padded batches: equal lengths, so the longest-first order, with the op's
    # chunks and with one (request, KV head) per chunk.
    inputs = _inputs(kt, gen, [700] * 3, hq, hkv, dim, torch.bfloat16, profile=64, item=4)
    config = prefill_config_for(dim, inputs["q"].element_size())
    kt.check(_poisoned_run(inputs, mode, config, chunk=chunk), _reference(inputs, mode),
             torch.bfloat16, f"prefill equal lengths {mode.value} {chunk}", gen.initial_seed())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_gpu_visits_only_needed_tiles(kt, gen, mode):
    lengths = [1000, 3, 517]
    inputs = _inputs(kt, gen, lengths, 2, 1, 64, torch.bfloat16, profile=64, item=4)
    config = PREFILL_TILES[64]
    num_tiles = sum(lengths) // config.block_m + len(lengths)
    stats = torch.full((num_tiles, 2), -1, dtype=torch.int32, device=gen.device)
    _poisoned_run(inputs, mode, config, stats=stats)
    expected = _needed_tiles(inputs["cu_seqlens"], inputs["segment_ids"], mode, config.block_m,
                             config.block_n, num_tiles)
    assert stats[:, 0].cpu().tolist() == expected.tolist()
    assert stats[:, 1].cpu().tolist() == expected.tolist()


def test_tma_path_only_for_layouts_descriptors_can_address(monkeypatch):
    """``tma_ready``: heads packed in each row, unit last stride, 16-byte aligned base and row
    stride, not empty, and not while tracing; otherwise the pointer loads serve (the same
    results)."""
    from torch_engine.kernels import _common
    monkeypatch.setenv("TRITON_INTERPRET", "1")        # CPU tensors, as under the interpreter
    k = torch.zeros(10, 2, 64, dtype=torch.float16)
    assert _common.tma_ready(k, k)
    wide = torch.zeros(10, 2, 128, dtype=torch.float16)
    assert not _common.tma_ready(wide[..., :64], k)                    # heads not packed
    strided = k.transpose(1, 2).contiguous().transpose(1, 2)           # last stride 2
    assert not _common.tma_ready(strided, k)
    offset = torch.zeros(1 + 10 * 128, dtype=torch.float16)[1:].view(10, 2, 64)
    assert not _common.tma_ready(offset, k)                            # base off by 2 bytes
    assert not _common.tma_ready(torch.zeros(0, 2, 64, dtype=torch.float16), k)
    descriptors = _common.kv_descriptors(k, k, 32)
    assert [d.shape for d in descriptors] == [[10, 128], [10, 128]]
    assert [d.block_shape for d in descriptors] == [[32, 64], [32, 64]]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not _common.tma_ready(k, k)                                 # tracing: pointers
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _common.tma_ready(k, k)                                 # CPU, no interpreter


def test_register_cap_only_on_launches_with_addresses(monkeypatch):
    """``register_cap``: a tile's ``maxnreg`` becomes a launch option for eager and CUDA-graph
    launches; none without a cap, and none while tracing (the exported package keeps the
    compiler's register choice)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_engine.kernels import _common
    k = torch.zeros(4, 2, 64, dtype=torch.float16)
    assert _common.register_cap(128, k) == {"maxnreg": 128}
    assert _common.register_cap(None, k) == {}
    with FakeTensorMode() as fake_mode:
        fake = fake_mode.from_tensor(k)
        assert _common.register_cap(128, fake) == {}
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _common.register_cap(128, k) == {}
