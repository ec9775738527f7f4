"""The served call against ``Engine.recommend``: one exported SavedModel, called the way the
server calls it (``serving_default`` on a batch of raw features: feature graph -> TorchCall ->
business rules), beside the in-process pipeline over ``Engine.recommend`` (the same feature
graph, the same engine weights and catalog, CUDA graphs and the fused kernels) in the same
process and run.

Pass the flags the SavedModel was exported with (``xgr export``'s, ``--out`` naming the
exported SavedModel): they rebuild the same engine, and each batch of B takes the B requests
the export's ``--verify_requests`` would check. Per batch size it reports the
median milliseconds of

* ``saved_model``: the SavedModel's call, its package replayed as CUDA graphs (TorchCall's
  counters give the graph replays per call, which must be 1);
* ``saved_model eager``: the same call in a child process with the graphs off
  (``XGR_TORCH_CALL_GRAPHS=off``): what replay saves;
* ``pipeline``: the Python pipeline around ``Engine.recommend``, and ``engine``, its
  ``Engine.recommend`` stage alone;

the ratio saved_model / pipeline (target <= 1.15) and whether both return the same items
(the tolerance table's ranked-list rule). Prints a table, writes
``benchmarks/results/served_<date>.json``.

    python -m benchmarks.bench_served --out=SAVED_MODEL <the export's flags> \
        [--batches=1,8] [--repeats=50]
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
from absl import app, flags
from tqdm import tqdm

from benchmarks import results_file as rf
# Before TensorFlow: the engine's Triton kernels and TF both carry LLVM (import order).
from xgr_cli.export import FLAGS, config_from_flags
from xgr_export.export import (build_engine, resolve_attention, resolve_selection,
                               synthetic_sources, team_sources)

BATCHES = flags.DEFINE_list("batches", ["1", "8"], "request batch sizes")
REPEATS = flags.DEFINE_integer("repeats", 50, "timed calls per case (median reported)")
REQUEST_EVENTS = flags.DEFINE_integer(
    "request_history_events", None, "History events per user of the timed requests, when "
    "they differ from the export's --history_events (a shorter context through the same "
    "SavedModel: its prompt buckets take any length up to the exported one)")
EAGER = flags.DEFINE_boolean("eager_anchor", True, "also time the SavedModel with its CUDA "
                             "graphs off, in a child process")
LABEL = flags.DEFINE_string("label", "", "Names the case in the result file "
                            "(served_<label>_<date>.json), one file per model and mask")
OUTPUT = flags.DEFINE_string("output_dir", str(rf.ROOT / "benchmarks" / "results"),
                             "where the JSON goes")
WARMUP = 3
TARGET = 1.15


def _median_ms(call, repeats: int) -> float:
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def _requests(config, sources, batch: int) -> dict:
    """The export's verification requests of ``batch`` rows: the world's first users, or the
    catalog's probe requests (the same ones ``--verify_requests`` checks)."""
    if config.model:
        from xgr_export.probe_requests import probe_features

        return probe_features(sources.item_ids, sources.spec, batch, config.seed + 1)
    import dataclasses

    from tf_frontend.feature_graph import features_from_world
    from xgr_world.synthetic import make_world

    world = config.world
    if REQUEST_EVENTS.value is not None:
        # The catalog is drawn before the users, so it stays the export's.
        world = dataclasses.replace(world, history_events=REQUEST_EVENTS.value)
    return features_from_world(make_world(world), slice(0, batch))


def _eager_ms(saved_model: str, features: dict, repeats: int) -> float:
    """The SavedModel's median call in a fresh process with TorchCall's graphs off."""
    from xgr_export.verify import run_fresh

    before = os.environ.get("XGR_TORCH_CALL_GRAPHS")
    os.environ["XGR_TORCH_CALL_GRAPHS"] = "off"
    try:
        return float(run_fresh(saved_model, features, repeats)["seconds"][2]) * 1e3
    finally:
        if before is None:
            os.environ.pop("XGR_TORCH_CALL_GRAPHS")
        else:
            os.environ["XGR_TORCH_CALL_GRAPHS"] = before


