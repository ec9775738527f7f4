"""Attention kernels on one GPU: Triton xAttention decode and segmented-mask prefill vs anchors.

    python -m benchmarks.bench_attention --out=benchmarks/results [--parts=sweep,decode,prefill]

Measures in the same run the two ceilings (device copy GB/s, bf16 GEMM TFLOP/s), then
decode (batch 1/16, W 64/256/512, prompt 1024/4096, qwen2-0.5b and qwen3-1.7b heads) against
SDPA over per-beam KV copies and a plain-torch cascade (shared SDPA + own SDPA + LSE merge),
and prefill (L 1024/4096/8192, batch 1/4/16, item-level causal layout, 64-token profile,
4-token items) against SDPA ``is_causal`` (the yardstick), SDPA with a dense boolean mask and
FlexAttention with a BlockMask (plus its build time). Every time is the median over CUDA-graph
replays of calls rotating over enough input sets to exceed the L2 cache, divided per call.
The splits part times batch-1 decode with the op's prompt split and with every forced split
count. The sweep part times tile variants at the target shapes, each checked against the fp64
reference first; their kernels compile in parallel processes beforehand (Triton's disk cache is
shared), so one device call both tunes and measures.
Writes ``attention_<date>.json`` under --out and prints a table last.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import math
import multiprocessing
import statistics

import torch
import triton
from absl import app, flags
from tqdm import tqdm

from benchmarks import results_file as rf
from torch_engine import reference
from torch_engine.kernels import decode_attention, prefill_attention
from torch_engine.kernels.decode_attention import launch_decode
from torch_engine.kernels.decode_tiling import DecodeConfig, decode_config_for
from torch_engine.kernels.prefill_attention import PrefillConfig, launch_prefill
from xgr_common.layout import MaskMode

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results", "folder for attention_<date>.json")
flags.DEFINE_list("parts", ["decode", "prefill"],
                  "which parts to run: decode, prefill, sweep (tile variants, checked and timed), "
                  "splits (batch-1 decode: the op's prompt split against forced counts)")
flags.DEFINE_integer("compile_workers", 12, "processes that compile the sweep's variants")
flags.DEFINE_list("flex_batches", ["1"], "prefill batches that also time FlexAttention")
flags.DEFINE_float("anchor_gb", 40.0, "skip an anchor whose inputs exceed this many GB")

HEADS = {"qwen2-0.5b": (14, 2, 64), "qwen3-1.7b": (16, 8, 128)}
DTYPE = torch.bfloat16
OWN = 2  # own decode tokens per beam at the last step (levels - 1)
TARGETS_US = {("qwen2-0.5b", 1): 15, ("qwen2-0.5b", 16): 40, ("qwen3-1.7b", 1): 15,
              ("qwen3-1.7b", 16): 90}


def rotations(bytes_per_set: int) -> int:
    """Input sets so that one pass over them is 3x the L2 (cold caches, as in a real step)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(32, math.ceil(3 * l2 / max(bytes_per_set, 1))))


