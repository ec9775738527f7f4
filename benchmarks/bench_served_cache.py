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
   recent part, request arrivals Poisson at each rate of ``--rates`` for ``--rate_seconds``,
   each request one user drawn by a Zipf law of exponent ``--zipf`` over the population, so
   users return within seconds to minutes (the return intervals are reported). The same
   request sequence goes to both servers; the cached one gets the users' keys (gRPC
   metadata ``x-user-key``).
3. Each server: ``xgr serve`` with batching, TF Serving gRPC clients (``--workers`` threads
   carrying the open-loop arrivals), per rate the throughput, P50 / P99 and failed requests;
   the cached server's hit rate per rate from its Prometheus metrics. Every answer is checked
   against the plain server's answer for the same user (items exact at float32, the
   ranked-list rule at 16 bits).

Reported: the highest rate whose P99 (and every lower rate's) stays within
``--p99_target_ms`` for each server, and their ratio (the target at qwen3-1.7b context 5000:
at least 1.8). Writes ``results/served_cache_<date>_<label>.json``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.serve_process import ROOT, child_env, start_server, stop_server
from benchmarks.team_files import write_team_files

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "tiny", "Random-weight model preset.")
flags.DEFINE_string("device", "cpu", "The engine's device: cpu or cuda[:i].")
flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Engine dtype (default: the "
                  "device's).")
flags.DEFINE_integer("items", 3000, "Catalog items.")
flags.DEFINE_integer("paths", 2500, "Distinct code paths the items share.")
flags.DEFINE_integer("long_items", 24, "Long-term items of every user (the frozen part).")
flags.DEFINE_integer("recent_items", 6, "Recent items of every user.")
flags.DEFINE_integer("population", 200, "Users of the session workload.")
flags.DEFINE_float("zipf", 1.0, "Exponent of the Zipf law that picks each request's user.")
flags.DEFINE_list("rates", ["2", "4"], "Open-loop request rates (req/s).")
flags.DEFINE_float("rate_seconds", 8.0, "Seconds at each rate.")
flags.DEFINE_integer("workers", 32, "Client threads carrying the open-loop arrivals.")
flags.DEFINE_float("p99_target_ms", 100.0, "The latency bound of the throughput figure.")
flags.DEFINE_integer("beam_width", 16, "Beam width.")
flags.DEFINE_integer("top_k", 12, "Items the engine returns.")
flags.DEFINE_integer("max_batch", 16, "Largest batch the packages accept.")
flags.DEFINE_integer("max_batch_size", 8, "Server batching: rows per model call.")
flags.DEFINE_integer("batch_timeout_micros", 2000, "Server batching timeout.")
flags.DEFINE_float("prompt_cache_gb", 1.0, "xgr serve --prompt_cache_gb of the cached server.")
flags.DEFINE_integer("verify_requests", 4, "xgr export --verify_requests of both exports.")
flags.DEFINE_string("work", None, "Working folder (default: a temporary one, removed).")
flags.DEFINE_string("label", "cpu", "Device label of the result file.")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "benchmarks", "results"), "Result folder.")

BLOCK = 86400            # the prompt's history blocks: a day
NOW = 1_750_000_000 // BLOCK * BLOCK + BLOCK // 2   # every request: midday of one block


