"""Attention over cached pages: the Triton kernels and the engine's plain-torch path against
the float64 reference (``torch_engine.reference.paged_attention``), and the launchers'
refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torch_engine import attention as attn
from torch_engine.kernels import paged_attention as kernels
from torch_engine.kernels.decode_attention import PagedPrefix, launch_decode
from torch_engine.kernels.decode_tiling import DecodeConfig, decode_config_for, merge_counters
from torch_engine.kv_cache import CachedPrefix, PackedPrompt
from torch_engine.reference import paged_attention as reference
from xgr_common.errors import InvalidInputError
from xgr_common.layout import MaskMode

MODES = [MaskMode.CAUSAL, MaskMode.ITEM_CAUSAL]
PAGE = 16


def _world(kt, gen, cached, suffix, hq, hkv, dim, dtype, pages=12, page=PAGE):
    """A pool with each request's cached tokens on scattered pages of ``page`` tokens, packed
    suffixes with item segments (3-token items after a 2-token head) and their offsets."""
    batch = len(cached)
    device = gen.device
    pool_k = kt.randn((pages + 1, page, hkv, dim), dtype, gen)
    pool_v = kt.randn((pages + 1, page, hkv, dim), dtype, gen)
    order = torch.randperm(pages, generator=gen, device=device) + 1
    width = max(1, max(-(-c // page) for c in cached))
    table = torch.zeros((batch, width), dtype=torch.int32, device=device)
    used = 0
    for b, c in enumerate(cached):
        count = -(-c // page)
        table[b, :count] = order[used:used + count]
        used += count
    total = sum(suffix)
    return dict(
        q=kt.randn((total, hq, dim), dtype, gen), k=kt.randn((total, hkv, dim), dtype, gen),
        v=kt.randn((total, hkv, dim), dtype, gen), cu_seqlens=kt.cu_seqlens_of(suffix, device),
        segment_ids=kt.item_segments(suffix, 2, 3, device), pool_k=pool_k, pool_v=pool_v,
        block_table=table,
        cached_lens=torch.tensor(cached, dtype=torch.int32, device=device))


def _double(inputs):
    return {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}


CASES = [([0, 5, 37], [7, 20, 33]), ([16, 48], [1, 40]), ([70], [3])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("cached, suffix", CASES, ids=["ragged", "page-ends", "long-cache"])
def test_paged_prefill_matches_the_reference(kt, gen, dtype, mode, cached, suffix):
    inputs = _world(kt, gen, cached, suffix, 4, 2, 32, dtype)
    want = reference.paged_prefill_attention(**_double(inputs), mode=mode)
    got = kernels.paged_prefill_attention(**inputs, mode=mode, max_len=max(suffix))
    kt.check(got, want, dtype, f"paged prefill {mode.value} {cached}/{suffix}")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("hq, hkv, config", [
    (4, 2, kernels.PagedPrefillConfig(16, 16, heads=2)),
    (7, 1, kernels.PagedPrefillConfig(4, 16, heads=8)),
    (6, 2, kernels.PagedPrefillConfig(16, 32, heads=4)),
    (4, 2, kernels.PagedPrefillConfig(32, 16))], ids=["G2", "G7-padded", "G3-padded", "per-head"])
def test_paged_prefill_tilings_match_the_reference(kt, gen, mode, hq, hkv, config):
    """Every tiling the rule may pick: a KV head's group stacked in one program (padded when
    the group is not a power of two) and one query head a program; suffixes longer and
    shorter than a tile, caches of whole and partial tiles."""
    cached, suffix = [0, 16, 45], [9, 40, 70]
    inputs = _world(kt, gen, cached, suffix, hq, hkv, 32, torch.float16)
    want = reference.paged_prefill_attention(**_double(inputs), mode=mode)
    got = kernels.launch_paged_prefill(**inputs, mode=mode, max_len=max(suffix), config=config)
    kt.check(got, want, torch.float16, f"paged prefill {mode.value} {config}")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("page, block_n, tma", [
    (32, 16, True), (32, 32, False), (32, 32, True), (16, 32, True)],
    ids=["2-tiles-a-page-tma", "page-tile-pointers", "page-tile-tma", "gathered-rows"])
def test_cached_tiles_load_by_page_or_by_row(kt, gen, mode, page, block_n, tma):
    """A page holding whole key tiles loads each tile with one page index (pointers or TMA
    descriptors over the pool); a tile wider than a page gathers a page index a row. The
    prefill and the paged decode, caches ending inside a tile and on a page edge."""
    cached, suffix = [0, 32, 77], [9, 40, 5]
    inputs = _world(kt, gen, cached, suffix, 4, 2, 32, torch.float16, pages=8, page=page)
    want = reference.paged_prefill_attention(**_double(inputs), mode=mode)
    config = kernels.PagedPrefillConfig(16, block_n, tma=tma)
    got = kernels.launch_paged_prefill(**inputs, mode=mode, max_len=max(suffix), config=config)
    kt.check(got, want, torch.float16, f"paged prefill page {page} {config}")
    beam = kt.randn((3, 5, 2, 2, 32), torch.float16, gen)
    decode = dict(q=kt.randn((3, 5, 4, 32), torch.float16, gen), shared_k=inputs["k"],
                  shared_v=inputs["v"], cu_seqlens=inputs["cu_seqlens"], beam_k=beam,
                  beam_v=beam.flip(1))
    pages = {key: inputs[key] for key in ("pool_k", "pool_v", "block_table", "cached_lens")}
    want = reference.paged_decode_attention(**_double({**decode, **pages}), num_own=2)
    for splits in (1, 3):
        config = DecodeConfig(block_m=16, block_n=block_n, splits=splits, num_stages=1,
                              fused_merge=True, tma=tma)
        got = launch_decode(**decode, num_own=2, scale=32 ** -0.5, config=config,
                            paged=PagedPrefix(**pages))
        kt.check(got, want, torch.float16, f"paged decode page {page} {config}")


def test_a_tiling_too_small_for_the_group_is_refused(kt, gen):
    inputs = _world(kt, gen, [16], [8], 4, 1, 32, torch.float16)
    with pytest.raises(InvalidInputError, match="heads >= the group 4"):
        kernels.launch_paged_prefill(**inputs, mode=MaskMode.CAUSAL, max_len=8,
                                     config=kernels.PagedPrefillConfig(16, 16, heads=2))
    with pytest.raises(InvalidInputError, match="heads must be a power of two"):
        kernels.PagedPrefillConfig(16, 16, heads=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_own", [0, 1, 2])
@pytest.mark.parametrize("hq, hkv, width", [(4, 2, 5), (7, 1, 3), (2, 2, 40)],
                         ids=["G2", "G7", "wide"])
def test_paged_decode_matches_the_reference(kt, gen, dtype, num_own, hq, hkv, width):
    cached, suffix = [0, 21, 50], [4, 9, 1]
    world = _world(kt, gen, cached, suffix, hq, hkv, 32, dtype)
    batch = len(cached)
    inputs = dict(q=kt.randn((batch, width, hq, 32), dtype, gen), shared_k=world["k"],
                  shared_v=world["v"], cu_seqlens=world["cu_seqlens"], pool_k=world["pool_k"],
                  pool_v=world["pool_v"], block_table=world["block_table"],
                  cached_lens=world["cached_lens"],
                  beam_k=kt.randn((batch, width, 2, hkv, 32), dtype, gen),
                  beam_v=kt.randn((batch, width, 2, hkv, 32), dtype, gen))
    want = reference.paged_decode_attention(**_double(inputs), num_own=num_own)
    got = kernels.paged_decode_attention(**inputs, num_own=num_own)
    kt.check(got, want, dtype, f"paged decode G{hq // hkv} W{width} own {num_own}")


def test_request_major_offsets_with_seq_lens(kt, gen):
    """Suffixes at a fixed stride (the engine's static packing) read ``seq_lens``."""
    dtype, stride = torch.float32, 24
    cached, lengths = [9, 33], [5, 17]
    world = _world(kt, gen, cached, [stride, stride], 2, 1, 32, dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=gen.device)
    beam = kt.randn((2, 3, 1, 1, 32), dtype, gen)
    inputs = dict(q=kt.randn((2, 3, 2, 32), dtype, gen), shared_k=world["k"],
                  shared_v=world["v"], cu_seqlens=world["cu_seqlens"], pool_k=world["pool_k"],
                  pool_v=world["pool_v"], block_table=world["block_table"],
                  cached_lens=world["cached_lens"], beam_k=beam, beam_v=beam.clone())
    want = reference.paged_decode_attention(**_double(inputs), num_own=1, seq_lens=seq_lens)
    got = kernels.paged_decode_attention(**inputs, num_own=1, seq_lens=seq_lens)
    kt.check(got, want, dtype, "request-major decode")


@pytest.mark.parametrize("splits, fused", [(3, False), (3, True), (8, True)])
def test_paged_decode_splits_the_cached_and_new_keys(kt, gen, splits, fused):
    """Split programs each take a block-aligned chunk of cached-then-suffix keys (chunks
    straddle the boundary, some end past a short request); the merge gives one answer."""
    cached, suffix = [0, 37, 70], [5, 12, 1]
    world = _world(kt, gen, cached, suffix, 4, 2, 32, torch.float32)
    inputs = dict(q=kt.randn((3, 6, 4, 32), torch.float32, gen), shared_k=world["k"],
                  shared_v=world["v"], cu_seqlens=world["cu_seqlens"],
                  beam_k=kt.randn((3, 6, 2, 2, 32), torch.float32, gen),
                  beam_v=kt.randn((3, 6, 2, 2, 32), torch.float32, gen))
    pages = dict(pool_k=world["pool_k"], pool_v=world["pool_v"],
                 block_table=world["block_table"], cached_lens=world["cached_lens"])
    want = reference.paged_decode_attention(**_double({**inputs, **pages}), num_own=2)
    config = DecodeConfig(block_m=16, block_n=16, splits=splits, num_warps=4, num_stages=1,
                          fused_merge=fused)
    got = launch_decode(**inputs, num_own=2, scale=32 ** -0.5, config=config,
                        paged=PagedPrefix(**pages))
    kt.check(got, want, torch.float32, f"paged decode, {splits} splits, fused {fused}")


@pytest.mark.gpu
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq, hkv, dim, cached, suffix", [
    (14, 2, 64, [768], [256]), (16, 8, 128, [4000], [1000]), (14, 2, 64, [0, 500, 1024],
                                                              [300, 1, 77])],
    ids=["qwen2-0.5b", "qwen3-1.7b", "ragged-batch"])
