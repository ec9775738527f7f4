"""Where a replayed batch-1 search spends host time before its graph runs, per model.

    python -m experiments.probe_replay_host --replay_out=experiments/results

``bench_engine.py --stages=host`` found the whole call ~25 us over the graph at qwen2-0.5b
(prompt 1024) but ~260 us at qwen3-1.7b (context 1000), with the replay step (input copies,
graph launch, result clones) at 123 against 388 us of host time. This probe splits that step
for both shapes, each on its captured whole-search graph (median host microseconds of 200
calls, synchronised between calls):

* ``load``: the argument copies into the bucket's buffers and the extent fill;
* ``replay``: ``CUDAGraph.replay()`` alone;
* ``clones``: the two result clones; ``key``: the graph lookup key;
* ``replay_wall_minus_graph``: one synchronised replay on an idle device, wall time minus the
  graph's device time (what the launch costs before and after the graph's own work).

qwen3-1.7b runs at context 1000 (padded to the 1024 bucket) and at 1024 (no padding).
Writes ``replay_host_<date>.json``.
"""

from __future__ import annotations

import statistics
import time

import torch
from absl import app, flags

from benchmarks import engine_analysis as ea
from benchmarks import results_file as rf
from benchmarks.bench_engine import (BEAM, TOP_K, engine_for, make_catalog,
                                     prompts, random_model)
from torch_engine.checks import check_arguments
from torch_engine.runner import StaticInputs

FLAGS = flags.FLAGS
flags.DEFINE_string("replay_out", "experiments/results", "folder for replay_host_<date>.json")
flags.DEFINE_integer("calls", 200, "timed calls per step")


def host_us(fn, calls: int) -> float:
    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(out)


def probe(preset: str, prompt: int, catalog, device) -> dict:
    model = random_model(preset, device)
    engine = engine_for(model, catalog)
    tokens, lengths = prompts(1, prompt, device)
    engine.recommend(tokens, lengths, beam_width=BEAM, top_k=TOP_K)      # capture
    args = check_arguments(engine.limits, tokens, lengths, None, BEAM, TOP_K, None, None)
    runner = engine.runner
    captured = runner._graphs[(runner.shape(args), BEAM, TOP_K)]
    graph_ms = statistics.median(ea.device_ms(captured.graph.replay))
    row = {"preset": preset, "prompt": prompt, "graph_ms": graph_ms,
           "load_us": host_us(lambda: StaticInputs.load(captured.inputs, args), FLAGS.calls),
           "replay_us": host_us(captured.graph.replay, FLAGS.calls),
           "clones_us": host_us(lambda: (captured.items.clone(), captured.scores.clone()),
                                FLAGS.calls),
           "key_us": host_us(lambda: (runner.shape(args), BEAM, TOP_K), FLAGS.calls)}
    # Wall time of one replay on an idle device against the graph's device time.
    walls = []
    for _ in range(FLAGS.calls // 4):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        captured.graph.replay()
        torch.cuda.synchronize()
        walls.append((time.perf_counter_ns() - start) / 1e3)
    row["replay_wall_minus_graph_us"] = statistics.median(walls) - graph_ms * 1e3
    del engine, model
    torch.cuda.empty_cache()
    return row


def main(argv: list[str]) -> None:
    del argv
    device = torch.device("cuda")
    catalog = make_catalog()
    rows = [probe("qwen2-0.5b", 1024, catalog, device), probe("qwen3-1.7b", 1000, catalog,
                                                             device),
            probe("qwen3-1.7b", 1024, catalog, device)]
    result = {"date": rf.utc_now(),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "rows": rows}
    path = rf.write_result(FLAGS.replay_out, "replay_host", result)
    for row in rows:
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()))
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
