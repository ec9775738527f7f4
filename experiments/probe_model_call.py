"""Probe: where a served model call spends its time outside the engine's run.

A served request's model call (``xgr_serving_model_call_seconds``) is the SavedModel's
``serving_default``: the feature graph and the rules in TensorFlow, then TorchCall, whose
own work (the contract's checks, the prompt cache's digests and plan, the staging of inputs,
the hand-back) surrounds the engine package's run. The served prompt-cache benchmark measures
the call and the run (the cache's ``call_seconds``) but not what lies between. This loads a
version as ``xgr serve`` does, builds one user's request of the served benchmark's world
(``benchmarks.session_load``: pass the world flags the SavedModel was exported with), and
times, over ``--calls`` calls with one user key (the first a miss, the rest hits where the
package keeps a cache):

- the model call, as the server makes it (``ServableVersion.run``);
- the TorchCall op and every other TensorFlow op, from TensorFlow's profiler;
- the engine's runs, from the package's cache stats (packages with a cache only).

    python3 -m experiments.probe_model_call --saved_model=DIR --long_items=1000 \
        --recent_items=245 [--calls=30] [--out=DIR]

Needs TensorFlow; runs on the CPU or beside a GPU (where the package's device is).
"""

from __future__ import annotations

import collections
import glob
import os
import statistics
import tempfile
import time

import numpy as np
from absl import app, flags

from benchmarks.session_load import define_world_flags, world_from_flags

define_world_flags(long_items=1000, recent_items=245)
flags.DEFINE_string("saved_model", None, "An exported SavedModel (a version folder).")
flags.DEFINE_integer("calls", 30, "Timed calls (after a miss and a few warm-up hits).")
flags.DEFINE_string("user_key", "probe-user", "The key of every call.")
flags.DEFINE_float("prompt_cache_gb", 4.0, "The prompt cache's pool, as `xgr serve "
                   "--prompt_cache_gb` sizes it (a frozen part larger than the pool is never "
                   "cached).")
flags.DEFINE_string("out", None, "Folder for the result JSON (none: printed only).")
flags.DEFINE_string("tag", "", "Suffix of the result's file name (model_call_<date>_<tag>).")
FLAGS = flags.FLAGS

TORCH_CALL = "TorchCall"


def op_times(trace_dir: str, calls: int) -> dict[str, float]:
    """Milliseconds a call of each TensorFlow op (by type) on the host's compute threads,
    from the profiler's XSpace file under ``trace_dir``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(f"{trace_dir}/plugins/profile/*/*.xplane.pb")
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    totals: dict[str, float] = collections.defaultdict(float)
    for plane in space.planes:
        if not plane.name.startswith("/host"):
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and "::" not in name:   # "scope/op:OpType", not a C++ frame
                    totals[name.rsplit(":", 1)[1]] += event.duration_ps / 1e9
    return {op: ms / calls for op, ms in totals.items()}


def cache_counts() -> dict[str, float]:
    """The prompt caches' calls and run seconds, summed over the loaded packages."""
    from custom_ops.torch_call import package_stats

    sums = {"calls": 0.0, "call_seconds": 0.0, "hit_calls": 0.0}
    for stats in package_stats().values():
        cache = stats.get("prompt_cache") or {}
        for name in sums:
            sums[name] += float(cache.get(name, 0))
    return sums


def main(argv: list[str]) -> None:
    del argv
    # Read by TorchCall's runtime when the package loads, as `xgr serve` sets it.
    os.environ["XGR_PROMPT_CACHE_BYTES"] = str(int(FLAGS.prompt_cache_gb * (1 << 30)))
    from xgr_common.import_order import preload_triton

    preload_triton()      # torch before TensorFlow: see xgr_common/import_order.py
    import tensorflow as tf

    import custom_ops  # noqa: F401  (TorchCall and the feature ops)
    from tf_frontend.serving.servable import ServableVersion
    from benchmarks.results_file import write_result
    from xgr_common.serving_names import SERVING_SIGNATURE, USER_KEY

    version = ServableVersion("probe", 1, FLAGS.saved_model, None)
    world = world_from_flags(population=1)
    rng = np.random.default_rng(0)           # the served benchmark's catalog and first user
    ids, _ = world.catalog(rng)
    features = world.user_requests(ids, rng)[0]
    keyed = USER_KEY in version.signature(SERVING_SIGNATURE).inputs
    request = version.prepare(SERVING_SIGNATURE, features,
                              user_key=FLAGS.user_key if keyed else None)
    items = len(features["history_items"])
    version.run(request)                                  # the miss (or an uncached call)
    for _ in range(3):
        version.run(request)
    # One loop under the profiler gives every figure, so each share is of the same calls.
    model_call = []
    with tempfile.TemporaryDirectory() as trace_dir:
        before = cache_counts()
        tf.profiler.experimental.start(trace_dir)
        for _ in range(FLAGS.calls):
            started = time.perf_counter()
            version.run(request)
            model_call.append((time.perf_counter() - started) * 1e3)
        tf.profiler.experimental.stop()
        after = cache_counts()
        ops = op_times(trace_dir, FLAGS.calls)
    runs = after["calls"] - before["calls"]
    engine_ms = (after["call_seconds"] - before["call_seconds"]) * 1e3 / runs if runs else None
    call = statistics.fmean(model_call)
    torch_call = ops.pop(TORCH_CALL, 0.0)
    others = sum(ops.values())
    rows = [("model call (mean)", call),
            ("  TorchCall op", torch_call),
            ("    the engine's run", engine_ms),
            ("    TorchCall around the run", None if engine_ms is None else torch_call - engine_ms),
            ("  other TensorFlow ops (summed)", others),
            ("  the rest (executor, hand-offs)", call - torch_call - others)]
    hits = int(after["hit_calls"] - before["hit_calls"])
    print(f"{FLAGS.saved_model}: history items {items}, {FLAGS.calls} calls, "
          + (f"{hits} of them hits under one key" if keyed else "no prompt cache"))
    for name, ms in rows:
        print(f"{name:36s} {'-' if ms is None else f'{ms:8.3f} ms'}")
    print(f"model call median {statistics.median(model_call):.3f} ms")
    print("largest other ops:", ", ".join(
        f"{op} {ms:.3f}" for op, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:8]))
    result = {"saved_model": FLAGS.saved_model, "history_items": items,
              "keyed": keyed, "calls": FLAGS.calls, "model_call_ms": model_call,
              "torch_call_ms": torch_call, "engine_run_ms": engine_ms,
              "other_ops_ms": ops, "hits": hits}
    if FLAGS.out:
        print("result:", write_result(FLAGS.out, "model_call", result, tag=FLAGS.tag))


if __name__ == "__main__":
    flags.mark_flag_as_required("saved_model")
    app.run(main)
