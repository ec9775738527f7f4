"""Probe: why does a served prompt-cache hit cost far more than the engine's hit?

At qwen3-1.7b with 4,001 cached and ~1,000 new tokens, the served cached server's calls imply
a hit far slower than ``Engine.recommend``'s (``docs/notes/gpu_serving.md``, 12-07). Two
differences between the two are candidates, and this probe separates them on one GPU without
TensorFlow:

* **The request's inputs.** The engine benchmark sends bare prompts; a served request also
  carries soft profile vectors and excludes the user's whole history (1,245 items here, a
  2,048-column exclusion bucket). ``Engine.recommend`` is timed with and without them,
  uncached and as a hit (captured graphs, as served).
* **The compiled program.** The same engine exported with the cache
  (``export_cached_engine``, as ``xgr export --prompt_cache`` builds it) is run in a child
  process (AOTInductor's loader) on the same inputs: a miss, then hits, eager and replayed
  from a CUDA graph captured around the package's call, as TorchCall runs it.

Both sides are also profiled eagerly, kernel by kernel (GPU time a call), so a slow kernel
shows by name.

    python -m experiments.probe_served_hit --out=experiments/results          # the GPU
    python -m experiments.probe_served_hit --layer_kernels --out=...   # the fused layer kernels
    python -m experiments.probe_served_hit --device=cpu --preset=tiny --long_items=30 \\
        --recent_items=8 --beam=8 --top_k=6 --items=2000 --repeats=2   # a smoke run
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.engine_analysis import kernel_times, random_catalog_arrays, wall_ms
from benchmarks.session_load import SessionWorld
from experiments.generated_kernels import (generated_origins, jit_specializations,
                                           kernel_launches, wrapper_context)
from tests.torch_engine.engine_worlds import v2_prompts
from experiments.package_child import run_package_child
from torch_engine.catalog import Catalog
from torch_engine.config import engine_config_for, preset
from torch_engine.engine import Engine
from torch_engine.model import Model
from torch_engine.prompt_cache import KVGeometry, PromptCache, PromptCacheConfig
from xgr_common.prompt_spec import PromptSpec
from xgr_export.cached_package import PAGE_TOKENS, export_cached_engine
from xgr_export.config import EngineExportConfig
from xgr_export.engine_package import exclusion_width

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "qwen3-1.7b", "Random-weight model preset.")
flags.DEFINE_integer("long_items", 1000, "Long-term items (the cached part, 4 tokens each).")
flags.DEFINE_integer("recent_items", 245, "Recent items (the new part).")
flags.DEFINE_integer("items", 1_000_000, "Catalog items.")
flags.DEFINE_integer("paths", 250_000, "Distinct code paths.")
flags.DEFINE_integer("beam", 256, "Beam width.")
flags.DEFINE_integer("top_k", 300, "Items returned.")
flags.DEFINE_integer("repeats", 20, "Timed calls per row.")
flags.DEFINE_string("device", "cuda", "Torch device.")
flags.DEFINE_string("out", None, "Folder for the result JSON (none: printed only).")
flags.DEFINE_string("work", None, "Folder for the package (default: a temporary one).")
flags.DEFINE_string("quiet_after", None, "A file whose appearance says the card is quiet "
                    "again: the package's timings wait for it (another job may use the card "
                    "while the package compiles), at most --quiet_wait_s.")
flags.DEFINE_bool("package", True, "Also compile and time the cached package (minutes of "
                  "compile); off: the engine's rows only.")
flags.DEFINE_integer("quiet_wait_s", 1500, "Longest wait for --quiet_after.")
flags.DEFINE_bool("layer_kernels", False, "Export the package with the engine's fused layer "
                  "kernels (xgr export --layer_kernels on; CUDA only) instead of Inductor's "
                  "fusion of the plain layer.")

# The child: the package loaded as a server loads it, a miss, then hits eager and replayed.
_CHILD = r"""
import json, statistics, sys
import torch
from benchmarks.engine_analysis import kernel_times, wall_ms
from experiments.generated_kernels import kernel_launches
from torch_engine.aoti_loading import load_package
package, inputs_path, out_path = sys.argv[1:]
a = torch.load(inputs_path)
device, repeats = a["device"], a["repeats"]
# Single-threaded, as TorchCall loads a package it captures: the default container queries
# CUDA events during a run, which invalidates a capture.
run = load_package(package, run_single_threaded=device.startswith("cuda"))
pool = torch.zeros(a["pool_shape"], dtype=a["dtype"], device=device)
features = [t.to(device) for t in a["features"]]
table = a["table"].to(device)
miss_in = [*features, torch.zeros(1, dtype=torch.int64, device=device), table,
           a["miss_slots"].to(device), pool]