def graph_time_us(calls) -> float:
    """Median per-call time of replaying one CUDA graph that holds ``calls`` in sequence."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:  # warm-up: compiles, autotunes, allocates outside the capture
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(25):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(times)


def ceilings() -> dict:
    """Device copy bandwidth (bytes read + written) and bf16 GEMM rate on random data."""
    src = torch.randn(2**29, device="cuda", dtype=DTYPE)  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=DTYPE) for _ in range(2))
    gemm_ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
    return {"copy_GBps": 2 * src.numel() * 2 / copy_ms / 1e6,
            "bf16_gemm_TFLOPs": 2 * n**3 / gemm_ms / 1e9}


def rates(us: float, flops: float, nbytes: float) -> dict:
    return {"median_us": round(us, 2), "TFLOPs": round(flops / us / 1e6, 1),
            "GBps": round(nbytes / us / 1e3, 1)}


def safe(fn, *args):
    """Run one measurement; an anchor that cannot run records why instead of ending the run."""
    try:
        return fn(*args)
    except Exception as error:  # noqa: BLE001 - compile limits, OOM, missing backends
        torch.cuda.empty_cache()
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}


# ---- decode -------------------------------------------------------------------------------

def decode_sets(batch, width, hq, hkv, dim, length, count):
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * length
    return [dict(q=torch.randn(batch, width, hq, dim, device="cuda", dtype=DTYPE),
                 shared_k=torch.randn(batch * length, hkv, dim, device="cuda", dtype=DTYPE),
                 shared_v=torch.randn(batch * length, hkv, dim, device="cuda", dtype=DTYPE),
                 cu_seqlens=cu,
                 beam_k=torch.randn(batch, width, OWN, hkv, dim, device="cuda", dtype=DTYPE),
                 beam_v=torch.randn(batch, width, OWN, hkv, dim, device="cuda", dtype=DTYPE))
            for _ in range(count)]


def decode_bytes(batch, width, hq, hkv, dim, length) -> int:
    return 2 * (2 * batch * length * hkv * dim + 2 * batch * width * OWN * hkv * dim
                + 2 * batch * width * hq * dim)


def time_triton_decode(shape, config=None, timed: bool = True):
    """Median per-step time of the op (or of ``config``); untimed: one call, to compile."""
    batch, width, hq, hkv, dim, length = shape
    sets = decode_sets(*shape, rotations(decode_bytes(*shape)) if timed else 1)
    if config is None:
        calls = [lambda s=s: decode_attention(**s, num_own=OWN) for s in sets]
    else:
        scale = 1 / math.sqrt(dim)
        calls = [lambda s=s: launch_decode(**s, num_own=OWN, scale=scale, config=config)
                 for s in sets]
    if not timed:
        return {"out": calls[0]()}
    got = {"us": graph_time_us(calls)}
    if width * length * hq * dim <= 2**28:  # the reference expands KV per beam: keep it small
        check = calls[0]()
        ref = reference.decode_attention(**{k: v.float() if v.is_floating_point() else v
                                            for k, v in sets[0].items()}, num_own=OWN)
        got["rel_err"] = ((check.float() - ref).norm() / ref.norm()).item()
    return got


def time_sdpa_copies(shape):
    """SDPA of every beam over its own copy of prompt + own KV (what a plain engine does)."""
    batch, width, hq, hkv, dim, length = shape
    per_set = 2 * 2 * batch * width * (length + OWN) * hkv * dim
    if per_set > FLAGS.anchor_gb * 1e9:
        return {"error": f"skipped: per-beam copies need {per_set / 1e9:.0f} GB"}
    sets = []
    for _ in range(rotations(per_set)):
        q = torch.randn(batch * width, hq, 1, dim, device="cuda", dtype=DTYPE)
        k = torch.randn(batch * width, hkv, length + OWN, dim, device="cuda", dtype=DTYPE)
        sets.append((q, k, torch.randn_like(k)))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return {"us": graph_time_us([lambda s=s: sdpa(*s, enable_gqa=True) for s in sets])}


def time_cascade(shape):
    """Plain-torch three stages: shared SDPA (beams as query rows), own SDPA, LSE merge.
    KV heads are expanded to the query heads outside the timed region (favours the anchor)."""
    batch, width, hq, hkv, dim, length = shape
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    sets = []
    per_set = 2 * 2 * batch * (length + width * OWN) * hq * dim
    for _ in range(rotations(per_set)):
        q = torch.randn(batch, width, hq, dim, device="cuda", dtype=DTYPE)
        ks = torch.randn(batch, hq, length, dim, device="cuda", dtype=DTYPE)
        ko = torch.randn(batch * width, hq, OWN, dim, device="cuda", dtype=DTYPE)
        sets.append((q, ks, torch.randn_like(ks), ko, torch.randn_like(ko)))

    def cascade(q, ks, vs, ko, vo):
        out_s, lse_s = flash(q.transpose(1, 2), ks, vs)[:2]                 # [B, Hq, W, *]
        q_own = q.reshape(batch * width, 1, hq, dim).transpose(1, 2)      # [BW, Hq, 1, D]
        out_o, lse_o = flash(q_own, ko, vo)[:2]
        out_o = out_o.reshape(batch, width, hq, dim).transpose(1, 2)
        lse_o = lse_o.reshape(batch, width, hq).transpose(1, 2)
        return reference.merge_states(out_s.float(), lse_s, out_o.float(), lse_o).to(DTYPE)

    return {"us": graph_time_us([lambda s=s: cascade(*s) for s in sets])}


def decode_part(results: list) -> None:
    shapes = [(name, batch, width, length) for name in HEADS for batch in (1, 16)
              for width in (64, 256, 512) for length in (1024, 4096)]
    for name, batch, width, length in tqdm(shapes, desc="decode"):
        hq, hkv, dim = HEADS[name]
        shape = (batch, width, hq, hkv, dim, length)
        flops = 4 * batch * width * hq * (length + OWN) * dim
        nbytes = decode_bytes(*shape)
        row = {"heads": name, "batch": batch, "width": width, "prompt": length}
        for method, fn in (("triton", time_triton_decode), ("sdpa_copies", time_sdpa_copies),
                           ("cascade", time_cascade)):
            got = safe(fn, shape)
            row[method] = ({**rates(got["us"], flops, nbytes),
                            **({"rel_err": got["rel_err"]} if "rel_err" in got else {})}
                           if "us" in got else got)
        if "median_us" in row["triton"]:
            for anchor in ("sdpa_copies", "cascade"):
                if "median_us" in row[anchor]:
                    row[f"speedup_vs_{anchor}"] = round(
                        row[anchor]["median_us"] / row["triton"]["median_us"], 2)
        row["target_us"] = TARGETS_US.get((name, batch)) if (width, length) == (256, 1024) \
            else None
        results.append(row)
        torch.cuda.empty_cache()


# ---- prefill ------------------------------------------------------------------------------

def item_layout(length: int) -> torch.Tensor:
    """One request's segment ids: a 64-token profile (segment 0), then 4-token items."""
    pos = torch.arange(length, device="cuda")
    return torch.where(pos < 64, 0, 1 + (pos - 64).clamp(min=0) // 4).to(torch.int32)


def prefill_sets(batch, length, hq, hkv, dim, count):
    total = batch * length
    return [(torch.randn(total, hq, dim, device="cuda", dtype=DTYPE),
             torch.randn(total, hkv, dim, device="cuda", dtype=DTYPE),
             torch.randn(total, hkv, dim, device="cuda", dtype=DTYPE)) for _ in range(count)]


def padded(q, k, v, batch, length, group):
    """[B, Hq, L, D] views of packed q and (expanded, contiguous) k, v for the SDPA anchors."""
    def view(x):
        return x.view(batch, length, x.shape[1], x.shape[2]).transpose(1, 2)
    return (view(q), view(k).repeat_interleave(group, 1).contiguous(),
            view(v).repeat_interleave(group, 1).contiguous())


def rel_error_vs_sdpa(inputs, cu, segs, mask, batch, length, group) -> float:
    """Triton item-causal prefill vs fp32 SDPA with the dense mask on the same bf16 inputs."""
    got = prefill_attention(*inputs, cu, segs, MaskMode.ITEM_CAUSAL).float()
    ref_q, ref_k, ref_v = (x.float() for x in padded(*inputs, batch, length, group))
    ref = torch.nn.functional.scaled_dot_product_attention(ref_q, ref_k, ref_v, attn_mask=mask)
    ref = ref.transpose(1, 2).reshape(got.shape)
    return ((got - ref).norm() / ref.norm()).item()


def prefill_part(results: list) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    shapes = [(name, batch, length) for name in HEADS for length in (1024, 4096, 8192)
              for batch in (1, 4, 16)]
    for name, batch, length in tqdm(shapes, desc="prefill"):
        hq, hkv, dim = HEADS[name]
        group = hq // hkv
        seg_one = item_layout(length)
        segs = seg_one.repeat(batch)
        cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * length
        mask = reference.request_mask(seg_one, MaskMode.ITEM_CAUSAL)
        pairs = int(mask.sum()) * batch
        causal_pairs = length * (length + 1) // 2 * batch
        nbytes = 2 * batch * length * dim * (2 * hq + 2 * hkv)
        sets = prefill_sets(batch, length, hq, hkv, dim, rotations(nbytes))
        row = {"heads": name, "batch": batch, "L": length, "allowed_pairs": pairs,
               "causal_pairs": causal_pairs}

        def timed(method, calls, flop_pairs):
            got = safe(lambda: {"us": graph_time_us(calls)})
            row[method] = rates(got["us"], 4 * dim * hq * flop_pairs, nbytes) \
                if "us" in got else got

        for mode, key in ((MaskMode.ITEM_CAUSAL, "triton_item_causal"),
                          (MaskMode.CAUSAL, "triton_causal")):
            timed(key, [lambda s=s, m=mode: prefill_attention(*s, cu, segs, m) for s in sets],
                  pairs if mode is MaskMode.ITEM_CAUSAL else causal_pairs)
        row["triton_rel_err_vs_fp32_sdpa"] = safe(rel_error_vs_sdpa, sets[0], cu, segs, mask,
                                                  batch, length, group)
        views = [padded(*s, batch, length, group) for s in sets]
        timed("sdpa_causal", [lambda s=s: sdpa(*s, is_causal=True) for s in views], causal_pairs)
        dense = mask[None, None]
        timed("sdpa_dense_mask", [lambda s=s: sdpa(*s, attn_mask=dense) for s in views], pairs)
        if str(batch) in FLAGS.flex_batches and name == "qwen2-0.5b":
            seg_b = segs.view(batch, length)

            def item_causal(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx) | (seg_b[b, kv_idx] == seg_b[b, q_idx])

            build_ms = triton.testing.do_bench(
                lambda: create_block_mask(item_causal, batch, None, length, length, "cuda"),
                warmup=5, rep=50, return_mode="median")
            block_mask = create_block_mask(item_causal, batch, None, length, length, "cuda")
            timed("flex_block_mask", [lambda s=s: flex(*s, block_mask=block_mask)
                                      for s in views], pairs)
            row["flex_block_mask_build_us"] = round(build_ms * 1e3, 1)
        base = row["sdpa_causal"].get("median_us")
        for key in ("triton_item_causal", "triton_causal", "sdpa_dense_mask", "flex_block_mask"):
            if base and "median_us" in row.get(key, {}):
                row[f"{key}_over_sdpa_causal"] = round(row[key]["median_us"] / base, 2)
        results.append(row)
        del sets, views, dense, mask
        torch.cuda.empty_cache()


# ---- sweep: several variants per target shape, each checked, compiled in parallel first ---

def _tma(*configs):
    """Each tile with whole key tiles loaded through TMA descriptors."""
    return [dataclasses.replace(config, tma=True) for config in configs]


D = DecodeConfig
P = PrefillConfig
# Decode at W 256, prompt 1024: (block_m, block_n, splits, warps, stages, fused merge). The
# first of each list is the table's tile (sweeps T1853-T1900, after the row tiles of one
# (request, KV head) were made to run side by side; at batch 1 the prompt split in 4). The
# others were measured slower: at batch 16 qwen3-1.7b without TMA; at batch 1 fewer stages
# (more programs fit a multiprocessor), longer key steps, TMA loads, 6 splits, 8 warps
# (notes/attention.md v11).
DECODE_VARIANTS = {
    ("qwen2-0.5b", 1): [D(64, 64, 4, 4, 3, True, acc_in_dot=False),
                        D(64, 64, 4, 4, 2, True, acc_in_dot=False),
                        D(64, 128, 4, 4, 2, True, acc_in_dot=False),
                        D(64, 64, 4, 4, 3, True, acc_in_dot=False, tma=True)],
    ("qwen2-0.5b", 16): [D(64, 64, 1, 4, 3, acc_in_dot=False)],
    ("qwen3-1.7b", 1): [D(64, 64, 4, 4, 3, True), D(64, 64, 4, 4, 2, True),
                        D(64, 128, 4, 4, 2, True), D(64, 64, 4, 4, 3, True, tma=True),
                        D(64, 64, 6, 4, 2, True), D(64, 64, 4, 8, 3, True)],
    ("qwen3-1.7b", 16): [D(64, 64, 1, 4, 3, tma=True), D(64, 64, 1, 4, 3)],
}
# Prefill, item-level causal, at (batch, L) in PREFILL_SWEEP_SHAPES: the table's tiles (v8),
# each in both program orders of an equal-length batch: the longest-first chunks the op
# chooses (v13) and the ragged batches' order (heads in turn, each request's tiles in turn).
PREFILL_VARIANTS = {
    "qwen2-0.5b": [P(64, 64, 4, 3, maxnreg=128)],
    "qwen3-1.7b": _tma(P(64, 64, 4, 3)),
}
PREFILL_SWEEP_SHAPES = tuple((b, n) for n in (1024, 4096, 8192) for b in (1, 4, 16))
PREFILL_ORDERS = ("longest-first", "ragged")


def sweep_items() -> list[tuple]:
    items = [("decode", name, batch, config)
             for (name, batch), configs in DECODE_VARIANTS.items() for config in configs]
    items += [("prefill", name, (*shape, order), config)
              for name, configs in PREFILL_VARIANTS.items() for shape in PREFILL_SWEEP_SHAPES
              for order in PREFILL_ORDERS for config in configs]
    return items


def decode_variant_check(name, config) -> float:
    """Relative error of ``config`` vs the fp64 reference on a ragged batch (bf16 inputs)."""
    hq, hkv, dim = HEADS[name]
    lengths, width = [1024, 1, 700], 64
    cu = torch.tensor([0, 1024, 1025, 1725], device="cuda", dtype=torch.int32)
    g = {k: torch.randn(*shape, device="cuda", dtype=DTYPE) for k, shape in (
        ("q", (3, width, hq, dim)), ("shared_k", (sum(lengths), hkv, dim)),
        ("shared_v", (sum(lengths), hkv, dim)), ("beam_k", (3, width, OWN, hkv, dim)),
        ("beam_v", (3, width, OWN, hkv, dim)))}
    out = torch.full_like(g["q"], float("nan"))
    launch_decode(**g, cu_seqlens=cu, num_own=OWN, scale=1 / math.sqrt(dim), config=config,
                  out=out)
    ref = reference.decode_attention(**{k: v.double() for k, v in g.items()}, cu_seqlens=cu,
                                     num_own=OWN)
    return ((out.double() - ref).norm() / ref.norm()).item()


def prefill_variant_check(name, config) -> float:
    hq, hkv, dim = HEADS[name]
    lengths = [700, 1, 300, 129]
    segs = torch.cat([item_layout(n) for n in lengths])
    cu = torch.tensor([0, 700, 701, 1001, 1130], device="cuda", dtype=torch.int32)
    q, k, v = prefill_sets(1, sum(lengths), hq, hkv, dim, 1)[0]
    out = torch.full_like(q, float("nan"))
    launch_prefill(q, k, v, cu, segs, MaskMode.ITEM_CAUSAL, 1 / math.sqrt(dim), config, out=out)
    ref = reference.prefill_attention(q.double(), k.double(), v.double(), cu, segs,
                                      MaskMode.ITEM_CAUSAL)
    return ((out.double() - ref).norm() / ref.norm()).item()


def prefill_variant_calls(name, where, config, count):
    hq, hkv, dim = HEADS[name]
    batch, length, order = where
    segs = item_layout(length).repeat(batch)
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * length
    sets = prefill_sets(batch, length, hq, hkv, dim, count)
    # A chunk of batch + 1 requests divides no batch: the kernel takes the ragged order.
    chunk = None if order == "longest-first" else (batch + 1, 1)
    return [lambda s=s: launch_prefill(*s, cu, segs, MaskMode.ITEM_CAUSAL, 1 / math.sqrt(dim),
                                       config, chunk=chunk) for s in sets]


def run_variant(item, timed: bool) -> dict:
    """Check one variant and (when ``timed``) time it; untimed, it only compiles its kernels."""
    part, name, where, config = item
    hq, hkv, dim = HEADS[name]
    if part == "decode":
        rel = decode_variant_check(name, config)
        shape = (where, 256, hq, hkv, dim, 1024)
        if not timed:
            time_triton_decode(shape, config, timed=False)
            return {}
        return {"rel_err": rel, "us": time_triton_decode(shape, config)["us"]}
    rel = prefill_variant_check(name, config)
    if not timed:
        for call in prefill_variant_calls(name, where, config, 1):
            call()
        return {}
    return {"rel_err": rel, "us": graph_time_us(prefill_variant_calls(name, where, config, 4))}


def _compile_in_worker(item) -> str:
    try:
        run_variant(item, timed=False)
        torch.cuda.synchronize()
        return ""
    except Exception as error:  # noqa: BLE001 - reported in the sweep table
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def sweep_part(sweep: list) -> None:
    """Compiles every variant in parallel processes (Triton's disk cache is shared), then checks
    and times each here, with SDPA is_causal beside each prefill shape."""
    items = sweep_items()
    context = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=FLAGS.compile_workers,
                                                    mp_context=context) as pool:
            errors = list(tqdm(pool.map(_compile_in_worker, items), total=len(items),
                               desc="compile variants"))
    except Exception as error:  # noqa: BLE001 - a broken pool only costs the head start
        print(f"parallel compile failed ({error!r}); compiling while timing")
        errors = [""] * len(items)
    for item, error in zip(tqdm(items, desc="sweep"), errors):
        part, name, where, config = item
        row = {"part": part, "heads": name, "where": where, "config": config.__dict__}
        row.update({"error": error} if error else safe(run_variant, item, True))
        sweep.append(row)
        torch.cuda.empty_cache()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for name in PREFILL_VARIANTS:
        hq, hkv, dim = HEADS[name]
        for batch, length in PREFILL_SWEEP_SHAPES:
            views = [padded(*s, batch, length, hq // hkv)
                     for s in prefill_sets(batch, length, hq, hkv, dim, 4)]
            got = safe(lambda: {"us": graph_time_us(
                [lambda s=s: sdpa(*s, is_causal=True) for s in views])})
            sweep.append({"part": "sdpa_causal", "heads": name, "where": (batch, length),
                          "config": {}, **got})


SPLIT_SHAPES = [(name, width, length) for name in HEADS for width in (64, 256, 512)
                for length in (1024, 4096, 5120)]
SPLIT_COUNTS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


def splits_part(rows: list) -> None:
    """Batch 1, where the prompt is split: the op's own split count against every forced count
    (same tile), per shape, so the split rule can be checked against measurements."""
    for name, width, length in tqdm(SPLIT_SHAPES, desc="split shapes"):
        hq, hkv, dim = HEADS[name]
        shape = (1, width, hq, hkv, dim, length)
        config = decode_config_for(1, width, hq // hkv, hkv, length, dim, torch.device("cuda"))
        row = {"heads": name, "width": width, "prompt": length, "op_splits": config.splits,
               "op": safe(time_triton_decode, shape), "forced": {}}
        for splits in SPLIT_COUNTS:
            if splits > 1 and length // splits < config.block_n:
                continue
            forced = dataclasses.replace(config, splits=splits, fused_merge=splits > 1)
            row["forced"][splits] = safe(time_triton_decode, shape, forced)
        timed = {k: v["us"] for k, v in row["forced"].items() if "us" in v}
        if timed:
            row["best_splits"] = min(timed, key=timed.get)
            row["op_over_best"] = round(row["op"].get("us", float("nan"))
                                        / timed[row["best_splits"]], 3)
        rows.append(row)


# ---- report -------------------------------------------------------------------------------

def cell(entry) -> str:
    if not isinstance(entry, dict):
        return "-"
    return f"{entry['median_us']:.1f}" if "median_us" in entry else "n/a"


def print_tables(report: dict) -> None:
    ceil = report["ceilings"]
    print(f"\n{report['gpu']}  copy {ceil['copy_GBps']:.0f} GB/s  "
          f"bf16 GEMM {ceil['bf16_gemm_TFLOPs']:.0f} TFLOP/s  ({report['date']})")
    if report["decode"]:
        print("\ndecode (us per step, bf16)      triton  TFLOP/s  GB/s   sdpa_copies  cascade"
              "  target")
        for r in report["decode"]:
            t = r["triton"]
            print(f"{r['heads']:11s} b{r['batch']:<3d} W{r['width']:<4d} L{r['prompt']:<5d}"
                  f"{cell(t):>9s} {t.get('TFLOPs', 0):8.1f} {t.get('GBps', 0):6.0f} "
                  f"{cell(r['sdpa_copies']):>12s} {cell(r['cascade']):>8s} "
                  f"{r['target_us'] or '':>7}")
    if report["prefill"]:
        print("\nprefill (us, bf16)       triton_item  TFLOP/s  triton_causal  sdpa_causal  "
              "ratio  dense_mask  flex(+build)")
        for r in report["prefill"]:
            t = r["triton_item_causal"]
            flex = cell(r.get("flex_block_mask"))
            if "flex_block_mask_build_us" in r:
                flex += f" (+{r['flex_block_mask_build_us']:.0f})"
            print(f"{r['heads']:11s} b{r['batch']:<3d} L{r['L']:<5d}{cell(t):>12s} "
                  f"{t.get('TFLOPs', 0):8.1f} {cell(r['triton_causal']):>14s} "
                  f"{cell(r['sdpa_causal']):>12s} "
                  f"{r.get('triton_item_causal_over_sdpa_causal', '-'):>6} "
                  f"{cell(r['sdpa_dense_mask']):>11s}  {flex}")
    if report.get("splits"):
        print("\ndecode splits at batch 1 (us)   op (splits)   best forced (splits)   op/best"
              "   all forced")
        for r in report["splits"]:
            forced = " ".join(f"{k}:{v['us']:.1f}" for k, v in r["forced"].items() if "us" in v)
            best = r.get("best_splits")
            best_us = r["forced"][best]["us"] if best is not None else float("nan")
            print(f"{r['heads']:11s} W{r['width']:<4d} L{r['prompt']:<5d} "
                  f"{r['op'].get('us', float('nan')):8.1f} ({r['op_splits']:2d})   "
                  f"{best_us:8.1f} ({best})"
                  f"   {r.get('op_over_best', '-')}   {forced}")
    if report["sweep"]:
        print("\nsweep (us; rel err vs fp64)  config")
    # Prefill rows name (batch, length, program order): the column fits the longest.
    where_width = max((len(str(s["where"])) for s in report["sweep"]), default=11)
    for s in report["sweep"]:
        us = f"{s['us']:8.1f}" if "us" in s else s.get("error", "")
        rel = f"{s['rel_err']:.1e}" if "rel_err" in s else ""
        config = " ".join(f"{k}={v}" for k, v in s["config"].items())
        print(f"{s['part']:11s} {s['heads']:11s} {str(s['where']):{where_width}s} {us} "
              f"{rel:8s} {config}")


def main(argv) -> None:
    del argv
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    report = {"gpu": props.name, "sms": props.multi_processor_count,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": {"torch": torch.__version__, "triton": triton.__version__,
                           "cuda": torch.version.cuda},
              "dtype": "bfloat16", "timing": "median of 25 CUDA-graph replays, inputs rotated "
              "over >= 3x L2 per pass, per call",
              "decode": [], "prefill": [], "sweep": [], "splits": []}
    report["ceilings"] = ceilings()
    path = rf.result_path(FLAGS.out, "attention", stamp=report["date"][:16].replace(":", ""))
    steps = {"sweep": (sweep_part, report["sweep"]), "decode": (decode_part, report["decode"]),
             "splits": (splits_part, report["splits"]),
             "prefill": (prefill_part, report["prefill"])}
    for run, into in (steps[part] for part in FLAGS.parts):
        run(into)
        rf.write_json(path, report)  # after every part, so a cut-short run keeps its data
    print_tables(report)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    app.run(main)
