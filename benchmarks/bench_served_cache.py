"""The prompt-KV cache through ``xgr serve`` under a session workload: the throughput at a
P99 bound with and without the cache, in one run.

    python -m benchmarks.bench_served_cache --preset=qwen3-1.7b --device=cuda:0 \\
        --long_items=1000 --recent_items=245 --p99_target_ms=200 --rates=10,20,30,40
    python -m benchmarks.bench_served_cache   # a CPU smoke run at tiny sizes

1. A random-weight ``--preset`` with a version 2 prompt card (``--long_items`` long-term
   items in closed day blocks, ``--recent_items`` in the open one: prompts of about
   ``4 x (long + recent)`` tokens) over a catalog of ``--items`` items, exported twice by
   ``xgr export``: plain, and with ``--prompt_cache``.
2. The session workload: ``--population`` users, each with a fixed long-term history and a
   recent part (``--length_spread``: of lengths drawn per user, so prompts and cached hits
   come in many shapes), request arrivals Poisson at each rate of ``--rates`` for ``--rate_seconds``,
   each request one user drawn by a Zipf law of exponent ``--zipf`` over the population, so
   users return within seconds to minutes (the return intervals are reported). The same
   request sequence goes to both servers; the cached one gets the users' keys (gRPC
   metadata ``x-user-key``).
3. Each server: ``xgr serve`` with batching, TF Serving gRPC clients (``--workers`` threads
   carrying the open-loop arrivals), per rate the throughput, P50 / P99 and failed requests;
   the cached server's hit rate per rate from its Prometheus metrics (and the share of
   requests served from the host tier, with ``--prompt_cache_host_gb``), the mean engine
   call and the host tier's copies per call, and each server's CUDA graph captures per rate
   (a capture is a slow call; ``--warmup_seconds`` at the lowest rate, not counted, takes
   the first ones before the sweep). Every answer is checked
   against the plain server's answer for the same user (items exact at float32, the
   ranked-list rule at 16 bits). Two 16-bit programs may differ by more than one tie, so
   where a cached answer breaks that rule, a float32 search of the same weights decides
   after the servers stop (``PRECISION_RULE``; ``--settle``, ``served_precision``), the
   plain server's answers for the same users checked beside them.

Reported: the highest rate whose P99 (and every lower rate's) stays within
``--p99_target_ms`` for each server, and their ratio (the target at qwen3-1.7b context 5000:
at least 1.8). The rates run in ascending order, and a server's sweep ends at its first rate
past the bound (no higher rate could count). Writes ``results/served_cache_<date>_<label>.json``.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.serve_process import ROOT
from benchmarks import session_load
from benchmarks.session_load import (LoadSettings, Server, ServerNotServing,
                                     best_rate, cache_counters, define_load_flags,
                                     define_world_flags, export, export_check_figures,
                                     export_settings_from_flags, graph_counters, open_loop,
                                     return_intervals, sweep,
                                     timing_counters, window_means, world_from_flags)
from benchmarks.served_precision import settle
from benchmarks.team_files import write_team_files

FLAGS = flags.FLAGS
define_world_flags(long_items=24, recent_items=6)
define_load_flags("rates", ["2", "4"], "Open-loop request rates (req/s).")
flags.adopt_module_key_flags(session_load)
flags.DEFINE_integer("population", 200, "Users of the session workload.")
flags.DEFINE_float("prompt_cache_gb", 1.0, "xgr serve --prompt_cache_gb of the cached server.")
flags.DEFINE_float("smallest_prompt_cache_gb", 4.0, "A cached server that does not load is "
                  "tried again with half its pool while the half is at least this.")
flags.DEFINE_float("prompt_cache_host_gb", 0.0, "xgr serve --prompt_cache_host_gb of the cached "
                   "server (0: no host tier).")
flags.DEFINE_integer("verify_requests", 4, "xgr export --verify_requests of both exports.")
flags.DEFINE_list("export_flags", [], "More xgr export flags for both exports, the same for "
                  "each (e.g. --layer_kernels=on), so the two servers differ only in the cache.")
flags.DEFINE_bool("parallel_exports", False, "Run the two exports side by side (a CPU with cores "
                  "to spare; on one GPU two compiles at once may not fit its memory).")
flags.DEFINE_float("warmup_seconds", 0.0, "Before each server's sweep, this long at the "
                   "sweep's median rate, not counted: the shape buckets' first calls (CUDA "
                   "graph captures, batches of several rows among them) and the cache's first "
                   "fill happen there, and are reported apart.")
flags.DEFINE_bool("settle", True, "After the servers stop, run a float32 search for the users "
                  "whose cached answer broke the ranked-list rule against the plain one, and "
                  "check both servers' answers against it (16-bit exports only).")
flags.DEFINE_string("work", None, "Working folder (default: a temporary one, removed).")
flags.DEFINE_string("label", "cpu", "Device label of the result file.")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "benchmarks", "results"), "Result folder.")


def rate_row(server: Server, name: str, keyed: bool, requests, arrivals: dict, load,
             reference: dict | None, dtype: str, rate: float,
             broken: list | None = None) -> dict:
    """One rate's open-loop run against ``server`` (printed): the plain server's answers
    become ``reference``; the cached server's are checked against it (those that break the
    rule added to ``broken``) and its cache counters read before and after."""
    before = cache_counters(server.rest_port) if keyed else None
    graphs_before = graph_counters(server.rest_port)
    times_before = timing_counters(server.rest_port)
    row = open_loop(server.grpc_port, keyed, requests, arrivals[rate], rate, load,
                    reference if keyed else None, dtype)
    answers = row.pop("answers")
    if broken is not None:
        broken.extend(row["broken"])
    del row["broken"]
    graphs_after = graph_counters(server.rest_port)
    row["graph_captures"] = graphs_after["captures"] - graphs_before["captures"]
    row["eager_runs"] = graphs_after["eager_runs"] - graphs_before["eager_runs"]
    # Where a request's time goes: on the server, in its model call, the rows a call ran.
    row.update(window_means(times_before, timing_counters(server.rest_port)))
    if keyed:
        after = cache_counters(server.rest_port)
        delta = {k: after[k] - before[k] for k in after}
        row["hit_rate"] = delta["hits"] / max(delta["lookups"], 1)
        row["host_hit_rate"] = delta["host_hits"] / max(delta["lookups"], 1)
        row["cache"] = delta
        row.update(engine_call_parts(delta))
    elif reference is not None:
        for user, answer in answers.items():
            reference.setdefault(user, answer)
    print(f"{name:>6} rate {rate:6.1f}: {row['throughput']:6.1f} req/s, P50 "
          f"{row['p50_ms'] or float('nan'):.1f} ms, P99 "
          f"{row['p99_ms'] or float('nan'):.1f} ms, failed {row['failed']}, graph captures "
          f"{row['graph_captures']:.0f}, eager runs {row['eager_runs']:.0f}; on the server "
          f"{_ms(row['server_ms'])} a request, "
          f"{_ms(row['model_call_ms'])} a model call of {row['rows_per_call'] or 0:.2f} rows"
          + (f"; hit rate {row['hit_rate']:.2f} (host tier {row['host_hit_rate']:.2f}), the "
             f"engine {_ms(row['engine_ms_per_call'])} a call: runs "
             f"{_ms(row['call_ms'])} (with a hit {_ms(row['hit_call_ms'])}, without "
             f"{_ms(row['miss_call_ms'])}), spills {_ms(row['spill_ms_per_call'])}, "
             f"restores {_ms(row['restore_ms_per_call'])}" if keyed else ""), flush=True)
    for status, message in row["first_errors"].items():
        print(f"        {status}: {message[:300]}", flush=True)
    return row


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def engine_call_parts(delta: dict[str, float]) -> dict[str, float | None]:
    """A cached server's engine time per call over a window, from its cache counters'
    ``delta``: the runs (``call_ms``; with a hit and without, None where none ran), and the
    host tier's copies, which the cache makes before a run starts (``spill_ms_per_call``,
    ``restore_ms_per_call``); ``engine_ms_per_call`` is their sum."""
    def per(seconds: float, calls: float) -> float | None:
        return 1e3 * seconds / calls if calls > 0 else None

    calls = max(delta["calls"], 1)
    parts = {"call_ms": 1e3 * delta["call_seconds"] / calls,
             "hit_call_ms": per(delta["hit_seconds"], delta["hit_calls"]),
             "miss_call_ms": per(delta["call_seconds"] - delta["hit_seconds"],
                                 delta["calls"] - delta["hit_calls"]),
             "spill_ms_per_call": 1e3 * delta["spill_seconds"] / calls,
             "restore_ms_per_call": 1e3 * delta["restore_seconds"] / calls}
    parts["engine_ms_per_call"] = (parts["call_ms"] + parts["spill_ms_per_call"]
                                   + parts["restore_ms_per_call"])
    return parts


def warm_up(server: Server, name: str, keyed: bool, requests, world, rates: list[float],
            dtype: str) -> dict:
    """``--warmup_seconds`` at the sweep's median rate before the sweep (the lowest rate
    seldom batches rows, so its shapes would capture inside the sweep), on an arrival sequence
    of its own, answers not compared: the row (captures, latency, the cache's first fill)."""
    rate = float(np.median(sorted(rates)))
    users = world.arrivals(np.random.default_rng(7919), int(rate * FLAGS.warmup_seconds * 2) + 8)
    load = LoadSettings(FLAGS.warmup_seconds, FLAGS.workers, FLAGS.client_processes)
    return rate_row(server, f"{name} warm-up", keyed, requests, {rate: users}, load, None,
                    dtype, rate)


def start_server_of(saved: Path, work: Path, name: str, keyed: bool, pool_gb: float,
                    not_serving: dict) -> tuple[Server | None, float]:
    """The server of one export, and the pool it got. A cached server whose version fails
    to load (a pool too large for the card beside the model's own memory, most often) is
    tried again with half the pool, down to ``--smallest_prompt_cache_gb``; every refusal
    lands in ``not_serving`` (None: no pool was served)."""
    while True:
        try:
            return Server(saved, work, name, FLAGS.max_batch_size, FLAGS.batch_timeout_micros,
                          (f"--prompt_cache_gb={pool_gb:g}",
                           f"--prompt_cache_host_gb={FLAGS.prompt_cache_host_gb}")
                          if keyed else ()), pool_gb
        except ServerNotServing as error:     # recorded; the other server still runs
            print(f"{name}: not served" + (f" with a {pool_gb:g} GiB pool" if keyed else "")
                  + f": {error}", flush=True)
            not_serving[f"{name} {pool_gb:g} GiB" if keyed else name] = str(error)
            log = work / f"{name}.log"       # kept apart: the next attempt writes its own
            if log.exists():
                log.rename(work / f"{name}_{pool_gb:g}gib_not_served.log")
            if not keyed or pool_gb / 2 < FLAGS.smallest_prompt_cache_gb:
                return None, pool_gb
            pool_gb /= 2


def main(argv: list[str]) -> None:
    del argv
    import torch_engine.model  # noqa: F401  (torch before TensorFlow on the GPU host)

    rng = np.random.default_rng(0)
    work = Path(FLAGS.work or tempfile.mkdtemp(prefix="xgr_served_cache_"))
    world = world_from_flags(FLAGS.population, FLAGS.zipf)
    spec = world.prompt_spec()
    ids, codes = world.catalog(rng)
    files = write_team_files(work / "team", FLAGS.preset, spec, ids, codes)
    print(f"exporting plain and cached SavedModels of {FLAGS.preset} "
          f"({spec.max_prompt_tokens}-token prompts) ...", flush=True)
    settings = export_settings_from_flags(FLAGS.verify_requests)
    # Each export is a child process; threads only wait on them.
    with ThreadPoolExecutor(max_workers=2 if FLAGS.parallel_exports else 1) as pool:
        plain = pool.submit(export, files, work / "plain", settings, *FLAGS.export_flags)
        cached = pool.submit(export, files, work / "cached", settings, "--prompt_cache",
                             *FLAGS.export_flags)
        plain_report, cached_report = plain.result(), cached.result()
    requests = world.user_requests(ids, rng)
    rates = [float(r) for r in FLAGS.rates]
    arrivals = {rate: world.arrivals(np.random.default_rng(int(rate)),
                                     int(rate * FLAGS.rate_seconds * 2) + 8)
                for rate in rates}
    load = LoadSettings(FLAGS.rate_seconds, FLAGS.workers, FLAGS.client_processes)
    dtype = cached_report["dtype"]
    results, exits, reference, not_serving, warmup = {}, {}, {}, {}, {}
    broken: list = []          # the cached answers that break the rule against the plain's
    pool_gb = FLAGS.prompt_cache_gb
    for name, saved, keyed in (("plain", work / "plain", False),
                               ("cached", work / "cached", True)):
        results[name] = []
        server, pool_gb = start_server_of(saved, work, name, keyed, pool_gb, not_serving)
        if server is None:
            continue
        rows = []
        try:
            if FLAGS.warmup_seconds > 0:
                warmup[name] = warm_up(server, name, keyed, requests, world, rates, dtype)
            rows = sweep(rates, functools.partial(rate_row, server, name, keyed, requests,
                                                  arrivals, load, reference, dtype,
                                                  broken=broken if keyed else None),
                         FLAGS.p99_target_ms)
        finally:
            exits[name] = server.stop()
        results[name] = rows
    plain_best = best_rate(results["plain"], FLAGS.p99_target_ms)
    cached_best = best_rate(results["cached"], FLAGS.p99_target_ms)
    ran = [row["rate"] for row in results["cached"]] or rates    # what the cache saw
    intervals = return_intervals(np.concatenate([arrivals[r] for r in ran]),
                                 np.cumsum(np.concatenate([
                                     np.random.default_rng(int(r * 1000)).exponential(
                                         1.0 / r, len(arrivals[r])) for r in ran])))
    ratio = (cached_best / plain_best) if plain_best and cached_best else None
    print(f"\nat P99 <= {FLAGS.p99_target_ms:g} ms: plain "
          f"{plain_best or float('nan'):.1f} req/s, cached {cached_best or float('nan'):.1f} "
          f"req/s, ratio {ratio or float('nan'):.2f}; {FLAGS.population} users, Zipf "
          f"{FLAGS.zipf:g}, lengths spread {FLAGS.length_spread:g}, "
          f"{intervals['return_share']:.0%} of requests a return (median "
          f"{intervals['median_s'] or float('nan'):.1f} s)")
    wrong = sum(row["wrong"] for row in results["cached"])
    differing = sum(row["differing"] for row in results["cached"])
    print(f"answers of the cached server against the plain server's: {differing} differing "
          f"in some item, {wrong} breaking the ranked-list rule (one tie between them)")
    precision = settle(files, settings, dtype, requests, broken, reference, FLAGS.settle)
    path = rf.write_result(FLAGS.out_dir, "served_cache", {
        "date": rf.utc_now(), "preset": FLAGS.preset, "device": FLAGS.device, "dtype": dtype,
        "items": FLAGS.items, "prompt_tokens": spec.max_prompt_tokens,
        "frozen_tokens": 1 + 4 * FLAGS.long_items, "long_items": FLAGS.long_items,
        "recent_items": FLAGS.recent_items, "length_spread": FLAGS.length_spread,
        "export_flags": FLAGS.export_flags,
        "beam_width": FLAGS.beam_width,
        "top_k": FLAGS.top_k, "population": FLAGS.population, "zipf": FLAGS.zipf,
        "rate_seconds": FLAGS.rate_seconds, "p99_target_ms": FLAGS.p99_target_ms,
        "prompt_cache_gb": pool_gb, "prompt_cache_gb_asked": FLAGS.prompt_cache_gb,
        "prompt_cache_host_gb": FLAGS.prompt_cache_host_gb, "workload": intervals,
        "plain": results["plain"], "cached": results["cached"],
        "plain_best_rate": plain_best, "cached_best_rate": cached_best, "ratio": ratio,
        "wrong_answers": wrong, "differing_answers": differing, "precision": precision,
        "server_exit": exits,
        "not_serving": not_serving, "warmup_seconds": FLAGS.warmup_seconds, "warmup": warmup,
        "export_checks": {name: export_check_figures(report) for name, report in
                          (("plain", plain_report), ("cached", cached_report))}}, FLAGS.label)
    print(f"result: {path}")
    if not FLAGS.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
