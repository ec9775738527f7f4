"""The prompt-KV cache: a hit's latency beside the uncached engine, in one run.

    python -m benchmarks.bench_prompt_cache --out=benchmarks/results
    python -m benchmarks.bench_prompt_cache --device=cpu --cases=tiny:48:24 --items=3000 \\
        --repeats=3    # a smoke run of the script

Random bf16 weights of each preset (made on the device), 3 levels x 256 codes, a catalog of
``--items`` random ids on ``--paths`` random code paths, beam ``--beam``, top_k ``--top_k``,
batch 1, item-causal prompts: a frozen part of whole 4-token items (``cached`` tokens) and a
new part (``new`` tokens), ``--cases`` ``preset:cached:new``. For each case, whole
``Engine.recommend`` calls (synchronised wall time, median of ``--repeats`` after warm-up):

* the uncached engine (defaults: one graph replay a call) on the whole prompt;
* a hit from the device pool (the frozen part cached, the new part prefilled against it);
* a miss (the cache cleared before each call: the whole prompt computed and the frozen part
  written into pages);
* a host-tier hit's extra cost: the entry's copy from pinned host memory into its pages.

Writes ``prompt_cache_<date>[_<tag>].json`` and prints a table.
"""

from __future__ import annotations

import statistics

import numpy as np
import torch
from absl import app, flags

from benchmarks import engine_analysis as ea
from benchmarks.engine_analysis import kernel_times, profiled, sync
from benchmarks.engine_analysis import wall_ms as timed
from benchmarks import results_file as rf
from torch_engine.config import EngineConfig, preset
from torch_engine.engine import Engine
from torch_engine.model import Model
from torch_engine.prompt_cache import KVGeometry, PromptCache, PromptCacheConfig
from xgr_common.layout import TokenLayout

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results", "folder for prompt_cache_<date>[_<tag>].json")
flags.DEFINE_string("tag", "", "suffix of the result file name")
flags.DEFINE_list("cases", ["qwen2-0.5b:768:256", "qwen3-1.7b:4000:1000"],
                  "preset:cached:new tokens of each case")
flags.DEFINE_integer("items", 1_000_000, "catalog size")
flags.DEFINE_integer("paths", 250_000, "distinct code paths the items share")
flags.DEFINE_integer("beam", 256, "beam width")
flags.DEFINE_integer("top_k", 300, "items returned")
flags.DEFINE_integer("page_tokens", PromptCacheConfig.page_tokens, "tokens a cache page")
flags.DEFINE_integer("repeats", 20, "timed calls per configuration")
flags.DEFINE_string("device", "cuda", "torch device (cpu: a smoke run of the script)")
flags.DEFINE_bool("timeline", False, "also take one uncached call and one hit apart on the "
                  "GPU's clock (``timeline``); on with --profile")
flags.DEFINE_bool("profile", False, "also profile one uncached call and one hit of engines "
                  "with the graphs off and print their kernels side by side (where a hit's "
                  "time goes)")

LAYOUT = TokenLayout()
ITEM = 4                  # tokens per item: ITEM_START and 3 codes
TARGETS_MS = {"qwen2-0.5b": 3.5, "qwen3-1.7b": 14.0}


