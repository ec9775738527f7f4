"""Load test of ``xgr serve`` on loopback: N concurrent clients, a share of malformed requests.

    .venv/bin/python examples/export_serve_query.py --workdir=/tmp/recs   # exports recs/1
    .venv/bin/python -m benchmarks.load_serving --model_base_path=/tmp/recs/models/recs

Starts ``xgr serve`` (batching on) as a child process, precomputes every request's answer by
calling the SavedModel in this process, then runs ``--clients`` closed-loop clients (REST and
gRPC alternately) until ``--requests`` are sent or ``--max_seconds`` pass. About
``--malformed_share`` of the requests are malformed (bad JSON, missing input, wrong dtype,
broken row splits, unknown signature; over REST and gRPC alike) and must get 400 /
``INVALID_ARGUMENT``; every valid one must get 200 with exactly its own answer (ids exact,
floats within the tolerance table). A request the server sheds under overload (503 /
``RESOURCE_EXHAUSTED``, an explicit refusal a client retries) is counted as shed, apart from
lost ones (no answer, a 5xx fault, a wrong answer), which must be 0. Reports throughput, P50
and P99 latency of the valid requests and, where ``nvidia-smi`` exists, the GPU's utilisation
per phase; writes ``results/serving_<device>_<date>.json``.
The request shapes are the feature graph's (shared by the pipeline SavedModel).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import random
import tempfile
import threading
import time

import numpy as np
from absl import app, flags
from tqdm import tqdm

from benchmarks import results_file as rf
from benchmarks.gpu_sampler import GpuSampler
from benchmarks.serve_process import start_server, stop_server

FLAGS = flags.FLAGS
flags.DEFINE_string("model_base_path", None, "Folder of numeric SavedModel versions to serve.")
flags.DEFINE_integer("clients", 8, "Concurrent closed-loop clients.")
flags.DEFINE_integer("requests", 2000, "Requests to send in all (valid + malformed).")
flags.DEFINE_float("max_seconds", 120.0, "Stop sending after this long.")
flags.DEFINE_float("malformed_share", 0.1, "Share of malformed requests.")
flags.DEFINE_integer("users_per_request", 2, "Users (batch rows) per valid request.")
flags.DEFINE_integer("max_batch_size", 32, "Server batching: rows per model call.")
flags.DEFINE_integer("batch_timeout_micros", 2000, "Server batching timeout.")
flags.DEFINE_integer("warmup_requests", 20, "Untimed valid requests sent first, one at a time.")
flags.DEFINE_list("rates", [], "Open-loop request rates (req/s) to sweep after the closed loop.")
flags.DEFINE_list("rate_fractions", [], "More open-loop rates, as fractions of the closed "
                  "loop's throughput (e.g. 0.25,0.5,0.75,1): sizes the sweep to a server of "
                  "unknown speed.")
flags.DEFINE_integer("num_items", 300, "Synthetic world of the requests: catalog size (use the "
                     "exported model's, so histories hold its items).")
flags.DEFINE_integer("num_users", 40, "Synthetic world: users (the pool of distinct requests).")
flags.DEFINE_integer("history_events", 40, "Synthetic world: history events per user.")
flags.DEFINE_integer("seed", 0, "Synthetic world seed (the exported model's).")
flags.DEFINE_float("rate_seconds", 10.0, "Duration of each open-loop rate.")
flags.DEFINE_float("p99_target_ms", 100.0,
                   "Report the highest swept rate whose P99 (and every lower rate's) is within this.")
flags.DEFINE_integer("open_loop_workers", 64, "Client threads that carry the open-loop requests.")
flags.DEFINE_string("model_label", "tiny pipeline (examples/export_serve_query.py defaults)",
                    "What is served, for the result file.")
flags.DEFINE_string("label", "cpu", "Device label for the result file name.")
flags.DEFINE_string("server_log", None,
                    "Where the server's JSON logs go (default: a file in the temp folder).")
flags.DEFINE_enum("score_dtype", "float32", ["float32", "bfloat16", "float16"],
                  "The served engine's dtype: 16-bit answers are compared by the ranked-list "
                  "rule of xgr_common.tolerances (items exact except inside score ties).")
flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                    "Where the JSON result goes.")
flags.mark_flag_as_required("model_base_path")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_pool(base: str, rows: int):
    """Valid requests (one per group of users of the synthetic world) and their answers."""
    import tensorflow as tf

    from tf_frontend.serving.server import load_op_libraries
    from tf_frontend.feature_graph import features_from_world
    from xgr_world.synthetic import WorldConfig, make_world

    load_op_libraries()
    newest = max(int(v) for v in os.listdir(base) if v.isdigit())
    loaded = tf.saved_model.load(os.path.join(base, str(newest)))  # alive: owns the tables
    serve = loaded.signatures["serving_default"]
    world = make_world(WorldConfig(num_items=FLAGS.num_items, num_users=FLAGS.num_users,
                                   history_events=FLAGS.history_events, seed=FLAGS.seed))
    pool = []
    for start in range(0, len(world.user_ids) - rows + 1, rows):
        features = features_from_world(world, slice(start, start + rows))
        answer = {k: v.numpy() for k, v in serve(**features).items()}
        pool.append(({k: v.numpy() for k, v in features.items()}, answer))
    return pool


def malformed_proto(good, kind: str):
    """A gRPC ``PredictRequest`` that must be refused with ``INVALID_ARGUMENT``: ``good``'s
    copy with one input dropped, of the wrong dtype, with broken row splits, or naming a
    signature the model lacks."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    proto = predict_pb2.PredictRequest()
    proto.CopyFrom(good)
    if kind == "missing_input":
        del proto.inputs["request_time"]
    elif kind == "wrong_dtype":
        rows = proto.inputs["user_id"].tensor_shape.dim[0].size
        proto.inputs["user_id"].CopyFrom(tf.make_tensor_proto(["x"] * rows))
    elif kind == "broken_splits":
        splits = tf.make_ndarray(proto.inputs["history_splits"]).copy()
        splits[1:] = 10**6
        proto.inputs["history_splits"].CopyFrom(tf.make_tensor_proto(splits))
    else:   # bad_json has no gRPC form: an unknown signature stands in for it
        proto.model_spec.signature_name = "nope"
    return proto


