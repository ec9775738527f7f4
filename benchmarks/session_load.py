"""A session workload against ``xgr serve``, shared by the serving benchmarks that need users
who come back (``bench_served_cache``, ``bench_replicas``).

* ``SessionWorld``: a random-weight preset with a version 2 prompt card (long-term items in
  closed day blocks, recent ones in the open block), a catalog of random code paths, one
  fixed request per user, and the users of each request drawn by a Zipf law.
* ``export``: ``xgr export`` of that world in a child process.
* ``Server`` / ``Client``: ``xgr serve`` as a child process and a TF Serving gRPC client of
  it (the user key, when sent, as gRPC metadata ``x-user-key``).
* ``open_loop``: Poisson arrivals at a rate, in one or more client processes (one Python
  process's gRPC clients top out near a thousand calls a second), every answer's latency,
  status and items kept.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from absl import flags

from benchmarks.serve_process import ROOT, child_env, start_server, stop_server

BLOCK = 86400            # the prompt's history blocks: a day
NOW = 1_750_000_000 // BLOCK * BLOCK + BLOCK // 2   # every request: midday of one block


@dataclass(frozen=True)
class SessionWorld:
    """Who sends what: ``population`` users of ``preset``, each with ``long_items`` long-term
    items (ten a day, the frozen prompt part) and ``recent_items`` items today (prompts of
    about ``4 x (long + recent)`` tokens), over ``items`` catalog items on ``paths`` code
    paths; each request's user drawn by a Zipf law of exponent ``zipf``. With
    ``length_spread`` s > 0 each user keeps only a share of those, drawn uniformly from
    [1 - s, 1] for each part: prompts of many lengths, as a team's traffic sends them (each
    length bucket, and each suffix width of a cached hit, is a shape of its own)."""

    preset: str
    items: int
    paths: int
    long_items: int
    recent_items: int
    population: int
    zipf: float
    length_spread: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.length_spread < 1.0:
            raise ValueError(f"length_spread must be in [0, 1), got {self.length_spread}")

    def user_lengths(self, rng: np.random.Generator) -> np.ndarray:
        """Each user's (long-term, recent) item counts, ``[population, 2]``."""
        full = np.array([self.long_items, self.recent_items])
        share = rng.uniform(1.0 - self.length_spread, 1.0, (self.population, 2))
        return np.maximum(np.rint(full * share).astype(np.int64), [0, 1])

    def prompt_spec(self):
        from torch_engine.config import preset
        from xgr_common.prompt_spec import PromptSpec
        from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout

        days = -(-self.long_items // 10) + 2
        split = HistorySplit(block_seconds=BLOCK, long_term_blocks=days,
                             long_term_items=self.long_items, recent_items=self.recent_items)
        return PromptSpec(model_hidden=preset(self.preset).hidden_size,
                          window_seconds=(days + 2) * BLOCK, prompt_v2=PromptV2Layout(split))

    def catalog(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``items`` ids on ``paths`` random 3-level paths of 256 codes."""
        paths = rng.integers(0, 256, (self.paths, 3)).astype(np.int32)
        ids = rng.choice(np.arange(10_000, 10_000 + 20 * self.items), self.items,
                         replace=False).astype(np.int64)
        return ids, paths[np.arange(self.items) % self.paths]

    def user_requests(self, ids: np.ndarray, rng: np.random.Generator) -> list[dict]:
        """One request (feature arrays of one row) per user: ten long-term events a day over
        the closed blocks before ``NOW``'s, the recent ones in its block."""
        requests = []
        lengths = (self.user_lengths(rng) if self.length_spread else
                   np.tile([self.long_items, self.recent_items], (self.population, 1)))
        for user, (long_items, recent_items) in enumerate(lengths):
            back = np.arange(long_items)[::-1]      # events before the newest one
            long_times = (NOW - NOW % BLOCK - BLOCK * (back // 10 + 1)
                          + 3600 * (23 - back % 10))
            recent_times = NOW - NOW % BLOCK + 60 * (1 + np.arange(recent_items))
            items = rng.choice(ids, long_items + recent_items)
            times = np.concatenate([long_times, recent_times]).astype(np.int64)
            requests.append({
                "user_id": np.array([user + 1], np.int64),
                "country": np.array([b"us"], object),
                "history_items": items.astype(np.int64), "history_times": times,
                "history_splits": np.array([0, len(items)], np.int64),
                "request_time": np.array([NOW], np.int64)})
        return requests

    def arrivals(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` users drawn by the Zipf law (rank r: weight r^-zipf)."""
        weight = 1.0 / np.arange(1, self.population + 1) ** self.zipf
        return rng.choice(self.population, count, p=weight / weight.sum())


def define_world_flags(long_items: int, recent_items: int, device_note: str = "") -> None:
    """The flags of the benchmarks that build a ``SessionWorld`` and export it: the preset,
    the catalog, the users' long-term and recent items (these defaults given), the engine's
    device (``device_note`` says how several processes share it) and dtype."""
    flags.DEFINE_string("preset", "tiny", "Random-weight model preset.")
    flags.DEFINE_string("device", "cpu", "The engine's device: cpu or cuda[:i]." + device_note)
    flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Engine dtype (default: the "
                      "device's).")
    flags.DEFINE_integer("items", 3000, "Catalog items.")
    flags.DEFINE_integer("paths", 2500, "Distinct code paths the items share.")
    flags.DEFINE_integer("long_items", long_items, "Long-term items of every user (the "
                         "frozen part).")
    flags.DEFINE_integer("recent_items", recent_items, "Recent items of every user.")
    flags.DEFINE_float("length_spread", 0.0, "Each user keeps a uniform share in "
                       "[1 - spread, 1] of --long_items and of --recent_items (0: every "
                       "user the same lengths).")
    flags.DEFINE_integer("beam_width", 16, "Beam width.")
    flags.DEFINE_integer("top_k", 12, "Items the engine returns.")
    flags.DEFINE_integer("max_batch", 16, "Largest batch the exported package accepts.")


def define_load_flags(rates_name: str, rates: list[str], rates_help: str) -> None:
    """The flags of the benchmarks that drive ``xgr serve`` with an open loop: the rates (under
    ``rates_name``), their duration, the clients, the latency bound, the server's batching."""
    flags.DEFINE_float("zipf", 1.0, "Exponent of the Zipf law that picks each request's user.")
    flags.DEFINE_list(rates_name, rates, rates_help)
    flags.DEFINE_float("rate_seconds", 8.0, "Seconds at each rate.")
    flags.DEFINE_integer("workers", 32, "Client threads (per client process) carrying the "
                         "open-loop arrivals.")
    flags.DEFINE_integer("client_processes", 1, "Client processes, each a Poisson stream of an "
                         "equal share of the rate.")
    flags.DEFINE_float("p99_target_ms", 100.0, "The latency bound of the throughput figure.")
    flags.DEFINE_integer("max_batch_size", 8, "Server batching: rows per model call.")
    flags.DEFINE_integer("batch_timeout_micros", 2000, "Server batching timeout.")


def world_from_flags(population: int, zipf: float = 1.0) -> SessionWorld:
    """The ``SessionWorld`` of ``define_world_flags``' flags."""
    f = flags.FLAGS
    return SessionWorld(f.preset, f.items, f.paths, f.long_items, f.recent_items, population,
                        zipf, f.length_spread)


def export_settings_from_flags(verify_requests: int) -> ExportSettings:
    """The ``ExportSettings`` of ``define_world_flags``' flags."""
    f = flags.FLAGS
    return ExportSettings(f.device, f.beam_width, f.top_k, f.max_batch, verify_requests,
                          f.dtype)


def export_check_figures(report: dict) -> dict | None:
    """An ``xgr export --report_json`` report's check in figures: verdict, score error,
    tolerance, and (16-bit lists that broke the ranked-list rule) each side's drift from a
    float32 search and the rows that break the precision rule against it; None when the
    export verified nothing."""
    verify = report.get("verify")
    if not verify:
        return None
    return {name: verify.get(name) for name in
            ("ok", "max_score_error", "score_atol", "saved_drift", "engine_drift",
             "precise_rows_broken")}


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


@dataclass(frozen=True)
class ExportSettings:
    """``xgr export``'s flags the serving benchmarks set (``dtype`` None: the device's)."""

    device: str
    beam_width: int
    top_k: int
    max_batch: int
    verify_requests: int
    dtype: str | None = None


def export(files: dict, out: Path, settings: ExportSettings, *extra: str) -> dict:
    """``xgr export`` of the team files in a child process; its report. An export whose
    check found different items (exit 1 after saving and reporting) is served all the same:
    the benchmark measures it, records the check (``report["verify"]``) and prints it."""
    report = out.parent / f"{out.name}.report.json"
    done = subprocess.run(
        [sys.executable, "-m", "xgr_cli.main", "export", f"--model={files['model']}",
         f"--catalog={files['catalog']}", f"--feature_graph={files['feature_graph']}",
         f"--out={out}", f"--device={settings.device}",
         f"--beam_width={settings.beam_width}", f"--top_k={settings.top_k}",
         f"--top_n={settings.top_k}", f"--max_batch={settings.max_batch}", "--cache_dir=",
         f"--verify_requests={settings.verify_requests}", f"--report_json={report}",
         *([f"--dtype={settings.dtype}"] if settings.dtype else []), *extra],
        cwd=ROOT, env=child_env(TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True, text=True)
    checked = done.returncode == 1 and report.exists() and (out / "saved_model.pb").exists()
    if done.returncode != 0 and not checked:
        raise RuntimeError(f"xgr export failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    if checked:
        print(f"{out.name}: saved, but its check found different items (served and recorded "
              f"all the same):\n{done.stdout[-1500:]}", flush=True)
    return json.loads(report.read_text())


def export_or_take(saved_model: str | None, work: Path, world: SessionWorld, ids: np.ndarray,
                   codes: np.ndarray, verify_requests: int, *extra: str) -> tuple[Path, str]:
    """The SavedModel a benchmark serves and its engine dtype: ``saved_model`` when given
    (an export of the same world; its dtype from the report beside it), else a fresh export
    of ``world`` (its team files in ``work/team``, the SavedModel in ``work/saved``) with
    ``define_world_flags``' settings and ``extra`` flags."""
    from benchmarks.team_files import write_team_files

    if saved_model:
        return Path(saved_model), saved_dtype(Path(saved_model))
    spec = world.prompt_spec()
    files = write_team_files(work / "team", world.preset, spec, ids, codes)
    print(f"exporting {world.preset} ({spec.max_prompt_tokens}-token prompts) ...", flush=True)
    saved = work / "saved"
    return saved, export(files, saved, export_settings_from_flags(verify_requests),
                         *extra)["dtype"]


def saved_dtype(saved: Path) -> str:
    """The engine dtype of an export, from the report ``xgr export`` leaves beside it."""
    report = saved.parent / f"{saved.name}.report.json"
    if not report.exists():
        raise ValueError(f"--saved_model {saved}: no export report {report} beside it "
                         f"(the engine's dtype decides how answers are compared)")
    return json.loads(report.read_text())["dtype"]


def metric_samples(rest_port: int, prefix: str) -> list[tuple[str, dict, float]]:
    """Every Prometheus sample whose name starts with ``prefix`` on the server at
    ``rest_port``: (name, labels, value)."""
    url = f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics"
    with urllib.request.urlopen(url, timeout=30) as reply:
        text = reply.read().decode()
    out = []
    for name, labels, value in re.findall(
            rf"^({re.escape(prefix)}\w*)(?:{{([^}}]*)}})? ([0-9.e+-]+|[+-]?Inf|NaN)$", text,
            re.MULTILINE):
        out.append((name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return out


def metric_sums(rest_port: int, prefix: str) -> dict[str, float]:
    """``metric_samples`` summed over their labels, by name."""
    out: dict[str, float] = {}
    for name, _, value in metric_samples(rest_port, prefix):
        out[name] = out.get(name, 0.0) + value
    return out


def cache_counters(rest_port: int) -> dict[str, float]:
    """A server's prompt-cache counters: lookups, hits (both tiers), misses, uncached,
    evictions, batches run as two sub-batches (``split_batches``), the engine calls and their
    time (all, and those with a hit: ``hit_calls``, ``hit_seconds``), the host tier's copies
    and the hits copied back from it (``host_hits``)."""
    samples = metric_samples(rest_port, "xgr_prompt_cache_")
    sums: dict[str, float] = {}
    for name, labels, value in samples:
        sums[name] = sums.get(name, 0.0) + value
    out = {name: sums.get(f"xgr_prompt_cache_{name}_total", 0.0)
           for name in ("lookups", "hits", "misses", "uncached", "evictions",
                        "split_batches", "calls", "call_seconds", "spills", "spill_seconds",
                        "restore_seconds")}
    out["host_hits"] = sum(value for name, labels, value in samples
                           if name == "xgr_prompt_cache_hits_total"
                           and labels.get("tier") == "host")
    out["hit_calls"] = sums.get("xgr_prompt_cache_hit_latency_seconds_count", 0.0)
    out["hit_seconds"] = sums.get("xgr_prompt_cache_hit_latency_seconds_sum", 0.0)
    return out


def graph_counters(rest_port: int) -> dict[str, float]:
    """A server's CUDA graph counters over its engine packages: captures (each a slow call)
    and eager runs; zeros where the engine runs without graphs."""
    sums = metric_sums(rest_port, "xgr_engine_graph_")
    return {name: sums.get(f"xgr_engine_graph_{name}_total", 0.0)
            for name in ("captures", "eager_runs")}


# The server's histograms read for per-window means (times, and rows per call), by a short name.
TIME_HISTOGRAMS = {"request": "xgr_serving_request_latency_seconds",
                   "model_call": "xgr_serving_model_call_seconds",
                   "rows": "xgr_serving_batch_size"}


def timing_counters(rest_port: int) -> dict[str, float]:
    """The sums and counts so far of a server's histograms in ``TIME_HISTOGRAMS``: requests
    read to response, model calls and their rows."""
    sums = metric_sums(rest_port, "xgr_")
    return {f"{short}_{part}": sums.get(f"{name}_{part}", 0.0)
            for short, name in TIME_HISTOGRAMS.items() for part in ("sum", "count")}


def window_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Means over the window between two ``timing_counters`` readings (None: nothing in it):
    a request on the server and a model call in ms, rows per model call."""
    def mean(short: str, scale: float) -> float | None:
        count = after[f"{short}_count"] - before[f"{short}_count"]
        return scale * (after[f"{short}_sum"] - before[f"{short}_sum"]) / count if count else None
    return {"server_ms": mean("request", 1e3), "model_call_ms": mean("model_call", 1e3),
            "rows_per_call": mean("rows", 1.0)}


class ServerNotServing(RuntimeError):
    """``xgr serve`` did not come to serve its model: what it reported instead."""


def log_errors(log_path: Path, most: int = 3) -> str:
    """The last ``most`` lines of a server's log that name an error (a crash's ``what()``
    among them), joined; the log's last line when none does."""
    try:
        lines = [line.strip() for line in Path(log_path).read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return "(no log)"
    errors = [line for line in lines if re.search(r"error|what\(\)|fatal", line, re.I)
              and not line.startswith(("File ", "frame #"))]
    return " | ".join(line[:300] for line in (errors[-most:] or lines[-1:])) or "(empty log)"


class Server:
    """``xgr serve`` on one SavedModel (copied in as version 1 of ``work/served_<name>``),
    with ``extra_flags``; waits until the model is available. A version that fails to load or
    a server that exits ends the wait at once (``ServerNotServing``, with the server's error),
    and the process is stopped: a failed start never leaves a server holding the device."""

    def __init__(self, saved_model: Path, work: Path, name: str, max_batch_size: int,
                 batch_timeout_micros: int, extra_flags: tuple[str, ...] = ()):
        base = work / f"served_{name}"
        if not (base / "1").exists():
            shutil.copytree(saved_model, base / "1")
        self.log_path = work / f"{name}.log"
        try:
            self.process, self.grpc_port, self.rest_port = start_server(
                str(base), str(self.log_path), max_batch_size, batch_timeout_micros,
                extra_flags=extra_flags)
        except RuntimeError as error:   # it died loading its first version (a crash)
            raise ServerNotServing(f"{error}; the log says: {log_errors(self.log_path)} "
                                   f"(log: {self.log_path})") from None
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise

    def _wait_until_serving(self, timeout: float = 900.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerNotServing(f"the server exited with code {self.process.returncode} "
                                       f"before serving (log: {self.log_path})")
            try:
                url = f"http://127.0.0.1:{self.rest_port}/v1/models/recs"
                with urllib.request.urlopen(url, timeout=10) as reply:
                    states = json.loads(reply.read())["model_version_status"]
            except (OSError, ValueError, KeyError):
                states = []
            if any(v["state"] == "AVAILABLE" for v in states):
                return
            failed = [v for v in states if v["state"] == "END"
                      and v.get("status", {}).get("error_message")]
            if failed:
                raise ServerNotServing(
                    f"version {failed[0]['version']} failed to load: "
                    f"{failed[0]['status']['error_message'][:2000]} (log: {self.log_path})")
            time.sleep(0.5)
        raise ServerNotServing(f"the server did not serve its model in {timeout:g} s "
                               f"(log: {self.log_path})")

    def log_records(self) -> list[dict]:
        """The server's JSON log records so far."""
        records = []
        for line in self.log_path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records

    def stop(self) -> int | str:
        return stop_server(self.process)


@dataclass(frozen=True)
class Answer:
    """One served answer: the ranked items and their scores (the request's one row)."""

    items: np.ndarray
    scores: np.ndarray

    def breaks(self, want: "Answer", dtype: str) -> bool:
        """Whether this answer breaks the tolerance table's rule against ``want`` (the same
        user's request answered by the reference server): at 16 bits the ranked-list rule,
        under which items tied within the rounding may swap; otherwise any differing item."""
        from xgr_common.tolerances import TIE_DTYPES

        if dtype not in TIE_DTYPES:
            return not np.array_equal(self.items, want.items)
        from xgr_export.verify import first_break

        if self.items.shape != want.items.shape:
            return True
        return first_break(self.items, self.scores, want.items, want.scores, dtype) is not None


class Client:
    """TF Serving gRPC client of the server on ``grpc_port``; ``keyed``: each request carries
    its user's key (``x-user-key``). Each ``send`` is one Predict whose wall time, status
    and items are kept."""

    def __init__(self, grpc_port: int, keyed: bool):
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self.keyed = keyed
        self._channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._protos: dict[int, object] = {}

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

    def send(self, user: int, features: dict) -> tuple[float, str, Answer | str]:
        """(seconds, status, the answer or, for a failed call, the server's message)."""
        import grpc
        import tensorflow as tf

        metadata = (("x-user-key", f"user-{user}"),) if self.keyed else ()
        started = time.perf_counter()
        try:
            answer = self._stub.Predict(self.proto(user, features), timeout=60,
                                        metadata=metadata)
            result, status = Answer(tf.make_ndarray(answer.outputs["item_ids"])[0],
                                    tf.make_ndarray(answer.outputs["scores"])[0]), "OK"
        except grpc.RpcError as error:
            result, status = str(error.details())[:1000], error.code().name
        return time.perf_counter() - started, status, result

    def close(self) -> None:
        self._channel.close()


def _arrivals_of_one_process(grpc_port: int, keyed: bool, requests: dict[int, dict],
                             users: list[int], rate: float, seconds: float, workers: int,
                             seed: int, barrier=None) -> tuple[list, float]:
    """One client process's share of an open loop: Poisson arrivals of ``users`` at ``rate``
    for ``seconds``, started together with the other processes at ``barrier`` (None: at once);
    (records, elapsed seconds).
    ``requests`` holds the features of those users only (they travel to the process)."""
    client = Client(grpc_port, keyed)
    for user in set(users):
        client.proto(user, requests[user])            # built before the clock starts
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(users))
    records, lock = [], threading.Lock()

    def one(user: int) -> None:
        result = client.send(user, requests[user])
        with lock:
            records.append((user, *result))

    if barrier is not None:
        barrier.wait()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        due = started
        for user, gap in zip(users, gaps):
            due += gap
            if due - started > seconds:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            pool.submit(one, user)
    elapsed = time.monotonic() - started
    client.close()
    return records, elapsed


@dataclass(frozen=True)
class LoadSettings:
    """How an open loop is driven: ``seconds`` at each rate, ``workers`` threads per client
    process carrying the arrivals, ``processes`` client processes (each a Poisson stream of
    ``rate / processes``: together a Poisson stream of ``rate``)."""

    seconds: float
    workers: int
    processes: int = 1


def open_loop(grpc_port: int, keyed: bool, requests: list[dict], users: np.ndarray,
              rate: float, load: LoadSettings, reference: dict[int, np.ndarray] | None,
              dtype: str) -> dict:
    """Poisson arrivals of ``users`` at ``rate`` for ``load.seconds``; latency of each answer
    and whether its items equal ``reference``'s for that user (None: nothing compared);
    ``broken``: (user, answer) of each answer that breaks the rule against it."""
    shares = [users[i::load.processes].tolist() for i in range(load.processes)]
    seeds = [int(rate * 1000) + i for i in range(load.processes)]
    own = [{user: requests[user] for user in set(share)} for share in shares]
    if load.processes == 1:
        parts = [_arrivals_of_one_process(grpc_port, keyed, own[0], shares[0], rate,
                                          load.seconds, load.workers, seeds[0])]
    else:
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, concurrent.futures.ProcessPoolExecutor(
                load.processes, mp_context=context) as pool:
            barrier = manager.Barrier(load.processes)   # every process built, then all start
            parts = list(pool.map(
                _arrivals_of_one_process, [grpc_port] * load.processes,
                [keyed] * load.processes, own, shares,
                [rate / load.processes] * load.processes, [load.seconds] * load.processes,
                [load.workers] * load.processes, seeds, [barrier] * load.processes))
    records = [r for part, _ in parts for r in part]
    elapsed = max(e for _, e in parts)
    ok = [r for r in records if r[2] == "OK"]
    seconds = np.array([r[1] for r in ok]) if ok else np.zeros(0)
    # Answers for a user the reference run also answered: `differing` where any item differs,
    # `wrong` where the list breaks the tolerance table's rule (at 16 bits the two programs
    # round apart, so items tied within the rounding may swap; at float32, any difference).
    compared = [(user, answer, reference[user]) for user, _, _, answer in ok
                if reference is not None and user in reference]
    differing = sum(1 for _, got, want in compared if not np.array_equal(got.items, want.items))
    broken = [(user, got) for user, got, want in compared if got.breaks(want, dtype)]
    statuses: dict[str, int] = {}
    first_errors: dict[str, str] = {}     # per failing status, one message the server sent
    for r in records:
        statuses[r[2]] = statuses.get(r[2], 0) + 1
        if r[2] != "OK":
            first_errors.setdefault(r[2], r[3])
    return {"rate": rate, "sent": len(records), "answered": len(ok),
            "failed": len(records) - len(ok), "statuses": statuses,
            "first_errors": first_errors, "differing": differing,
            "wrong": len(broken), "broken": broken,
            "throughput": len(ok) / max(elapsed, 1e-9),
            "p50_ms": float(np.percentile(seconds, 50) * 1e3) if len(seconds) else None,
            "p99_ms": float(np.percentile(seconds, 99) * 1e3) if len(seconds) else None,
            "answers": {user: answer for user, _, _, answer in ok}}


def within_target(row: dict, p99_target_ms: float) -> bool:
    """Whether one rate's run kept its P99 within the target with no failed request."""
    return row["p99_ms"] is not None and row["p99_ms"] <= p99_target_ms and not row["failed"]


def sweep(rates, run_rate, p99_target_ms: float) -> list[dict]:
    """``run_rate(rate)`` for each rate in ascending order, ending after the first rate past
    the target: no higher rate could count (``best_rate``), and an overloaded server only
    spends the machine's time."""
    rows = []
    for rate in sorted(rates):
        rows.append(run_rate(rate))
        if not within_target(rows[-1], p99_target_ms):
            break
    return rows


def best_rate(rows: list[dict], p99_target_ms: float) -> float | None:
    """The throughput of the highest rate whose P99, and every lower rate's, is within the
    target with no failed request."""
    best = None
    for row in sorted(rows, key=lambda r: r["rate"]):
        if not within_target(row, p99_target_ms):
            break
        best = row["throughput"]
    return best