def prompt(cached: int, new: int, device: torch.device, seed: int = 0):
    """One item-causal prompt: ``cached`` tokens of whole items (the frozen part), then
    ``new`` tokens of items, the last token opening the generated item."""
    gen = torch.Generator().manual_seed(seed)
    total = cached + new
    tokens = torch.randint(LAYOUT.code_base, LAYOUT.code_end, (1, total), generator=gen)
    starts = torch.arange(total) % ITEM == 0
    tokens[0, starts] = LAYOUT.item_start_id
    tokens[0, 0] = LAYOUT.bos_id
    segments = (torch.arange(total) // ITEM).to(torch.int32)[None]
    return (tokens.to(device), torch.tensor([total], device=device), segments.to(device),
            torch.tensor([cached]))


def random_model(name: str, device: torch.device, dtype: torch.dtype) -> Model:
    with torch.device(device):
        model = Model(preset(name))
    model = model.to(dtype).eval()
    model.init_weights(0)
    return model


def cache_for(geometry: KVGeometry, cached: int, device: torch.device) -> PromptCache:
    """A device pool of twice the case's cached pages and a few spare, ``--page_tokens`` a
    page."""
    page = FLAGS.page_tokens
    pages = 2 * -(-cached // page) + 4
    return PromptCache(geometry, PromptCacheConfig(device_bytes=pages * geometry.page_bytes(page),
                                                   page_tokens=page), device)


def run_case(spec: str, catalog, device: torch.device) -> dict:
    name, cached, new = spec.split(":")
    cached, new = int(cached), int(new)
    require_items = cached % ITEM == 0
    if not require_items:
        raise app.UsageError(f"--cases {spec}: cached tokens must be whole {ITEM}-token items")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model(name, device, dtype)
    geometry = KVGeometry.of_model(model.config, dtype)
    cache = cache_for(geometry, cached, device)
    plain = Engine(model, catalog, EngineConfig())
    engine = Engine(model, catalog, EngineConfig(), prompt_cache=cache, model_version=name)
    tokens, lengths, segments, frozen = prompt(cached, new, device)
    width, top_k = FLAGS.beam, FLAGS.top_k

    def uncached():
        return plain.recommend(tokens, lengths, segments, beam_width=width, top_k=top_k)

    def through_cache():
        return engine.recommend(tokens, lengths, segments, beam_width=width, top_k=top_k,
                                frozen_lengths=frozen)

    want, got = uncached(), through_cache()
    through_cache()                                              # now a hit
    same = int((want[0] == got[0]).sum())
    # Rank by rank, and as sets: near-tied scores of a random model may trade places in bf16.
    shared = len(set(want[0].flatten().tolist()) & set(got[0].flatten().tolist()))
    rows = {"uncached": timed(uncached, FLAGS.repeats),
            "hit (device pool)": timed(through_cache, FLAGS.repeats),
            "miss (computed and stored)": timed(through_cache, FLAGS.repeats, cache.clear)}
    host = torch.empty((geometry.layers, 2, cached, geometry.kv_heads, geometry.head_dim),
                       dtype=dtype, pin_memory=device.type == "cuda")
    target = cache.pool.data[:, :, 1:1 + -(-cached // cache.page_tokens)].flatten(2, 3)[
        :, :, :cached]
    rows["host-tier copy (added to a hit)"] = timed(
        lambda: target.copy_(host, non_blocking=True), FLAGS.repeats)
    stats = cache.stats()
    medians = {k: statistics.median(v) for k, v in rows.items()}
    def miss():
        cache.clear()
        return through_cache()

    miss()
    parts = {"miss": replay_parts(engine.cached_runner.last_graph(),
                                  medians["miss (computed and stored)"])}
    through_cache()
    parts.update({"uncached": replay_parts(plain.runner.last_graph(), medians["uncached"]),
                  "hit": replay_parts(engine.cached_runner.last_graph(),
                                      medians["hit (device pool)"])})
    kernels = profile_case(model, catalog, geometry, tokens, lengths, segments, frozen,
                           name) if FLAGS.profile else None
    host = None
    if FLAGS.profile:
        host = {"uncached": host_times(uncached), "hit": host_times(through_cache)}
        print_host(name, host)
    if (FLAGS.profile or FLAGS.timeline) and device.type == "cuda":
        host = host or {}
        host["timeline"] = {"uncached": timeline(uncached), "hit": timeline(through_cache),
                            "miss": timeline(miss)}
        for what, line in host["timeline"].items():
            print(f"\n{name} {what}, captured, on the GPU's clock (us): " + ", ".join(
                f"{k} {v:.0f}" for k, v in line.items() if k not in ("first", "host")))
            for event, at, took in line.get("first", []):
                print(f"    at {at:8.1f} for {took:8.1f}  {event}")
            for function, us in line.get("host", []):
                print(f"    {us:9.1f} us  {function[-100:]}")
    return {"case": spec, "preset": name, "cached_tokens": cached, "new_tokens": new,
            "beam_width": width, "top_k": top_k, "page_tokens": FLAGS.page_tokens, "batch": 1,
            "dtype": str(dtype),
            "kv_bytes_per_token": geometry.token_bytes,
            "host_copy_bytes": geometry.token_bytes * cached,
            "medians_ms": medians, "p99_ms": {k: float(np.percentile(v, 99))
                                               for k, v in rows.items()},
            "hit_over_uncached": medians["hit (device pool)"] / medians["uncached"],
            "target_hit_ms": TARGETS_MS.get(name),
            "items_equal_to_uncached": same, "items_in_both": shared,
            "items_compared": int(want[0].numel()),
            "replay_ms": parts, "cache_stats": stats.__dict__, "kernels_us": kernels,
            "host_us": host}


def replay_parts(graph, call_ms: float) -> dict | None:
    """A call's time taken apart (None without a captured graph): the graph's replay alone
    (its inputs as the last call left them), wall and GPU (CUDA events around it), and the
    rest of the call (the host work before the launch, the copies out)."""
    if graph is None:
        return None
    wall = statistics.median(timed(graph.replay, FLAGS.repeats))
    gpu = []
    for _ in range(FLAGS.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    return {"replay_wall": wall, "replay_gpu": statistics.median(gpu),
            "rest_of_call": call_ms - wall}


def host_times(call, calls: int = 5) -> dict[str, float]:
    """Where a call's host time goes: microseconds per call (inclusive, so nested entries
    overlap) of this repository's engine functions and of the CUDA runtime's calls (graph
    launches, copies, synchronisations), over ``calls`` calls of the timed (captured)
    engines. Python's tracer adds its own cost to each function, so the figures are upper
    bounds; ``wall`` is the calls' time under it."""
    prof, wall = profiled(call, calls, with_stack=True)
    out = {"wall": wall}
    for event in prof.key_averages():
        if "torch_engine/" in event.key or event.key.startswith("cuda"):
            out[event.key] = out.get(event.key, 0.0) + event.cpu_time_total / calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def timeline(call, calls: int = 5, listed: int = 10) -> dict:
    """One call's wall time on the GPU's clock (the profiler's, medians of ``calls``
    synchronised calls, microseconds): ``lead`` from the call's start to its first GPU
    activity (the host work before any copy or launch reaches the GPU), ``gpu_span`` from
    the first GPU activity to the last, ``gpu_idle`` the gaps inside that span, ``tail``
    from the last GPU activity to the call's return; ``first``: the last call's first
    ``listed`` GPU activities (name, start from the call's start, duration), ``host``: its
    slowest engine functions (cumulative microseconds, Python's profiler)."""
    import cProfile
    import pstats
    from torch.autograd import DeviceType
    from torch.profiler import record_function
    marker = "timed call"

    def marked():
        with record_function(marker):
            call()
            sync()

    prof, _ = profiled(marked, calls)
    events = prof.events()
    spans = [e for e in events if e.name == marker and e.device_type == DeviceType.CPU]
    gpu = sorted((e for e in events if e.device_type == DeviceType.CUDA and e.name != marker),
                 key=lambda e: e.time_range.start)
    parts = {"lead": [], "gpu_span": [], "gpu_idle": [], "tail": []}
    first = []
    for span in spans:
        start, end = span.time_range.start, span.time_range.end
        inside = [e for e in gpu if start <= e.time_range.start and e.time_range.end <= end]
        if not inside:
            continue
        busy, reach = 0.0, inside[0].time_range.start
        for e in inside:    # the union of the activities' intervals
            busy += max(0.0, e.time_range.end - max(reach, e.time_range.start))
            reach = max(reach, e.time_range.end)
        last = max(e.time_range.end for e in inside)
        parts["lead"].append(inside[0].time_range.start - start)
        parts["gpu_span"].append(last - inside[0].time_range.start)
        parts["gpu_idle"].append(last - inside[0].time_range.start - busy)
        parts["tail"].append(end - last)
        first = [(e.name[:60], e.time_range.start - start, e.time_range.end - e.time_range.start)
                 for e in inside[:listed]]
    out = {k: statistics.median(v) for k, v in parts.items() if v}
    out["first"] = first
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
        sync()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = [(f"{func[0].split('/work/')[-1].split('site-packages/')[-1]}:{func[1]} {func[2]}",
             cumulative * 1e6 / calls) for func, (_, _, _, cumulative, _) in stats.items()]
    out["host"] = sorted(rows, key=lambda row: -row[1])[:25]
    return out


def print_host(name: str, host: dict, top: int = 15) -> None:
    for what, times in host.items():
        print(f"\n{name} {what}, captured: host time a call (inclusive, under the tracer)")
        for key, us in list(times.items())[:top]:
            print(f"  {us:>9.1f} us  {key[-90:]}")


def profile_case(model, catalog, geometry, tokens, lengths, segments, frozen, name,
                 top: int = 15) -> dict:
    """One uncached call and one hit of eager engines (graphs off, so each kernel is seen),
    kernel by kernel; prints both tables."""
    eager = EngineConfig(cuda_graphs=False)
    cache = cache_for(geometry, int(frozen.max()), tokens.device)
    plain = Engine(model, catalog, eager)
    cached = Engine(model, catalog, eager, prompt_cache=cache, model_version=name)
    width, top_k = FLAGS.beam, FLAGS.top_k
    cached.recommend(tokens, lengths, segments, beam_width=width, top_k=top_k,
                     frozen_lengths=frozen)                          # the entry exists
    result = {
        "uncached": kernel_times(lambda: plain.recommend(tokens, lengths, segments,
                                                          beam_width=width, top_k=top_k)),
        "hit": kernel_times(lambda: cached.recommend(tokens, lengths, segments,
                                                     beam_width=width, top_k=top_k,
                                                     frozen_lengths=frozen))}
    for what, times in result.items():
        print(f"\n{name} {what}: {sum(times.values()):.0f} us of kernels a call")
        for kernel, us in list(times.items())[:top]:
            print(f"  {us:>9.1f} us  {kernel[:90]}")
    return result


def main(argv: list[str]) -> None:
    del argv
    device = torch.device(FLAGS.device)
    catalog = ea.random_catalog(FLAGS.items, min(FLAGS.paths, FLAGS.items), LAYOUT)
    results = [run_case(spec, catalog, device) for spec in FLAGS.cases]
    print(f"\n{'case':<24}{'uncached':>10}{'hit':>10}{'miss':>10}{'host copy':>11}"
          f"{'hit/unc.':>10}{'target':>8}")
    for r in results:
        m = r["medians_ms"]
        print(f"{r['case']:<24}{m['uncached']:>10.2f}{m['hit (device pool)']:>10.2f}"
              f"{m['miss (computed and stored)']:>10.2f}"
              f"{m['host-tier copy (added to a hit)']:>11.2f}{r['hit_over_uncached']:>10.2f}"
              f"{r['target_hit_ms'] or float('nan'):>8.1f}")
    print(f"\n{'case':<24}{'replay wall / GPU / rest of the call (ms)':>42}")
    for r in results:
        for what, part in (r["replay_ms"] or {}).items():
            if part:
                print(f"{r['case'] + ' ' + what:<32}{part['replay_wall']:>10.2f}"
                      f"{part['replay_gpu']:>10.2f}{part['rest_of_call']:>10.2f}")
    path = rf.write_result(FLAGS.out, "prompt_cache", {
        "date": rf.utc_now(), "device": str(device), "items": FLAGS.items,
        "paths": FLAGS.paths, "repeats": FLAGS.repeats, "cases": results}, FLAGS.tag)
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