def test_gpu_serving_shapes_match_the_reference(kt, gen, page, dtype, hq, hkv, dim, cached,
                                                suffix):
    """The engine's shapes on the GPU: the tuned tiles (not the interpreter's), the decode's
    split rule, beam 256; pages narrower than a key tile and pages of whole tiles."""
    pages = sum(-(-c // page) for c in cached) + 2
    world = _world(kt, gen, cached, suffix, hq, hkv, dim, dtype, pages=pages, page=page)
    for mode in MODES:
        want = reference.paged_prefill_attention(**_double(world), mode=mode)
        got = kernels.paged_prefill_attention(**world, mode=mode, max_len=max(suffix))
        kt.check(got, want, dtype, f"paged prefill {mode.value} {cached}/{suffix}",
                 gen.initial_seed())
    batch, width = len(cached), 256
    inputs = dict(q=kt.randn((batch, width, hq, dim), dtype, gen), shared_k=world["k"],
                  shared_v=world["v"], cu_seqlens=world["cu_seqlens"],
                  pool_k=world["pool_k"], pool_v=world["pool_v"],
                  block_table=world["block_table"], cached_lens=world["cached_lens"],
                  beam_k=kt.randn((batch, width, 2, hkv, dim), dtype, gen),
                  beam_v=kt.randn((batch, width, 2, hkv, dim), dtype, gen))
    want = reference.paged_decode_attention(**_double(inputs), num_own=2)
    got = kernels.paged_decode_attention(**inputs, num_own=2)
    kt.check(got, want, dtype, f"paged decode {cached}/{suffix}", gen.initial_seed())


def _packed(kt, world, suffix, mode):
    """The engine's ``PackedPrompt`` (compact) of packed suffixes of lengths ``suffix``."""
    width = max(suffix)
    valid = torch.arange(width)[None, :] < torch.tensor(suffix)[:, None]
    segments = torch.zeros(len(suffix), width, dtype=torch.int32)
    segments[valid] = world["segment_ids"].cpu()
    return PackedPrompt.from_padded(valid.to(world["q"].device),
                                    segments.to(world["q"].device), mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_the_torch_path_matches_the_reference(kt, mode):
    gen = torch.Generator().manual_seed(3)
    cached, suffix = [0, 21, 40], [6, 11, 2]
    world = _world(kt, gen, cached, suffix, 4, 2, 16, torch.float64)
    prompt = _packed(kt, world, suffix, mode)
    pool = torch.stack([world["pool_k"], world["pool_v"]])[None]    # one layer
    prefix = CachedPrefix(pool, world["block_table"], world["cached_lens"].long(),
                          max(cached))
    got = attn.cached_prefill_attention(world["q"], world["k"], world["v"], prompt, prefix, 0,
                                        "torch")
    want = reference.paged_prefill_attention(**world, mode=mode)
    kt.check(got, want, torch.float64, f"torch prefill {mode.value}")
    q = torch.randn((3, 4, 4, 16), generator=gen, dtype=torch.float64)
    beam = torch.randn((3, 4, 2, 2, 16), generator=gen, dtype=torch.float64)
    got = attn.cached_decode_attention(q, world["k"], world["v"], prompt, prefix, 0, beam,
                                       beam, 2, "torch")
    want = reference.paged_decode_attention(q, world["k"], world["v"], world["cu_seqlens"],
                                            world["pool_k"], world["pool_v"],
                                            world["block_table"], world["cached_lens"], beam,
                                            beam, 2)
    kt.check(got, want, torch.float64, "torch decode")


@pytest.mark.parametrize("edit, match", [
    (lambda w: w.update(pool_k=w["pool_k"][:, :8], pool_v=w["pool_v"][:, :8]),
     "page_tokens"),
    (lambda w: w.update(pool_k=w["pool_k"].half(), pool_v=w["pool_v"].half()),
     "queries' dtype"),
    (lambda w: w.update(block_table=w["block_table"][:1]), r"block_table.shape\[0\]"),
    (lambda w: w.update(cached_lens=w["cached_lens"].float()), "cached_lens.dtype"),
    (lambda w: w.update(segment_ids=w["segment_ids"].long()), "segment_ids.dtype"),
])
def test_the_prefill_launcher_names_bad_inputs(kt, gen, edit, match):
    world = _world(kt, gen, [5, 20], [4, 6], 2, 1, 32, torch.float32)
    edit(world)
    with pytest.raises(InvalidInputError, match=match):
        kernels.paged_prefill_attention(**world, mode=MaskMode.ITEM_CAUSAL, max_len=6)


def test_the_launchers_refuse_other_masks_and_bad_num_own(kt, gen):
    world = _world(kt, gen, [5], [4], 2, 1, 32, torch.float32)
    with pytest.raises(InvalidInputError, match="look-back"):
        kernels.paged_prefill_attention(**world, mode=MaskMode.SEGMENT_BIDIRECTIONAL,
                                        max_len=4)
    beam = kt.randn((1, 2, 1, 1, 32), torch.float32, gen)
    with pytest.raises(InvalidInputError, match="num_own"):
        kernels.paged_decode_attention(kt.randn((1, 2, 2, 32), torch.float32, gen), world["k"],
                                       world["v"], world["cu_seqlens"], world["pool_k"],
                                       world["pool_v"], world["block_table"],
                                       world["cached_lens"], beam, beam, 2)


def test_paged_decode_shares_counters_across_launches(kt, gen):
    """Launches of one shape share one zeroed counter buffer, as a cached search's layers and
    steps do: each merges its splits right and leaves the counters at zero."""
    world = _world(kt, gen, [150], [40], 4, 2, 32, torch.float32)
    pages = {key: world[key] for key in ("pool_k", "pool_v", "block_table", "cached_lens")}
    keys = kernels.decode_keys(world["k"].shape[0], 1, world["block_table"].shape[1], PAGE)
    config = decode_config_for(1, 2, 2, 2, keys, 32, world["q"].device)
    count = merge_counters(1, 2, 4, 2, keys, 32, world["q"].device)
    assert config.splits > 1 and config.fused_merge and count == 2     # one row tile x 2 heads
    counters = torch.zeros(count + 1, dtype=torch.int32, device=world["q"].device)
    for num_own in (0, 1, 2):
        decode = dict(q=kt.randn((1, 2, 4, 32), torch.float32, gen), shared_k=world["k"],
                      shared_v=world["v"], cu_seqlens=world["cu_seqlens"],
                      beam_k=kt.randn((1, 2, 2, 2, 32), torch.float32, gen),
                      beam_v=kt.randn((1, 2, 2, 2, 32), torch.float32, gen))
        want = reference.paged_decode_attention(**_double({**decode, **pages}),
                                                num_own=num_own)
        got = kernels.paged_decode_attention_counted(**decode, **pages, num_own=num_own,
                                                     counters=counters)
        kt.check(got, want, torch.float32, f"paged decode, shared counters, own {num_own}")
        assert not bool(counters.any()), counters


def test_paged_decode_tiling_takes_tma_at_head_dim_128(monkeypatch):
    """The paged decode's tile is the contiguous decode's rule, its key tiles through TMA at
    the head dims of ``PAGED_TMA_HEAD_DIMS`` only (compiled kernels: the interpreter has no
    TMA)."""
    from torch_engine.kernels import decode_tiling
    monkeypatch.setattr(decode_tiling.c, "interpreting", lambda: False)
    monkeypatch.setattr(decode_tiling.c, "multiprocessors", lambda device: 132)
    cpu = torch.device("cpu")
    for dim in (64, 128):
        plain = decode_tiling.decode_config_for(1, 256, 2, 8, 5000, dim, cpu)
        paged = decode_tiling.paged_config_for(1, 256, 2, 8, 5000, dim, cpu)
        assert paged.tma == (dim in decode_tiling.PAGED_TMA_HEAD_DIMS)
        assert dataclasses.replace(paged, tma=plain.tma) == plain
    assert decode_tiling.PAGED_TMA_HEAD_DIMS == {128}


# The paged prefill compiled for sm_90 as a bf16 launch at head dim 128 (the 1.7b shapes)
# would be: 16-byte aligned pointers and strides (what the launcher's specialisation gives),
# whole tiles through TMA. Prints the depth of every [stages, 64, 128] tile buffer.
_PIPELINE = """
import re
from torch_engine.kernels._online_softmax import page_stages
from torch_engine.kernels.paged_attention import _paged_prefill_kernel as kernel
names = kernel.arg_names
signature = {n: "i32" for n in names}
signature.update({n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "pk_ptr", "pv_ptr")})
signature.update({n: "*i64" for n in ("cu_ptr", "len_ptr", "seg_ptr", "cached_ptr")})
signature.update(table_ptr="*i32", qk_scale="fp32")
signature.update({n: "tensordesc<bf16[64, 128]>" for n in ("kd", "vd", "pkd", "pvd")})
constexprs = dict(MODE=3, SEQ_LENS=False, BLOCK_M=64, BLOCK_N=64, HEADS=1, HEAD_DIM=128,
                  PAGE=64, ACC_IN_DOT=True, DOT_PRECISION="tf32", SUFFIX_TMA=True,
                  PAGE_TMA=True, PAGE_STAGES=page_stages(3))
signature.update({n: "constexpr" for n in constexprs})
aligned = [i for i, n in enumerate(names) if n.endswith("_ptr") or n.startswith("s_")]
compiled = triton.compile(
    ASTSource(fn=kernel, signature=signature, constexprs=constexprs,
              attrs={(i,): [["tt.divisibility", 16]] for i in aligned}),
    target=TARGET, options=dict(num_warps=4, num_stages=3))
depths = re.findall(r"local_alloc : \\(\\) -> !ttg.memdesc<(\\d+)x64x128xbf16", compiled.asm["ttgir"])
print("COMPILED", " ".join(depths), usage(compiled))
"""


@pytest.mark.heavy
def test_cached_page_loop_keeps_tiles_two_steps_ahead():
    """Compiled for sm_90, the cached-page loop buffers three key and three value tiles, as
    the suffix loop does: the page-index load must not take a stage from the tile loads (two
    buffers: the next tile fetched only after the current one's scores)."""
    from tests.sm90_compile import assert_no_spills, compiled_lines
    line, = compiled_lines(_PIPELINE, 1)
    depths = line.split("REG:")[0].split()[1:]
    assert len(depths) >= 4 and set(depths) == {"3"}, line
    assert_no_spills([line])
