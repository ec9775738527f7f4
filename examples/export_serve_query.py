"""Example (c): export the pipeline as one SavedModel, serve it, query it as TF Serving clients do.

    .venv/bin/python examples/export_serve_query.py --workdir=/tmp/recs_example

1. Export: a tiny engine (random weights, the synthetic catalog) is packaged with AOTInductor
   and embedded with the TF feature graph and post-processing into ``<workdir>/models/recs/1``
   (``xgr_export.export_saved_model``, what ``xgr export`` runs).
2. Serve: ``ModelServer`` (what ``xgr serve`` runs) on free loopback ports, with batching.
3. Query: the same users through ``PredictionServiceStub.Predict`` (gRPC) and ``:predict``
   (REST, row format), checked against the SavedModel called in this process.
4. Per-request exclusions: each user again through ``serving_with_controls``, leaving out the
   items it was just shown; no shown item comes back and the lists stay full.
"""

from __future__ import annotations

# The project's packages first: importing one loads Triton, which torch.export needs, before
# TensorFlow (the two bundle LLVM; see xgr_common/import_order.py).
from tf_frontend.feature_graph import features_from_world  # noqa: I001
from tf_frontend.serving.config import BatchingConfig, ServerConfig
from tf_frontend.serving.server import ModelServer, load_op_libraries
from xgr_common.errors import ParityError, require
from xgr_common.serving_names import CONTROLS_SIGNATURE, SERVING_SIGNATURE
from xgr_common.tolerances import tolerance_for
from xgr_export import EngineExportConfig, ExportConfig, export_saved_model
from xgr_world.synthetic import WorldConfig, make_world

import json
import os
import tempfile
import urllib.request

import grpc
import numpy as np
import tensorflow as tf
from absl import app, flags
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Folder for the SavedModel (default: a new temp folder).")
flags.DEFINE_string("cache_dir", "build/serving_example_cache",
                    "AOTInductor cache: a second run skips the compile.")
flags.DEFINE_integer("users", 4, "Users queried (one request each way).")
flags.DEFINE_integer("beam_width", 16, "Beams of the exported engine (top_k = 2 x top_n must fit).")
flags.DEFINE_integer("top_n", 5, "Items returned per user after the business rule.")

WORLD = WorldConfig(num_items=300, num_users=40)


def export(models_dir: str) -> tuple[str, object]:
    """Exports version 1 of the pipeline; returns its folder and the synthetic world."""
    version_dir = os.path.join(models_dir, "recs", "1")
    export_saved_model(ExportConfig(
        out=version_dir, world=WORLD, top_n=FLAGS.top_n, cache_dir=FLAGS.cache_dir,
        engine=EngineExportConfig(beam_width=FLAGS.beam_width, top_k=2 * FLAGS.top_n,
                                  max_batch=64)))
    return version_dir, make_world(WORLD)


def query_grpc(port: int, features: dict, signature: str = SERVING_SIGNATURE) -> dict:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "recs"
    request.model_spec.signature_name = signature
    for name, value in features.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=120)
    return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}


def query_rest(port: int, features: dict, exclude: list[list[int]] | None = None) -> dict:
    """The row format: one JSON object per user, the history as that user's lists; with
    ``exclude``, each user's own items to leave out, through ``serving_with_controls``."""
    splits = features["history_splits"].numpy()
    instances = []
    for row in range(len(splits) - 1):
        lo, hi = splits[row], splits[row + 1]
        instances.append({
            "user_id": int(features["user_id"][row]),
            "country": features["country"][row].numpy().decode(),
            "history_items": features["history_items"][lo:hi].numpy().tolist(),
            "history_times": features["history_times"][lo:hi].numpy().tolist(),
            "request_time": int(features["request_time"][row])})
        if exclude is not None:   # its own exclusions; top_k left out: the export's
            instances[-1]["exclude_items"] = exclude[row]
    body = {"instances": instances}
    if exclude is not None:
        body["signature_name"] = CONTROLS_SIGNATURE
    body = json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/recs:predict", body)
    with urllib.request.urlopen(request, timeout=120) as response:
        predictions = json.loads(response.read())["predictions"]
    return {name: np.array([p[name] for p in predictions]) for name in predictions[0]}


