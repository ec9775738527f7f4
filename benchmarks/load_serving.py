"""Load test of ``xgr serve`` on loopback: N concurrent clients, a share of malformed requests.

    .venv/bin/python examples/export_serve_query.py --workdir=/tmp/recs   # exports recs/1
    .venv/bin/python benchmarks/load_serving.py --model_base_path=/tmp/recs/models/recs

Starts ``xgr serve`` (batching on) as a child process, precomputes every request's answer by
calling the SavedModel in this process, then runs ``--clients`` closed-loop clients (REST and
gRPC alternately) until ``--requests`` are sent or ``--max_seconds`` pass. About
``--malformed_share`` of the requests are malformed (bad JSON, missing input, wrong dtype,
broken row splits, unknown signature) and must get 400; every valid one must get 200 with
exactly its own answer (ids exact, floats within the tolerance table). Reports throughput,
P50 and P99 latency of the valid requests; writes ``results/serving_<device>_<date>.json``.
The request shapes are the feature graph's (shared by the pipeline SavedModel).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time

import numpy as np
from absl import app, flags
from tqdm import tqdm

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
flags.DEFINE_string("label", "cpu", "Device label for the result file name.")
flags.DEFINE_string("out_dir", os.path.join(os.path.dirname(__file__), "results"),
                    "Where the JSON result goes.")
flags.mark_flag_as_required("model_base_path")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_server(base: str) -> tuple[subprocess.Popen, int, int]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli.main", "serve", "--model_name=recs",
         f"--model_base_path={base}", "--port=0", "--rest_api_port=0",
         "--bind_address=127.0.0.1", "--enable_batching", "--log_level=WARNING",
         f"--max_batch_size={FLAGS.max_batch_size}",
         f"--batch_timeout_micros={FLAGS.batch_timeout_micros}", "--num_batch_threads=2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    line = process.stdout.readline()
    if "rest port" not in line:
        process.kill()
        raise RuntimeError(f"xgr serve did not start: {line!r}")
    words = line.replace(",", "").split()
    return process, int(words[words.index("grpc") + 2]), int(words[words.index("rest") + 2])


def build_pool(base: str, rows: int):
    """Valid requests (one per group of users of the synthetic world) and their answers."""
    import tensorflow as tf

    from tf_frontend.serving.server import load_op_libraries
    from tf_frontend.feature_graph import features_from_world
    from torch_engine.synthetic import WorldConfig, make_world

    load_op_libraries()
    newest = max(int(v) for v in os.listdir(base) if v.isdigit())
    loaded = tf.saved_model.load(os.path.join(base, str(newest)))  # alive: owns the tables
    serve = loaded.signatures["serving_default"]
    world = make_world(WorldConfig(num_items=300, num_users=40))
    pool = []
    for start in range(0, len(world.user_ids) - rows + 1, rows):
        features = features_from_world(world, slice(start, start + rows))
        answer = {k: v.numpy() for k, v in serve(**features).items()}
        pool.append(({k: v.numpy() for k, v in features.items()}, answer))
    return pool


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

    def grpc(self, request):
        import grpc
        import tensorflow as tf

        try:
            response = self._stub.Predict(request, timeout=60)
        except grpc.RpcError as e:
            return (400 if e.code() == grpc.StatusCode.INVALID_ARGUMENT else 500), None
        return 200, {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def same(outputs: dict, answer: dict) -> bool:
    from torch_engine.tolerances import tolerance_for

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


def run_load(pool, grpc_port: int, rest_port: int) -> dict:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    kinds = ("bad_json", "missing_input", "wrong_dtype", "broken_splits", "unknown_signature")
    rng = random.Random(0)
    plan = []  # (pool index, malformed kind or None, protocol)
    for i in range(FLAGS.requests):
        bad = rng.random() < FLAGS.malformed_share
        plan.append((rng.randrange(len(pool)), rng.choice(kinds) if bad else None,
                     "grpc" if i % 2 else "rest"))
    bodies = [json.dumps({"inputs": {k: ([x.decode() for x in v] if v.dtype == object
                                         else v.tolist()) for k, v in f.items()}})
              for f, _ in pool]
    protos = []
    for features, _ in pool:
        proto = predict_pb2.PredictRequest()
        proto.model_spec.name = "recs"
        for name, value in features.items():
            proto.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        protos.append(proto)

    lock, cursor, stop_at = threading.Lock(), iter(range(len(plan))), time.monotonic() + FLAGS.max_seconds
    records = []  # (valid, protocol, status, correct, seconds)
    progress = tqdm(total=len(plan), desc="requests", unit="req")

    def worker():
        client = Client(grpc_port, rest_port)
        while time.monotonic() < stop_at:
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            pick, kind, protocol = plan[index]
            started = time.perf_counter()
            if kind is not None:
                status, outputs = client.rest(malformed(pool[pick][0], kind)["raw"])
            elif protocol == "rest":
                status, outputs = client.rest(bodies[pick])
            else:
                status, outputs = client.grpc(protos[pick])
            seconds = time.perf_counter() - started
            correct = (status == 400) if kind else (status == 200 and same(outputs, pool[pick][1]))
            with lock:
                records.append((kind is None, protocol, status, correct, seconds))
                progress.update(1)

    warm = Client(grpc_port, rest_port)
    for i in range(FLAGS.warmup_requests):  # first calls trace and allocate: not timed
        status, _ = warm.rest(bodies[i % len(pool)]) if i % 2 else warm.grpc(protos[i % len(pool)])
        if status != 200:
            raise RuntimeError(f"warm-up request {i} answered {status}")
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(FLAGS.clients) as executor:
        for future in [executor.submit(worker) for _ in range(FLAGS.clients)]:
            future.result()
    elapsed = time.perf_counter() - began
    progress.close()
    valid = [r for r in records if r[0]]
    latencies = np.array([r[4] for r in valid]) * 1e3
    return {
        "sent": len(records), "planned": len(plan), "seconds": elapsed,
        "valid": len(valid), "valid_ok": sum(r[3] for r in valid),
        "malformed": len(records) - len(valid),
        "malformed_refused_400": sum(r[3] for r in records if not r[0]),
        "statuses": {str(s): sum(1 for r in records if r[2] == s) for s in sorted({r[2] for r in records})},
        "throughput_rps": len(records) / elapsed,
        "valid_throughput_rps": len(valid) / elapsed,
        "p50_ms": float(np.percentile(latencies, 50)) if len(valid) else None,
        "p99_ms": float(np.percentile(latencies, 99)) if len(valid) else None,
        "p50_ms_rest": _median_ms([r[4] for r in valid if r[1] == "rest"]),
        "p50_ms_grpc": _median_ms([r[4] for r in valid if r[1] == "grpc"]),
    }


def main(argv: list[str]) -> None:
    del argv
    from torch_engine.errors import ParityError, require

    pool = build_pool(FLAGS.model_base_path, FLAGS.users_per_request)
    distinct = len({json.dumps({k: v.tolist() for k, v in a.items()}) for _, a in pool})
    process, grpc_port, rest_port = start_server(FLAGS.model_base_path)
    try:
        result = run_load(pool, grpc_port, rest_port)
    finally:
        process.terminate()
        exit_code = process.wait(timeout=60)
    result.update(clients=FLAGS.clients, warmup_requests=FLAGS.warmup_requests, users_per_request=FLAGS.users_per_request,
                  max_batch_size=FLAGS.max_batch_size,
                  batch_timeout_micros=FLAGS.batch_timeout_micros,
                  distinct_answers_in_pool=distinct, pool=len(pool),
                  server_exit_code_after_sigterm=exit_code,
                  model_base_path=FLAGS.model_base_path, machine=platform.machine(),
                  cpus=os.cpu_count(), load_average=os.getloadavg()[0],
                  date=datetime.date.today().isoformat())
    rows = [("requests sent", result["sent"]), ("valid ok / valid", f"{result['valid_ok']} / {result['valid']}"),
            ("malformed refused (400) / malformed",
             f"{result['malformed_refused_400']} / {result['malformed']}"),
            ("throughput (req/s)", f"{result['throughput_rps']:.1f}"),
            ("P50 valid (ms)", f"{result['p50_ms']:.1f}"), ("P99 valid (ms)", f"{result['p99_ms']:.1f}"),
            ("P50 REST / gRPC (ms)", f"{result['p50_ms_rest']:.1f} / {result['p50_ms_grpc']:.1f}"),
            ("server exit after SIGTERM", exit_code)]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    path = os.path.join(FLAGS.out_dir, f"serving_{FLAGS.label}_{result['date']}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")
    require(result["valid_ok"] == result["valid"], ParityError,
            f"{result['valid'] - result['valid_ok']} valid requests were lost or answered wrongly")
    require(result["malformed_refused_400"] == result["malformed"], ParityError,
            "a malformed request was not refused with 400")
    require(exit_code == 0, ParityError, f"the server exited with {exit_code} after SIGTERM")


if __name__ == "__main__":
    app.run(main)