hit_in = [*features, torch.full((1,), a["frozen"], dtype=torch.int64, device=device), table,
          a["hit_slots"].to(device), pool]
cuda = device.startswith("cuda")
def timed(fn):
    return statistics.median(wall_ms(fn, repeats))
result = {}
with torch.no_grad():
    miss = run(*miss_in)
    hit = run(*hit_in)
    result["miss_eager_ms"] = timed(lambda: run(*miss_in))
    result["hit_eager_ms"] = timed(lambda: run(*hit_in))
    if cuda:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(*hit_in)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                captured = run(*hit_in)
            result["hit_replay_ms"] = timed(graph.replay)
            result["replay_items_equal"] = bool(torch.equal(captured[0], hit[0]))
        except Exception as error:  # noqa: BLE001 - a probe reports what failed
            result["capture_error"] = repr(error)[:500]
    kernels = kernel_times(lambda: run(*hit_in))
    launches = kernel_launches(lambda: run(*hit_in))
result["hit_kernels_us"] = dict(list(kernels.items())[:40])
result["hit_kernel_total_us"] = sum(kernels.values())
result["hit_launches"] = dict(list(launches.items())[:40])
result["miss_items"] = miss[0].cpu().tolist()
result["hit_items"] = hit[0].cpu().tolist()
json.dump(result, open(out_path, "w"))
"""


def served_inputs(spec: PromptSpec, codes: np.ndarray, ids: np.ndarray,
                  dtype: torch.dtype):
    """One user's request as the feature graph hands it over: the v2 prompt, soft vectors,
    and the whole history excluded (padded to the package's exclusion width)."""
    rng = np.random.default_rng(1)
    rows = rng.choice(len(ids), FLAGS.long_items + FLAGS.recent_items, replace=False)
    long_rows, recent_rows = rows[:FLAGS.long_items], rows[FLAGS.long_items:]
    text = spec.prompt_v2.spans
    tokens, lengths, segments, frozen = v2_prompts(
        [(list(long_rows), list(recent_rows), 0)], spec.layout,
        soft_tokens=spec.profile_tokens, intro=text.intro, before_profile=text.before_profile,
        question=text.question, code_of=lambda item, level: int(codes[item, level]))
    soft = torch.randn(1, spec.profile_tokens, spec.model_hidden,
                       generator=torch.Generator().manual_seed(2)).to(dtype)
    exclude = torch.full((1, exclusion_width(spec, EngineExportConfig(FLAGS.beam, FLAGS.top_k))),
                         -1, dtype=torch.int64)
    exclude[0, :len(rows)] = torch.from_numpy(ids[rows].astype(np.int64))
    return [tokens, lengths, segments, soft, exclude], int(frozen[0])


def timed(fn) -> float:
    return statistics.median(wall_ms(fn, FLAGS.repeats))


def engine_kernels() -> dict:
    """The engine's Triton kernels whose package copies ran slower (served_hit, 12-07)."""
    import importlib

    # By module path: the package re-exports functions under the modules' names.
    module = {name: importlib.import_module(f"torch_engine.kernels.{name}")
              for name in ("decode_attention", "layer_ops", "paged_attention")}
    return {"_silu_mul_kernel": module["layer_ops"]._silu_mul_kernel,
            "_qkv_rotary_kernel": module["layer_ops"]._qkv_rotary_kernel,
            "_paged_prefill_kernel": module["paged_attention"]._paged_prefill_kernel,
            "_decode_partial_kernel": module["decode_attention"]._decode_partial_kernel}


def engine_rows(model, catalog, spec, features, frozen, device, name) -> dict:
    """Captured engines as served: uncached and hit, with and without the request's soft
    vectors and exclusions; then one eager hit kernel by kernel."""
    geometry = KVGeometry.of_model(model.config, next(model.parameters()).dtype)
    on = [t.to(device) for t in features]
    tokens, lengths, segments, soft, exclude = on
    frozen_t = torch.tensor([frozen])
    out = {}
    for graphs in (True, False):
        config = engine_config_for(spec, cuda_graphs=graphs and device.type == "cuda")
        pages = 2 * -(-tokens.shape[1] // PAGE_TOKENS) + 4
        cache = PromptCache(geometry, PromptCacheConfig(
            device_bytes=pages * geometry.page_bytes(PAGE_TOKENS), page_tokens=PAGE_TOKENS),
            device)
        plain = Engine(model, catalog, config)
        cached = Engine(model, catalog, config, prompt_cache=cache, model_version=name)

        def call(engine, served: bool, hit: bool):
            extra = {"prefix_embeds": soft, "exclude_items": exclude} if served else {
                "prefix_embeds": soft}
            if hit:
                extra["frozen_lengths"] = frozen_t
            return lambda: engine.recommend(tokens, lengths, segments, FLAGS.beam, FLAGS.top_k,
                                            **extra)
        cached_call = call(cached, True, True)
        cached_call()                                               # the entry exists
        if graphs:
            out["engine_uncached_served_ms"] = timed(call(plain, True, False))
            out["engine_uncached_no_exclusions_ms"] = timed(call(plain, False, False))
            out["engine_hit_served_ms"] = timed(cached_call)
            out["engine_hit_no_exclusions_ms"] = timed(call(cached, False, True))
            out["engine_items"] = cached_call()[0].cpu().tolist()
        else:
            out["engine_hit_eager_ms"] = timed(cached_call)
            kernels = kernel_times(cached_call)
            out["engine_hit_kernels_us"] = dict(list(kernels.items())[:40])
            out["engine_hit_kernel_total_us"] = sum(kernels.values())
            out["engine_hit_launches"] = dict(list(kernel_launches(cached_call).items())[:40])
            out["engine_jit_specializations"] = jit_specializations(engine_kernels())
    return out


def package_rows(engine, spec, features, frozen, device, work: Path) -> dict:
    started = time.perf_counter()
    path = work / "cached.pt2"
    # Inductor's generated sources land in a folder of the probe's own, to be read back.
    generated = work / "inductor"
    with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(generated)}):
        export_cached_engine(engine, spec, path, EngineExportConfig(
            FLAGS.beam, FLAGS.top_k, max_batch=4, device=str(device)),
            layer_kernels=FLAGS.layer_kernels)
    compile_s = time.perf_counter() - started
    waited = time.perf_counter()
    while FLAGS.quiet_after and not Path(FLAGS.quiet_after).exists() and (
            time.perf_counter() - waited < FLAGS.quiet_wait_s):
        time.sleep(2)
    print(f"compiled in {compile_s:.0f} s; running the package "
          f"(waited {time.perf_counter() - waited:.0f} s for a quiet card) ...", flush=True)
    cfg = engine.model.config
    width = features[0].shape[1]
    pages = -(-width // PAGE_TOKENS) + 1
    table = torch.arange(1, pages + 1, dtype=torch.int32)[None]
    position = torch.arange(width)
    slots = table[0, position // PAGE_TOKENS].long() * PAGE_TOKENS + position % PAGE_TOKENS
    result = run_package_child(_CHILD, path, {
        "device": str(device), "dtype": next(engine.model.parameters()).dtype,
        "repeats": FLAGS.repeats, "features": features, "table": table, "frozen": frozen,
        "pool_shape": (cfg.num_layers, 2, pages + 1, PAGE_TOKENS, cfg.num_kv_heads,
                       cfg.head_dim),
        "miss_slots": torch.where(position < frozen, slots, 0)[None],
        "hit_slots": torch.zeros((1, width - frozen), dtype=torch.int64)}, work, timeout=900)
    result["compile_s"] = compile_s
    if "child_error" in result:
        return result
    result["layer_kernels"] = FLAGS.layer_kernels
    # Inductor's own kernels, and the engine's kernels as the package compiled them.
    own = [name for name in result.get("hit_kernels_us", {})
           if name.startswith(("triton_", "_"))]
    result["generated_origins"] = generated_origins(generated, own)
    result["wrapper_context"] = wrapper_context(generated, own)
    return result


def print_launches(engine: dict, package: dict) -> None:
    """The kernels both sides run, side by side: launches a call, time, block, grid,
    registers (the same Triton kernel may be launched differently by the package)."""
    shared = [name for name in package if name in engine]
    if not shared:
        return
    print("\nkernels both run (engine | package): launches, us, block, grid, registers")
    for name in shared[:20]:
        rows = [engine[name], package[name]]
        print(f"  {name[:48]:<48}" + " | ".join(
            f"{r['launches']:>5.0f} {r['us']:>8.1f} {r['block']} {r['grid']} {r['registers']}"
            for r in rows))


def main(argv: list[str]) -> None:
    del argv
    device = torch.device(FLAGS.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = Model(preset(FLAGS.preset))
    model = model.to(dtype).eval()
    model.init_weights(0)
    # The served benchmark's prompt card (bench_served_cache's world), one user.
    spec = SessionWorld(FLAGS.preset, FLAGS.items, FLAGS.paths, FLAGS.long_items,
                        FLAGS.recent_items, population=1, zipf=1.0).prompt_spec()
    ids, codes = random_catalog_arrays(FLAGS.items, min(FLAGS.paths, FLAGS.items),
                                       spec.layout)
    catalog = Catalog.from_arrays(ids, codes, spec.layout).to(device)
    features, frozen = served_inputs(spec, codes, ids, dtype)
    print(f"{FLAGS.preset}: prompt {features[0].shape[1]} tokens, frozen {frozen}, "
          f"exclusion columns {features[4].shape[1]}", flush=True)
    with torch.no_grad():
        result = engine_rows(model, catalog, spec, features, frozen, device, FLAGS.preset)
        print(f"engine: {json.dumps({k: round(v, 2) for k, v in result.items() if k.endswith('_ms')})}",
              flush=True)
        package = {}
        if FLAGS.package:
            engine = Engine(model, catalog, engine_config_for(spec))
            work = Path(FLAGS.work or tempfile.mkdtemp(prefix="probe_served_hit_"))
            work.mkdir(parents=True, exist_ok=True)
            print("compiling the cached package ...", flush=True)
            package = package_rows(engine, spec, features, frozen, device, work)
    result["package"] = package
    if "hit_items" in package:
        want = result["engine_items"][0]
        result["package_hit_items_equal_engine"] = package["hit_items"][0] == want
        for side in ("hit", "miss"):     # bf16 programs may trade near-tied items
            result[f"package_{side}_items_shared"] = len(set(package[f"{side}_items"][0])
                                                         & set(want))
    for key in ("engine_items",):
        result.pop(key, None)
    for key in ("miss_items", "hit_items"):
        package.pop(key, None)
    print("\nms a call (median):")
    for key, value in {**result, **{f"package_{k}": v for k, v in package.items()}}.items():
        if key.endswith("_ms"):
            print(f"  {key:<40}{value:>9.2f}")
    for side, kernels, total in (
            ("engine hit (eager)", result.get("engine_hit_kernels_us"),
             result.get("engine_hit_kernel_total_us")),
            ("package hit (eager)", package.get("hit_kernels_us"),
             package.get("hit_kernel_total_us"))):
        if not kernels:
            continue
        print(f"\n{side}: {total:.0f} us of kernels a call (the slowest 25)")
        for name, us in list(kernels.items())[:25]:
            print(f"  {us:>9.1f} us  {name[:100]}")
    print_launches(result.get("engine_hit_launches") or {}, package.get("hit_launches") or {})
    for name, origin in (package.get("generated_origins") or {}).items():
        print(f"\n{name}: xnumel {origin['xnumel']}, size hints {origin['size_hints']}, "
              f"mutates {origin['mutated']}, launch {origin['launch_configs']}, "
              f"attributes {origin['arg_attributes']}, types {origin.get('signature')}")
        for line in origin["origins"] + (package.get("wrapper_context") or {}).get(name, []):
            print(f"    {line[:160]}")
        for key in (result.get("engine_jit_specializations") or {}).get(name, [])[:2]:
            print(f"    engine's compile: {key[:300]}")
    if "child_error" in package:
        print("\npackage child failed:\n" + package["child_error"])
    if FLAGS.out:
        path = rf.write_result(FLAGS.out, "served_hit", {
            "date": rf.utc_now(), "preset": FLAGS.preset, "device": str(device),
            "prompt_tokens": int(features[0].shape[1]), "frozen_tokens": frozen,
            "exclusion_columns": int(features[4].shape[1]), "beam": FLAGS.beam,
            "top_k": FLAGS.top_k, "items": FLAGS.items, **result})
        print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