def check(name: str, got: dict, want: dict) -> None:
    for output, expected in want.items():
        value = np.asarray(got[output]).astype(expected.dtype)
        tol = tolerance_for(expected.dtype)
        same = np.array_equal(value, expected) if tol.exact else np.allclose(
            value, expected, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        require(same, ParityError, f"{name}: output {output!r} differs from the SavedModel "
                                   f"called in process:\n{value}\nvs\n{expected}")


def shown_items(answers: dict) -> list[list[int]]:
    """Each user's list as shown, to exclude from the next one."""
    return [[int(i) for i in row[:n]] for row, n in zip(answers["item_ids"], answers["num_items"])]


def check_exclusions(got: dict, shown: list[list[int]], top_n: int) -> None:
    for row, excluded in enumerate(shown):
        items = [int(i) for i in got["item_ids"][row][: got["num_items"][row]]]
        require(not set(items) & set(excluded), ParityError,
                f"user row {row}: an excluded item came back: {items} vs {excluded}")
        require(len(items) == top_n, ParityError,
                f"user row {row}: {len(items)} items after its exclusions, not {top_n}")


def main(argv: list[str]) -> None:
    del argv
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="recs_example_")
    models_dir = os.path.join(workdir, "models")
    print(f"1. exporting the pipeline into {models_dir}/recs/1 ...", flush=True)
    version_dir, world = export(models_dir)
    load_op_libraries()
    features = features_from_world(world, slice(0, FLAGS.users))
    loaded = tf.saved_model.load(version_dir)  # kept alive: it owns the tables' resources
    want = {k: v.numpy() for k, v in loaded.signatures[SERVING_SIGNATURE](**features).items()}

    server = ModelServer(ServerConfig(
        model_name="recs", model_base_path=os.path.join(models_dir, "recs"), port=0,
        rest_api_port=0, bind_address="127.0.0.1", file_system_poll_wait_seconds=0,
        batching=BatchingConfig(max_batch_size=32, batch_timeout_micros=2000)))
    server.start()
    print(f"2. serving: gRPC 127.0.0.1:{server.grpc_port}, REST 127.0.0.1:{server.rest_port}")
    try:
        by_grpc = query_grpc(server.grpc_port, features)
        by_rest = query_rest(server.rest_port, features)
        shown = shown_items(by_grpc)
        controls = {"exclude_items": np.array([i for row in shown for i in row], np.int64),
                    "exclude_splits": np.cumsum([0] + [len(row) for row in shown]),
                    "top_k": np.full(len(shown), 2 * FLAGS.top_n, np.int32)}
        next_grpc = query_grpc(server.grpc_port, {**features, **controls}, CONTROLS_SIGNATURE)
        next_rest = query_rest(server.rest_port, features, shown)
    finally:
        server.stop()
    check("gRPC", by_grpc, want)
    check("REST", by_rest, want)
    want_next = {k: v.numpy() for k, v in loaded.signatures[CONTROLS_SIGNATURE](
        **features, **{k: tf.constant(v) for k, v in controls.items()}).items()}
    check("gRPC, exclusions", next_grpc, want_next)
    check("REST, exclusions", next_rest, want_next)
    check_exclusions(next_grpc, shown, FLAGS.top_n)
    print("3. answers (gRPC and REST agree with the in-process SavedModel):")
    print(f"   {'user':>6}  {'items (best first)':<40} top score")
    for row in range(FLAGS.users):
        items = [int(i) for i in by_grpc["item_ids"][row][: by_grpc["num_items"][row]]]
        print(f"   {int(world.user_ids[row]):>6}  {str(items):<40} "
              f"{float(by_grpc['scores'][row][0]):.4f}")
    print("4. next lists, each user excluding what it was shown (none came back, lists full):")
    for row in range(FLAGS.users):
        items = [int(i) for i in next_grpc["item_ids"][row][: next_grpc["num_items"][row]]]
        print(f"   {int(world.user_ids[row]):>6}  {str(items)}")


if __name__ == "__main__":
    app.run(main)