def prompt_spec():
    """The version 2 prompt of the benchmark's users (long-term items in closed day blocks,
    the recent ones in the open block)."""
    from torch_engine.config import preset
    from xgr_common.prompt_spec import PromptSpec
    from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout

    days = -(-FLAGS.long_items // 10) + 2
    split = HistorySplit(block_seconds=BLOCK, long_term_blocks=days,
                         long_term_items=FLAGS.long_items, recent_items=FLAGS.recent_items)
    return PromptSpec(model_hidden=preset(FLAGS.preset).hidden_size,
                      window_seconds=(days + 2) * BLOCK, prompt_v2=PromptV2Layout(split))


def catalog(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``--items`` ids on ``--paths`` random 3-level paths of 256 codes."""
    paths = rng.integers(0, 256, (FLAGS.paths, 3)).astype(np.int32)
    ids = rng.choice(np.arange(10_000, 10_000 + 20 * FLAGS.items), FLAGS.items,
                     replace=False).astype(np.int64)
    return ids, paths[np.arange(FLAGS.items) % FLAGS.paths]


def user_requests(ids: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """One request (feature arrays of one row) per user of the population: ten long-term
    events a day over the closed blocks before ``NOW``'s, the recent ones in its block."""
    requests = []
    for user in range(FLAGS.population):
        back = np.arange(FLAGS.long_items)[::-1]      # events before the newest one
        long_times = (NOW - NOW % BLOCK - BLOCK * (back // 10 + 1)
                      + 3600 * (23 - back % 10))
        recent_times = NOW - NOW % BLOCK + 60 * (1 + np.arange(FLAGS.recent_items))
        items = rng.choice(ids, FLAGS.long_items + FLAGS.recent_items)
        times = np.concatenate([long_times, recent_times]).astype(np.int64)
        requests.append({
            "user_id": np.array([user + 1], np.int64),
            "country": np.array([b"us"], object),
            "history_items": items.astype(np.int64), "history_times": times,
            "history_splits": np.array([0, len(items)], np.int64),
            "request_time": np.array([NOW], np.int64)})
    return requests


def sequence(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` users drawn by the Zipf law over the population (rank r: weight r^-zipf)."""
    weight = 1.0 / np.arange(1, FLAGS.population + 1) ** FLAGS.zipf
    return rng.choice(FLAGS.population, count, p=weight / weight.sum())


def return_intervals(users: np.ndarray, times: np.ndarray) -> dict:
    """How long users took to come back (seconds), and the share of requests that were a
    return (at most the hit rate a large enough cache reaches)."""
    last, gaps = {}, []
    for user, at in zip(users.tolist(), times.tolist()):
        if user in last:
            gaps.append(at - last[user])
        last[user] = at
    return {"returns": len(gaps), "requests": len(users),
            "return_share": len(gaps) / max(len(users), 1),
            "median_s": float(np.median(gaps)) if gaps else None,
            "p90_s": float(np.percentile(gaps, 90)) if gaps else None}


def export(files: dict, out: Path, *extra: str) -> dict:
    """``xgr export`` in a child process; its report."""
    report = out.parent / f"{out.name}.report.json"
    done = subprocess.run(
        [sys.executable, "-m", "xgr_cli.main", "export", f"--model={files['model']}",
         f"--catalog={files['catalog']}", f"--feature_graph={files['feature_graph']}",
         f"--out={out}", f"--device={FLAGS.device}", f"--beam_width={FLAGS.beam_width}",
         f"--top_k={FLAGS.top_k}", f"--top_n={FLAGS.top_k}", f"--max_batch={FLAGS.max_batch}",
         "--cache_dir=", f"--verify_requests={FLAGS.verify_requests}",
         f"--report_json={report}",
         *([f"--dtype={FLAGS.dtype}"] if FLAGS.dtype else []), *extra],
        cwd=ROOT, env=child_env(TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"xgr export failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(report.read_text())


def cache_counters(rest_port: int) -> dict[str, float]:
    """The cached server's prompt-cache counters, from its Prometheus metrics."""
    url = f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics"
    with urllib.request.urlopen(url, timeout=30) as reply:
        text = reply.read().decode()
    out = {}
    for name in ("lookups", "hits", "misses", "uncached", "evictions"):
        found = re.findall(rf"^xgr_prompt_cache_{name}_total{{[^}}]*}} ([0-9.e+]+)$", text,
                           re.MULTILINE)
        out[name] = sum(float(v) for v in found)
    return out


class Server:
    """``xgr serve`` on one SavedModel, and its clients: each ``send`` is one gRPC Predict
    whose wall time, status and items are kept."""

    def __init__(self, saved_model: Path, work: Path, name: str, keyed: bool):
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        base = work / f"served_{name}"
        shutil.copytree(saved_model, base / "1")
        flags_ = (f"--prompt_cache_gb={FLAGS.prompt_cache_gb}",) if keyed else ()
        self.process, grpc_port, self.rest_port = start_server(
            str(base), str(work / f"{name}.log"), FLAGS.max_batch_size,
            FLAGS.batch_timeout_micros, extra_flags=flags_)
        self.keyed = keyed
        self._channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._protos: dict[int, object] = {}
        self._wait_until_serving()

    def _wait_until_serving(self, timeout: float = 900.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                url = f"http://127.0.0.1:{self.rest_port}/v1/models/recs"
                with urllib.request.urlopen(url, timeout=10) as reply:
                    states = json.loads(reply.read())["model_version_status"]
                if any(v["state"] == "AVAILABLE" for v in states):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("the server did not serve its model in time")

    def proto(self, user: int, features: dict):
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        if user not in self._protos:
            proto = predict_pb2.PredictRequest()
            proto.model_spec.name = "recs"
            for name, array in features.items():
                proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
            self._protos[user] = proto
        return self._protos[user]

    def send(self, user: int, features: dict) -> tuple[float, str, np.ndarray | None]:
        import grpc
        import tensorflow as tf

        metadata = (("x-user-key", f"user-{user}"),) if self.keyed else ()
        started = time.perf_counter()
        try:
            answer = self._stub.Predict(self.proto(user, features), timeout=60,
                                        metadata=metadata)
            items, status = tf.make_ndarray(answer.outputs["item_ids"])[0], "OK"
        except grpc.RpcError as error:
            items, status = None, error.code().name
        return time.perf_counter() - started, status, items

    def stop(self) -> int | str:
        self._channel.close()
        return stop_server(self.process)


def open_loop(server: Server, requests: list[dict], users: np.ndarray, rate: float,
              reference: dict[int, np.ndarray] | None, dtype: str) -> dict:
    """Poisson arrivals of ``users`` at ``rate`` for ``--rate_seconds``; latency of each
    answer and whether its items equal ``reference``'s for that user (None: recorded)."""
    from xgr_common.tolerances import TIE_DTYPES

    rng = np.random.default_rng(int(rate * 1000))
    gaps = rng.exponential(1.0 / rate, len(users))
    records, lock = [], threading.Lock()
    started = time.monotonic()

    def one(user: int) -> None:
        seconds, status, items = server.send(user, requests[user])
        with lock:
            records.append((user, seconds, status, items))

    with concurrent.futures.ThreadPoolExecutor(FLAGS.workers) as pool:
        due = started
        for user, gap in zip(users.tolist(), gaps):
            due += gap
            if due - started > FLAGS.rate_seconds:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            pool.submit(one, user)
    elapsed = time.monotonic() - started
    ok = [r for r in records if r[1] is not None and r[2] == "OK"]
    seconds = np.array([r[1] for r in ok]) if ok else np.zeros(0)
    # Answers for a user the reference run also answered: at float32 equal item by item; at
    # 16 bits the two programs round apart, so ties may swap (counted, not failed).
    differing = sum(1 for user, _, _, items in ok if reference is not None
                    and user in reference and not np.array_equal(items, reference[user]))
    return {"rate": rate, "sent": len(records), "answered": len(ok),
            "failed": len(records) - len(ok), "differing": differing,
            "wrong": differing if dtype not in TIE_DTYPES else 0,
            "throughput": len(ok) / max(elapsed, 1e-9),
            "p50_ms": float(np.percentile(seconds, 50) * 1e3) if len(seconds) else None,
            "p99_ms": float(np.percentile(seconds, 99) * 1e3) if len(seconds) else None,
            "answers": {user: items for user, _, _, items in ok}}


def best_rate(rows: list[dict]) -> float | None:
    """The highest rate whose P99, and every lower rate's, is within the target."""
    best = None
    for row in sorted(rows, key=lambda r: r["rate"]):
        if row["p99_ms"] is None or row["p99_ms"] > FLAGS.p99_target_ms or row["failed"]:
            break
        best = row["throughput"]
    return best


def main(argv: list[str]) -> None:
    del argv
    import torch_engine.model  # noqa: F401  (torch before TensorFlow on the GPU host)

    rng = np.random.default_rng(0)
    work = Path(FLAGS.work or tempfile.mkdtemp(prefix="xgr_served_cache_"))
    spec = prompt_spec()
    ids, codes = catalog(rng)
    files = write_team_files(work / "team", FLAGS.preset, spec, ids, codes)
    print(f"exporting plain and cached SavedModels of {FLAGS.preset} "
          f"({spec.max_prompt_tokens}-token prompts) ...", flush=True)
    plain_report = export(files, work / "plain")
    cached_report = export(files, work / "cached", "--prompt_cache")
    requests = user_requests(ids, rng)
    rates = [float(r) for r in FLAGS.rates]
    arrivals = {rate: sequence(np.random.default_rng(int(rate)), int(rate * FLAGS.rate_seconds
                                                                     * 2) + 8)
                for rate in rates}
    dtype = cached_report["dtype"]
    results, exits, reference = {}, {}, {}
    for name, saved, keyed in (("plain", work / "plain", False),
                               ("cached", work / "cached", True)):
        server = Server(saved, work, name, keyed)
        rows = []
        try:
            for rate in rates:
                before = cache_counters(server.rest_port) if keyed else None
                row = open_loop(server, requests, arrivals[rate], rate,
                                reference if keyed else None, dtype)
                answers = row.pop("answers")
                if not keyed:
                    for user, items in answers.items():
                        reference.setdefault(user, items)
                if keyed:
                    after = cache_counters(server.rest_port)
                    delta = {k: after[k] - before[k] for k in after}
                    row["hit_rate"] = delta["hits"] / max(delta["lookups"], 1)
                    row["cache"] = delta
                rows.append(row)
                print(f"{name:>6} rate {rate:6.1f}: {row['throughput']:6.1f} req/s, P50 "
                      f"{row['p50_ms'] or float('nan'):.1f} ms, P99 "
                      f"{row['p99_ms'] or float('nan'):.1f} ms, failed {row['failed']}"
                      + (f", hit rate {row['hit_rate']:.2f}" if keyed else ""), flush=True)
        finally:
            exits[name] = server.stop()
        results[name] = rows
    plain_best, cached_best = best_rate(results["plain"]), best_rate(results["cached"])
    intervals = return_intervals(np.concatenate([arrivals[r] for r in rates]),
                                 np.cumsum(np.concatenate([
                                     np.random.default_rng(int(r * 1000)).exponential(
                                         1.0 / r, len(arrivals[r])) for r in rates])))
    ratio = (cached_best / plain_best) if plain_best and cached_best else None
    print(f"\nat P99 <= {FLAGS.p99_target_ms:g} ms: plain "
          f"{plain_best or float('nan'):.1f} req/s, cached {cached_best or float('nan'):.1f} "
          f"req/s, ratio {ratio or float('nan'):.2f}; {FLAGS.population} users, Zipf "
          f"{FLAGS.zipf:g}, {intervals['return_share']:.0%} of requests a return (median "
          f"{intervals['median_s'] or float('nan'):.1f} s)")
    wrong = sum(row["wrong"] for row in results["cached"])
    print(f"answers of the cached server different from the plain server's: {wrong}")
    path = rf.write_result(FLAGS.out_dir, "served_cache", {
        "date": rf.utc_now(), "preset": FLAGS.preset, "device": FLAGS.device, "dtype": dtype,
        "items": FLAGS.items, "prompt_tokens": spec.max_prompt_tokens,
        "frozen_tokens": 1 + 4 * FLAGS.long_items, "long_items": FLAGS.long_items,
        "recent_items": FLAGS.recent_items, "beam_width": FLAGS.beam_width,
        "top_k": FLAGS.top_k, "population": FLAGS.population, "zipf": FLAGS.zipf,
        "rate_seconds": FLAGS.rate_seconds, "p99_target_ms": FLAGS.p99_target_ms,
        "prompt_cache_gb": FLAGS.prompt_cache_gb, "workload": intervals,
        "plain": results["plain"], "cached": results["cached"],
        "plain_best_rate": plain_best, "cached_best_rate": cached_best, "ratio": ratio,
        "wrong_answers": wrong, "server_exit": exits,
        "exports": {"plain": plain_report.get("verify", {}).get("ok"),
                    "cached": cached_report.get("verify", {}).get("ok")}}, FLAGS.label)
    print(f"result: {path}")
    if not FLAGS.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