def main(argv):
    del argv
    import torch

    config = config_from_flags()
    saved_model = str(config.out)
    attention = resolve_attention(config.attention_backend, config.engine.device)
    selection = resolve_selection(config.engine.device)
    sources = team_sources(config) if config.model else synthetic_sources(config)
    engine = build_engine(config, sources, attention, selection)

    import tensorflow as tf

    import custom_ops  # noqa: F401
    from bridge.pipeline import RecommendPipeline
    from custom_ops.torch_call import package_stats
    from tf_frontend.pipeline_spec import PipelineConfig
    from xgr_common.serving_names import SERVING_SIGNATURE
    from xgr_export.verify import compare

    search = config.engine
    graph = sources.graph.reloaded() if hasattr(sources.graph, "reloaded") else sources.graph
    pipeline = RecommendPipeline.for_engine(graph, engine, search.beam_width, search.top_k,
                                            PipelineConfig(top_n=config.top_n),
                                            prefill_mask=sources.prefill_mask)
    loaded = tf.saved_model.load(saved_model)  # kept: its tables live as long as it does
    serve = loaded.signatures[SERVING_SIGNATURE]
    dtype = str(engine.dtype).removeprefix("torch.")
    rows = []
    for batch in tqdm([int(b) for b in BATCHES.value], desc="batches"):
        features = _requests(config, sources, batch)
        tensors = {name: tf.constant(value) for name, value in features.items()}
        want = pipeline(tensors)
        got = {name: value.numpy() for name, value in serve(**tensors).items()}
        agreement = compare(got, want, dtype=dtype)
        before = package_stats()
        saved_ms = _median_ms(lambda: {k: v.numpy() for k, v in serve(**tensors).items()},
                              REPEATS.value)
        after = package_stats()
        calls = sum(s.get("calls", 0) for s in after.values()) - sum(
            s.get("calls", 0) for s in before.values())
        replays = sum(s.get("replays", 0) for s in after.values()) - sum(
            s.get("replays", 0) for s in before.values())
        engine_ms = []

        def python_call():
            engine_ms.append(pipeline(tensors)["timings"].engine)

        pipeline_ms = _median_ms(python_call, REPEATS.value)
        eager = _eager_ms(saved_model, features, REPEATS.value) if EAGER.value else None
        lengths = want["prompt_lengths"].numpy()
        splits = want["history_splits"].numpy()
        rows.append({
            "batch": batch, "saved_model_ms": saved_ms, "saved_model_eager_ms": eager,
            "pipeline_ms": pipeline_ms,
            "engine_ms": statistics.median(engine_ms[WARMUP:]),
            "ratio_saved_to_pipeline": saved_ms / pipeline_ms,
            "replays_per_call": replays / calls if calls else None,
            "prompt_tokens": [int(lengths.min()), int(lengths.max())],
            "excluded_items_per_request": float(np.diff(splits).mean()),
            "same_items": agreement.ok, "rows_exact": agreement.rows_exact,
            "rows": batch})
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    stats = package_stats()
    header = (f"{'batch':>5} {'saved_model ms':>14} {'eager ms':>9} {'pipeline ms':>11} "
              f"{'engine ms':>9} {'ratio':>6} {'replays/call':>12} {'same items':>10}")
    print(header)
    for r in rows:
        eager = f"{r['saved_model_eager_ms']:9.2f}" if r["saved_model_eager_ms"] else f"{'-':>9}"
        replays = (f"{r['replays_per_call']:12.2f}" if r["replays_per_call"] is not None
                   else f"{'-':>12}")
        print(f"{r['batch']:5d} {r['saved_model_ms']:14.2f} {eager} {r['pipeline_ms']:11.2f} "
              f"{r['engine_ms']:9.2f} {r['ratio_saved_to_pipeline']:6.2f} {replays} "
              f"{str(r['same_items']):>10}")
    result = {
        "machine": torch.cuda.get_device_name() if torch.cuda.is_available() else rf.machine(),
        "date": rf.utc_now(), "saved_model": saved_model, "model": config.model_name,
        "dtype": dtype, "device": search.device, "attention": attention,
        "selection": selection, "prefill_mask": sources.prefill_mask.value,
        "num_items": len(sources.item_ids), "beam_width": search.beam_width,
        "top_k": search.top_k, "top_n": config.top_n, "repeats": REPEATS.value,
        "label": LABEL.value, "request_history_events": REQUEST_EVENTS.value,
        "target_ratio": TARGET, "rows": rows, "package_stats": stats,
        "versions": {"torch": torch.__version__, "tensorflow": tf.__version__}}
    prefix = f"served_{LABEL.value}" if LABEL.value else "served"
    print("wrote", rf.write_result(OUTPUT.value, prefix, result))


if __name__ == "__main__":
    app.run(main)