def malformed(features: dict, kind: str) -> dict:
    """A request body (REST JSON text) that must be refused with 400."""
    good = {k: ([x.decode() for x in v] if v.dtype == object else v.tolist())
            for k, v in features.items()}
    if kind == "bad_json":
        return {"raw": '{"inputs": {"user_id": [1, 2'}
    if kind == "missing_input":
        good.pop("request_time")
    elif kind == "wrong_dtype":
        good["user_id"] = ["x"] * len(good["user_id"])
    elif kind == "broken_splits":
        good["history_splits"] = [0] + [10**6] * (len(good["history_splits"]) - 1)
    elif kind == "unknown_signature":
        return {"raw": json.dumps({"signature_name": "nope", "inputs": good})}
    return {"raw": json.dumps({"inputs": good})}


SHED = (503,)   # an explicit overload refusal: the client retries; not a lost request


class Client:
    """Sends one request over REST or gRPC; returns (status, outputs or None)."""

    def __init__(self, grpc_port: int, rest_port: int):
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self._rest_port = rest_port
        self._channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)

    def rest(self, body: str):
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{self._rest_port}/v1/models/recs:predict", body.encode())
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())["outputs"]
        except urllib.error.HTTPError as e:
            e.read()
            return e.code, None
        except OSError:  # refused, reset or timed out: counted as lost
            return 0, None

    def grpc(self, request):
        import grpc
        import tensorflow as tf

        from tf_frontend.serving.status_codes import http_status_for_code

        try:
            response = self._stub.Predict(request, timeout=60)
        except grpc.RpcError as e:
            return http_status_for_code(e.code()), None
        return 200, {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def same(outputs: dict, answer: dict) -> bool:
    """Whether a response answers the request: exactly (float32 scores: within their
    tolerance), or for a 16-bit model (``--score_dtype``) by the tolerance table's ranked-list
    rule, under which a merged batch may reorder items tied within 16-bit rounding."""
    from xgr_common.tolerances import TIE_DTYPES, tolerance_for

    if FLAGS.score_dtype in TIE_DTYPES:
        from xgr_export.verify import first_break

        got_ids = np.asarray(outputs.get("item_ids", []))
        got_scores = np.asarray(outputs.get("scores", []))
        if got_ids.shape != answer["item_ids"].shape or got_scores.shape != got_ids.shape:
            return False
        return all(first_break(a, s, b, t, FLAGS.score_dtype) is None for a, s, b, t in
                   zip(got_ids, got_scores, answer["item_ids"], answer["scores"]))
    for name, want in answer.items():
        got = np.asarray(outputs.get(name, []))
        if got.shape != want.shape:
            return False
        tol = tolerance_for(want.dtype)
        ok = np.array_equal(got.astype(want.dtype), want) if tol.exact else np.allclose(
            got, want, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        if not ok:
            return False
    return True


def _median_ms(seconds: list[float]) -> float | None:
    return float(np.median(seconds) * 1e3) if seconds else None


class LoadRun:
    """A fixed plan of requests (pool entry, malformed kind or None, protocol) and its sender."""

    KINDS = ("bad_json", "missing_input", "wrong_dtype", "broken_splits", "unknown_signature")

    def __init__(self, pool, grpc_port: int, rest_port: int, count: int, seed: int = 0):
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        rng = random.Random(seed)
        self.pool, self.client = pool, Client(grpc_port, rest_port)
        self.plan = [(rng.randrange(len(pool)),
                      rng.choice(self.KINDS) if rng.random() < FLAGS.malformed_share else None,
                      "grpc" if i % 2 else "rest") for i in range(count)]
        self.bodies = [json.dumps({"inputs": {k: ([x.decode() for x in v] if v.dtype == object
                                                  else v.tolist()) for k, v in f.items()}})
                       for f, _ in pool]
        self.protos = []
        for features, _ in pool:
            proto = predict_pb2.PredictRequest()
            proto.model_spec.name = "recs"
            for name, value in features.items():
                proto.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            self.protos.append(proto)

    def warm_up(self, count: int) -> None:
        """First calls trace and allocate: sent one at a time and not timed."""
        for i in range(count):
            pick = i % len(self.pool)
            status, _ = self.client.rest(self.bodies[pick]) if i % 2 else self.client.grpc(self.protos[pick])
            if status != 200:
                raise RuntimeError(f"warm-up request {i} answered {status}")

    def send(self, index: int, since: float | None = None) -> tuple:
        """Sends plan[index]; returns (valid, protocol, status, correct, seconds since ``since``,
        crossed: answered with another request's results)."""
        pick, kind, protocol = self.plan[index]
        started = time.perf_counter() if since is None else since
        if kind is not None and protocol == "grpc":
            status, outputs = self.client.grpc(malformed_proto(self.protos[pick], kind))
        elif kind is not None:
            status, outputs = self.client.rest(malformed(self.pool[pick][0], kind)["raw"])
        elif protocol == "rest":
            status, outputs = self.client.rest(self.bodies[pick])
        else:
            status, outputs = self.client.grpc(self.protos[pick])
        seconds = time.perf_counter() - started
        correct = (status == 400) if kind else (status == 200 and same(outputs, self.pool[pick][1]))
        # A wrong answer that is exactly another request's: results crossed between requests.
        crossed = (not kind and status == 200 and not correct and any(
            same(outputs, answer) for i, (_, answer) in enumerate(self.pool) if i != pick))
        return kind is None, protocol, status, correct, seconds, crossed

    def closed_loop(self, clients: int, max_seconds: float) -> tuple[list, float]:
        """``clients`` threads, each sending its next request when the last one is answered."""
        lock, cursor = threading.Lock(), iter(range(len(self.plan)))
        stop_at, records = time.monotonic() + max_seconds, []
        progress = tqdm(total=len(self.plan), desc="closed loop", unit="req")

        def worker():
            while time.monotonic() < stop_at:
                with lock:
                    index = next(cursor, None)
                if index is None:
                    return
                record = self.send(index)
                with lock:
                    records.append(record)
                    progress.update(1)

        began = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as executor:
            for future in [executor.submit(worker) for _ in range(clients)]:
                future.result()
        progress.close()
        return records, time.perf_counter() - began

    def open_loop(self, rate: float, seconds: float) -> tuple[list, float]:
        """Requests start every 1/rate s whatever the answers; latency counts from the planned
        start, so a server that falls behind shows it (no coordinated omission)."""
        count = min(len(self.plan), int(rate * seconds))
        began = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(FLAGS.open_loop_workers) as executor:
            futures = []
            for index in tqdm(range(count), desc=f"open loop {rate:g} req/s", unit="req"):
                planned = began + index / rate
                time.sleep(max(0.0, planned - time.perf_counter()))
                futures.append(executor.submit(self.send, index, planned))
            records = [f.result() for f in futures]
        return records, time.perf_counter() - began


def summarize(records: list, elapsed: float) -> dict:
    """Counts and latencies of a phase. Latencies are those of the valid requests answered
    200 (a shed request's quick 503 would flatter them)."""
    valid = [r for r in records if r[0]]
    answered = [r for r in valid if r[2] == 200]
    latencies = np.array([r[4] for r in answered]) * 1e3
    shed = sum(1 for r in valid if r[2] in SHED)
    ok = sum(r[3] for r in valid)
    malformed = [r for r in records if not r[0]]
    return {
        "sent": len(records), "seconds": elapsed,
        "valid": len(valid), "valid_ok": ok, "valid_shed_503": shed,
        "valid_lost": len(valid) - ok - shed,
        "valid_answered_with_another_requests_results": sum(r[5] for r in valid),
        "malformed": len(malformed),
        "malformed_refused_400": sum(r[3] for r in malformed),
        "malformed_shed_503": sum(1 for r in malformed if r[2] in SHED),
        "malformed_grpc": sum(1 for r in malformed if r[1] == "grpc"),
        "statuses": {str(s): sum(1 for r in records if r[2] == s) for s in sorted({r[2] for r in records})},
        "throughput_rps": len(records) / elapsed,
        "p50_ms": float(np.percentile(latencies, 50)) if len(answered) else None,
        "p99_ms": float(np.percentile(latencies, 99)) if len(answered) else None,
        "p50_ms_rest": _median_ms([r[4] for r in answered if r[1] == "rest"]),
        "p50_ms_grpc": _median_ms([r[4] for r in answered if r[1] == "grpc"]),
    }


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows)


def batch_rows(rest_port: int) -> tuple[float, float]:
    """(model calls, rows) so far, from the server's Prometheus batch-size histogram."""
    import urllib.request

    url = f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("xgr_serving_batch_size_count", "xgr_serving_batch_size_sum"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values.get("xgr_serving_batch_size_count", 0.0), values.get("xgr_serving_batch_size_sum", 0.0)


def _run_all(pool, grpc_port: int, rest_port: int, gpu: GpuSampler) -> tuple[dict, list[dict]]:
    closed = LoadRun(pool, grpc_port, rest_port, FLAGS.requests)
    closed.warm_up(FLAGS.warmup_requests)
    calls_before, rows_before = batch_rows(rest_port)
    began = time.monotonic()
    summary = summarize(*closed.closed_loop(FLAGS.clients, FLAGS.max_seconds))
    summary["gpu"] = gpu.window(began, time.monotonic())
    calls, rows = batch_rows(rest_port)
    summary["model_calls"] = calls - calls_before
    summary["mean_rows_per_model_call"] = (rows - rows_before) / max(calls - calls_before, 1.0)
    sweep = []
    rates = [float(r) for r in FLAGS.rates] + [
        round(float(f) * summary["throughput_rps"], 1) for f in FLAGS.rate_fractions]
    for rate in sorted(set(r for r in rates if r > 0)):
        run = LoadRun(pool, grpc_port, rest_port, int(rate * FLAGS.rate_seconds), seed=int(rate))
        calls_before, rows_before = batch_rows(rest_port)
        began = time.monotonic()
        summary_at_rate = summarize(*run.open_loop(rate, FLAGS.rate_seconds))
        calls, rows = batch_rows(rest_port)
        summary_at_rate.update(offered_rps=rate, model_calls=calls - calls_before,
                               gpu=gpu.window(began, time.monotonic()),
                               mean_rows_per_model_call=(rows - rows_before) / max(calls - calls_before, 1.0))
        sweep.append(summary_at_rate)
    return summary, sweep


def main(argv: list[str]) -> None:
    del argv
    pool = build_pool(FLAGS.model_base_path, FLAGS.users_per_request)
    distinct = len({json.dumps({k: v.tolist() for k, v in a.items()}) for _, a in pool})
    log_path = FLAGS.server_log or os.path.join(tempfile.gettempdir(),
                                                f"xgr_load_server_{FLAGS.label}.log")
    process, grpc_port, rest_port = start_server(
        FLAGS.model_base_path, log_path, FLAGS.max_batch_size, FLAGS.batch_timeout_micros)
    try:
        with GpuSampler() as gpu:
            result, sweep = _run_all(pool, grpc_port, rest_port, gpu)
    finally:
        exit_code = stop_server(process)
    within = []  # conservative: stop at the first rate that misses the target or sheds
    for run in sorted(sweep, key=lambda s: s["offered_rps"]):
        if run["p99_ms"] is None or run["p99_ms"] > FLAGS.p99_target_ms or run["valid_shed_503"]:
            break
        within.append(run["offered_rps"])
    result.update(
        clients=FLAGS.clients, warmup_requests=FLAGS.warmup_requests,
        users_per_request=FLAGS.users_per_request, max_batch_size=FLAGS.max_batch_size,
        batch_timeout_micros=FLAGS.batch_timeout_micros, malformed_share=FLAGS.malformed_share,
        distinct_answers_in_pool=distinct, pool=len(pool), open_loop=sweep,
        p99_target_ms=FLAGS.p99_target_ms, highest_rate_within_p99_target=max(within, default=None),
        server_exit_code_after_sigterm=exit_code, model=FLAGS.model_label,
        model_base_path=FLAGS.model_base_path, cpus=os.cpu_count(),
        load_average=os.getloadavg()[0], date=datetime.date.today().isoformat())
    _report(result, sweep, exit_code)


def _gpu_text(run: dict) -> str:
    gpu = run.get("gpu")
    return "-" if not gpu else f"{gpu['gpu_util_mean_pct']:.0f}"


def _report(result: dict, sweep: list[dict], exit_code: int | str) -> None:
    from xgr_common.errors import ParityError, require

    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"closed loop, {FLAGS.clients} clients, {FLAGS.malformed_share:.0%} malformed:")
    print(_table([("sent", "valid ok/valid", "shed 503", "malformed 400/malformed", "req/s",
                   "P50 ms", "P99 ms", "P50 REST/gRPC ms", "rows/model call", "GPU util %"),
                  (result["sent"], f"{result['valid_ok']}/{result['valid']}",
                   result["valid_shed_503"],
                   f"{result['malformed_refused_400']}/{result['malformed']}",
                   fmt(result["throughput_rps"]), fmt(result["p50_ms"]), fmt(result["p99_ms"]),
                   f"{fmt(result['p50_ms_rest'])}/{fmt(result['p50_ms_grpc'])}",
                   fmt(result["mean_rows_per_model_call"]), _gpu_text(result))]))
    if sweep:
        print(f"open loop (P99 target {FLAGS.p99_target_ms:g} ms):")
        print(_table([("offered req/s", "achieved req/s", "valid ok/valid", "shed 503",
                       "P50 ms", "P99 ms", "rows/model call", "GPU util %")] + [
            (fmt(s["offered_rps"]), fmt(s["throughput_rps"]), f"{s['valid_ok']}/{s['valid']}",
             s["valid_shed_503"], fmt(s["p50_ms"]), fmt(s["p99_ms"]),
             fmt(s["mean_rows_per_model_call"]), _gpu_text(s)) for s in sweep]))
        print(f"highest rate with P99 <= {FLAGS.p99_target_ms:g} ms (nothing shed): "
              f"{result['highest_rate_within_p99_target']}")
    print(f"server exit code after SIGTERM: {exit_code}")
    path = rf.write_result(FLAGS.out_dir, f"serving_{FLAGS.label}", result, indent=2)
    print(f"wrote {path}")
    for name, run in [("closed loop", result)] + [(f"{s['offered_rps']:g} req/s", s) for s in sweep]:
        require(run["valid_lost"] == 0, ParityError,
                f"{name}: {run['valid_lost']} valid requests were lost or answered with wrong "
                "results")
        require(run["valid_answered_with_another_requests_results"] == 0, ParityError,
                f"{name}: a valid request was answered with another request's results")
        require(run["malformed_refused_400"] + run["malformed_shed_503"] == run["malformed"],
                ParityError, f"{name}: a malformed request was not refused with 400")
    require(exit_code == 0, ParityError, f"the server exited with {exit_code} after SIGTERM")


if __name__ == "__main__":
    app.run(main)
