"""Replicas behind ``xgr serve --replicas``: the throughput at a P99 bound on 1, 2, 4 and 8
GPUs under a session workload, and how well it scales, in one run.

    python -m benchmarks.bench_replicas --preset=qwen2-0.5b --device=cuda:0 \\
        --items=1000000 --paths=250000 --long_items=200 --recent_items=55 \\
        --beam_width=256 --top_k=300 --max_batch=16 --max_batch_size=16 \\
        --replica_counts=1,2,4,8 --rates_per_replica=120,180,240,300 --client_processes=8
    python -m benchmarks.bench_replicas    # a CPU smoke run at tiny sizes (replicas 1 and 2)

1. A random-weight ``--preset`` with a version 2 prompt card (``--long_items`` long-term items,
   ``--recent_items`` recent: prompts of about ``4 x (long + recent)`` tokens; 200 + 55 gives
   the 1024-token prompt of the headline case) over ``--items`` catalog items, exported once
   by ``xgr export`` (with ``--prompt_cache`` unless ``--noprompt_cache``).
2. For each count N of ``--replica_counts``: ``xgr serve`` (N = 1), or ``xgr serve --replicas N``
   with replica i on GPU i (on the CPU: N processes on the host's cores), each replica with
   its own batching and prompt cache (``--prompt_cache_gb``), behind one front that routes by
   the user key; TF Serving gRPC clients send the session workload (``--population`` users,
   Zipf ``--zipf``, the key as ``x-user-key`` metadata) as Poisson arrivals at each rate of
   ``--rates_per_replica`` times N, for ``--rate_seconds`` each, from ``--client_processes``
   processes.
3. Per count: the highest rate whose P99 (and every lower rate's) stays within
   ``--p99_target_ms`` with no failed request, its scaling efficiency (throughput over N times
   one replica's), the share of requests each replica answered, and the prompt cache's hit
   rate over all replicas (affinity keeps a returning user on the replica that holds them).
   Every answer is compared with the single server's answer for the same user (items exact at
   float32; at 16 bits the ranked-list rule's ties are counted, not failed).

Writes ``results/replicas_<date>_<label>.json`` and prints a table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.serve_process import ROOT
from benchmarks import session_load
from benchmarks.session_load import (LoadSettings, Server, best_rate, cache_counters,
                                     define_load_flags, define_world_flags, export_or_take,
                                     metric_samples, open_loop, return_intervals,
                                     world_from_flags)
from xgr_common.multi_gpu import NO_MULTICAST

FLAGS = flags.FLAGS
define_world_flags(long_items=12, recent_items=4,
                   device_note=" Each replica sees its own GPU as cuda:0.")
define_load_flags("rates_per_replica", ["2", "4"], "Open-loop rates (req/s) of one replica; "
                  "N replicas are swept at N times each.")
flags.adopt_module_key_flags(session_load)
flags.DEFINE_integer("population", 200, "Users of the session workload.")
flags.DEFINE_list("replica_counts", ["1", "2"], "Replica counts to serve with (GPUs on a GPU "
                  "host: at most the GPUs it has).")
flags.DEFINE_bool("prompt_cache", True, "Export with the prompt cache and send user keys.")
flags.DEFINE_float("prompt_cache_gb", 1.0, "Each replica's --prompt_cache_gb.")
flags.DEFINE_integer("verify_requests", 0, "xgr export --verify_requests.")
flags.DEFINE_string("saved_model", None, "Serve this export instead of exporting: one made "
                    "with the same world flags (preset, items, paths, long_items, recent_items, "
                    "population), as bench_served_cache's --work leaves in cached/ or plain/.")
flags.DEFINE_bool("export_only", False, "Export into --work/saved and stop (a later run "
                  "takes it with --saved_model): lets a driver run the exports side by side.")
flags.DEFINE_string("work", None, "Working folder (default: a temporary one, removed).")
flags.DEFINE_string("label", "cpu", "Device label of the result file.")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "benchmarks", "results"), "Result folder.")


def gpu_count() -> int:
    """GPUs this host has (0 without CUDA), without holding one."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def serve_flags(count: int) -> tuple[str, ...]:
    """``xgr serve``'s flags for ``count`` replicas."""
    out = [f"--prompt_cache_gb={FLAGS.prompt_cache_gb}"] if FLAGS.prompt_cache else []
    if count > 1:
        out.append(f"--replicas={count}")
        if FLAGS.device.startswith("cuda"):
            out.append("--replica_devices=" + ",".join(str(i) for i in range(count)))
    return tuple(out)


