"""Example (c): export the pipeline as one SavedModel, serve it, query it as TF Serving clients do.

    .venv/bin/python examples/export_serve_query.py --workdir=/tmp/recs_example

1. Export: a tiny engine (random weights, the synthetic catalog) is packaged with AOTInductor
   and embedded with the TF feature graph and post-processing into ``<workdir>/models/recs/1``
   (``xgr_export.saved_model.export_pipeline``).
2. Serve: ``ModelServer`` (what ``xgr serve`` runs) on free loopback ports, with batching.
3. Query: the same users through ``PredictionServiceStub.Predict`` (gRPC) and ``:predict``
   (REST, row format), checked against the SavedModel called in this process.
"""

from __future__ import annotations

# First: the engine export takes Triton before TensorFlow is imported (xgr_export.torch_package).
from xgr_export import engine_package  # noqa: I001

import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import urllib.request  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from xgr_export.saved_model import PipelineConfig, export_pipeline  # noqa: E402
from tf_frontend.feature_graph import FeatureGraph, features_from_world  # noqa: E402
from tf_frontend.serving.config import BatchingConfig, ServerConfig  # noqa: E402
from tf_frontend.serving.server import ModelServer, load_op_libraries  # noqa: E402
from torch_engine.catalog import Catalog  # noqa: E402
from torch_engine.engine import Engine  # noqa: E402
from xgr_common.errors import ParityError, require  # noqa: E402
from torch_engine.model import Model  # noqa: E402
from xgr_common.prompt_spec import PromptSpec  # noqa: E402
from xgr_world.synthetic import WorldConfig, make_world  # noqa: E402
from xgr_common.tolerances import tolerance_for  # noqa: E402

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
    world = make_world(WORLD)
    spec = PromptSpec()
    engine = Engine(Model.from_preset("tiny", seed=0),
                    Catalog.from_arrays(world.item_ids, world.item_codes))
    package = engine_package.export_engine(
        engine, spec, os.path.join(models_dir, "engine.pt2"),
        engine_package.EngineExportConfig(beam_width=FLAGS.beam_width, top_k=2 * FLAGS.top_n,
                                          max_batch=64),
        cache_dir=FLAGS.cache_dir)
    graph = FeatureGraph(spec, world.item_ids, world.item_codes, seed=0)
    version_dir = os.path.join(models_dir, "recs", "1")
    export_pipeline(version_dir, graph, package, PipelineConfig(top_n=FLAGS.top_n))
    return version_dir, world


def query_grpc(port: int, features: dict) -> dict:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "recs"
    request.model_spec.signature_name = "serving_default"
    for name, value in features.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            request, timeout=120)
    return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}


def query_rest(port: int, features: dict) -> dict:
    """The row format: one JSON object per user, the history as that user's lists."""
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
    body = json.dumps({"instances": instances}).encode()
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


def main(argv: list[str]) -> None:
    del argv
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="recs_example_")
    models_dir = os.path.join(workdir, "models")
    print(f"1. exporting the pipeline into {models_dir}/recs/1 ...", flush=True)
    version_dir, world = export(models_dir)
    load_op_libraries()
    features = features_from_world(world, slice(0, FLAGS.users))
    loaded = tf.saved_model.load(version_dir)  # kept alive: it owns the tables' resources
    want = {k: v.numpy() for k, v in loaded.signatures["serving_default"](**features).items()}

    server = ModelServer(ServerConfig(
        model_name="recs", model_base_path=os.path.join(models_dir, "recs"), port=0,
        rest_api_port=0, bind_address="127.0.0.1", file_system_poll_wait_seconds=0,
        batching=BatchingConfig(max_batch_size=32, batch_timeout_micros=2000)))
    server.start()
    print(f"2. serving: gRPC 127.0.0.1:{server.grpc_port}, REST 127.0.0.1:{server.rest_port}")
    try:
        by_grpc = query_grpc(server.grpc_port, features)
        by_rest = query_rest(server.rest_port, features)
    finally:
        server.stop()
    check("gRPC", by_grpc, want)
    check("REST", by_rest, want)
    print("3. answers (gRPC and REST agree with the in-process SavedModel):")
    print(f"   {'user':>6}  {'items (best first)':<40} top score")
    for row in range(FLAGS.users):
        items = [int(i) for i in by_grpc["item_ids"][row][: by_grpc["num_items"][row]]]
        print(f"   {int(world.user_ids[row]):>6}  {str(items):<40} "
              f"{float(by_grpc['scores'][row][0]):.4f}")


if __name__ == "__main__":
    app.run(main)