def replica_ports(server: Server, count: int) -> dict[str, int]:
    """Each replica's REST port (name -> port): the front's own for one replica, else from
    the front's log record that lists them."""
    if count == 1:
        return {"r0": server.rest_port}
    for record in server.log_records():
        if record.get("replicas") and isinstance(record["replicas"], list):
            return {r["name"]: int(r["rest_port"]) for r in record["replicas"]}
    raise RuntimeError(f"the front's log {server.log_path} does not list its replicas")


def answered_by_replica(server: Server, count: int) -> dict[str, float]:
    """Requests each replica answered so far, from the front's router metrics."""
    if count == 1:
        return {}
    out: dict[str, float] = {}
    for name, labels, value in metric_samples(server.rest_port, "xgr_router_requests_total"):
        if name == "xgr_router_requests_total" and labels.get("code") == "OK":
            out[labels["replica"]] = out.get(labels["replica"], 0.0) + value
    return out


def cache_totals(ports: dict[str, int]) -> dict[str, float]:
    """The prompt-cache counters summed over the replicas."""
    total: dict[str, float] = {}
    for port in ports.values():
        for key, value in cache_counters(port).items():
            total[key] = total.get(key, 0.0) + value
    return total


def run_count(count: int, saved: Path, work: Path, requests: list[dict],
              arrivals: dict[float, np.ndarray], reference: dict, dtype: str) -> dict:
    """One replica count's sweep (see the module docstring, step 3)."""
    load = LoadSettings(FLAGS.rate_seconds, FLAGS.workers, FLAGS.client_processes)
    server = Server(saved, work, f"replicas{count}", FLAGS.max_batch_size,
                    FLAGS.batch_timeout_micros, serve_flags(count))
    rows = []
    try:
        ports = replica_ports(server, count)
        for per_replica in [float(r) for r in FLAGS.rates_per_replica]:
            rate = per_replica * count
            before = cache_totals(ports) if FLAGS.prompt_cache else None
            spread_before = answered_by_replica(server, count)
            row = open_loop(server.grpc_port, FLAGS.prompt_cache, requests,
                            arrivals[per_replica], rate, load,
                            reference if reference else None, dtype)
            answers = row.pop("answers")
            del row["broken"]                 # counted in `wrong`; replicas settle nothing
            for user, answer in answers.items():
                reference.setdefault(user, answer)
            if FLAGS.prompt_cache:
                after = cache_totals(ports)
                delta = {k: after[k] - before[k] for k in after}
                row["hit_rate"] = delta["hits"] / max(delta["lookups"], 1)
            spread = answered_by_replica(server, count)
            served = {k: spread.get(k, 0.0) - spread_before.get(k, 0.0) for k in spread}
            row["answered_by_replica"] = served
            rows.append(row)
            print(f"{count} replica(s), rate {rate:7.1f}: {row['throughput']:7.1f} req/s, "
                  f"P50 {row['p50_ms'] or float('nan'):.1f} ms, P99 "
                  f"{row['p99_ms'] or float('nan'):.1f} ms, failed {row['failed']}"
                  + (f", hit rate {row['hit_rate']:.2f}" if FLAGS.prompt_cache else ""),
                  flush=True)
    finally:
        exit_code = server.stop()
    return {"replicas": count, "rows": rows, "server_exit": exit_code,
            "best_rate": best_rate(rows, FLAGS.p99_target_ms)}


def main(argv: list[str]) -> None:
    del argv
    import torch_engine.model  # noqa: F401  (torch before TensorFlow on the GPU host)

    os.environ.update(NO_MULTICAST)
    counts = sorted({int(c) for c in FLAGS.replica_counts})
    if FLAGS.device.startswith("cuda") and counts[-1] > gpu_count():
        raise app.UsageError(f"--replica_counts asks for {counts[-1]} GPUs; this host has "
                             f"{gpu_count()}")
    if FLAGS.export_only and not FLAGS.work:
        raise app.UsageError("--export_only needs --work (where the export stays)")
    rng = np.random.default_rng(0)
    work = Path(FLAGS.work or tempfile.mkdtemp(prefix="xgr_replicas_"))
    work.mkdir(parents=True, exist_ok=True)
    world = world_from_flags(FLAGS.population, FLAGS.zipf)
    spec = world.prompt_spec()
    ids, codes = world.catalog(rng)
    saved, dtype = export_or_take(FLAGS.saved_model, work, world, ids, codes,
                                  FLAGS.verify_requests,
                                  *(("--prompt_cache",) if FLAGS.prompt_cache else ()))
    if FLAGS.export_only:
        print(f"exported to {saved}")
        return
    requests = world.user_requests(ids, rng)
    per_replica = [float(r) for r in FLAGS.rates_per_replica]
    # One user sequence per per-replica rate, long enough for the largest count's rate: every
    # count sends the same users in the same order, only faster.
    arrivals = {r: world.arrivals(np.random.default_rng(int(r * 1000)),
                                  int(r * counts[-1] * FLAGS.rate_seconds * 2) + 8)
                for r in per_replica}
    reference: dict[int, np.ndarray] = {}
    results = [run_count(c, saved, work, requests, arrivals, reference, dtype)
               for c in counts]
    one = next((r["best_rate"] for r in results if r["replicas"] == 1), None)
    for r in results:
        best = r["best_rate"]
        r["efficiency"] = (best / (r["replicas"] * one)) if best and one else None
        at_best = [row for row in r["rows"] if row["throughput"] == best]
        r["at_best"] = ({k: at_best[0].get(k) for k in ("rate", "p50_ms", "p99_ms",
                                                         "hit_rate", "answered_by_replica")}
                        if at_best else None)
    print(f"\n{FLAGS.preset}, {spec.max_prompt_tokens}-token prompts, beam "
          f"{FLAGS.beam_width}, top_k {FLAGS.top_k}, {FLAGS.population} users, Zipf "
          f"{FLAGS.zipf:g}; P99 <= {FLAGS.p99_target_ms:g} ms")
    print(f"{'replicas':>9}{'req/s':>10}{'efficiency':>12}{'P99 ms':>9}{'hit rate':>10}")
    for r in results:
        at = r["at_best"] or {}
        print(f"{r['replicas']:>9}{r['best_rate'] or float('nan'):>10.1f}"
              f"{r['efficiency'] or float('nan'):>12.2f}{at.get('p99_ms') or float('nan'):>9.1f}"
              f"{at.get('hit_rate') if at.get('hit_rate') is not None else float('nan'):>10.2f}")
    wrong = sum(row["wrong"] for r in results for row in r["rows"])
    failed = sum(row["failed"] for r in results for row in r["rows"])
    print(f"answers different from the first count's: {wrong} wrong; failed requests "
          f"{failed} (over the bound, a 503 is shed load)")
    all_rates = np.concatenate([arrivals[r] for r in per_replica])
    path = rf.write_result(FLAGS.out_dir, "replicas", {
        "date": rf.utc_now(), "preset": FLAGS.preset, "device": FLAGS.device, "dtype": dtype,
        "items": FLAGS.items, "prompt_tokens": spec.max_prompt_tokens,
        "beam_width": FLAGS.beam_width, "top_k": FLAGS.top_k,
        "population": FLAGS.population, "zipf": FLAGS.zipf,
        "return_share": return_intervals(all_rates, np.zeros(len(all_rates)))["return_share"],
        "prompt_cache": FLAGS.prompt_cache, "prompt_cache_gb": FLAGS.prompt_cache_gb,
        "rate_seconds": FLAGS.rate_seconds, "client_processes": FLAGS.client_processes,
        "p99_target_ms": FLAGS.p99_target_ms, "environment": dict(NO_MULTICAST),
        "counts": results, "wrong_answers": wrong}, FLAGS.label)
    print(f"result: {path}")
    if not FLAGS.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
