"""The project's feature-graph SavedModel (custom ops, string input, ragged history in, ragged
cleaned history out) behind the real server: REST and gRPC answers equal the SavedModel called
in process, also when concurrent requests are merged into one model call."""

import concurrent.futures
import threading

import numpy as np
import pytest
import tensorflow as tf

from tf_frontend.serving.config import BatchingConfig
from tests.serving.helpers import columnar, grpc_predict, http, start_server
from xgr_common.tolerances import tolerance_for

custom_ops = pytest.importorskip("custom_ops")


@pytest.fixture(scope="module")
def world():
    from xgr_world.synthetic import WorldConfig, make_world

    return make_world(WorldConfig(num_items=300, num_users=16, history_events=12, seed=5))


@pytest.fixture(scope="module")
def feature_model(world, tmp_path_factory):
    from tf_frontend.feature_graph import FeatureGraph
    from tf_frontend.saved_model import export_feature_graph
    from xgr_common.prompt_spec import PromptSpec

    base = tmp_path_factory.mktemp("feature_graph") / "features"
    graph = FeatureGraph(PromptSpec(), world.item_ids, world.item_codes, seed=1)
    export_feature_graph(graph, base / "1")
    module = tf.saved_model.load(str(base / "1"))  # kept alive: it owns the table resources
    server = start_server(str(base), file_system_poll_wait_seconds=0,
                          batching=BatchingConfig(max_batch_size=16, batch_timeout_micros=30_000))
    yield server, module.signatures["serving_default"]
    server.stop()


def _features(world, rows):
    from tf_frontend.feature_graph import features_from_world

    return {k: v.numpy() for k, v in features_from_world(world, rows).items()}


def _expected(loaded, features):
    return {k: v.numpy() for k, v in loaded(**{k: tf.constant(v) for k, v in features.items()}).items()}


def _rest_columnar(port, features):
    status, answer = http(port, "/v1/models/recs:predict", {"inputs": columnar(features)})
    assert status == 200, answer
    return answer["outputs"]


def _assert_equal(got, want):
    """Ids exact; floats within the tolerance table (a merged batch may round differently)."""
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        tol = tolerance_for(value.dtype)
        actual = np.asarray(got[name]).astype(value.dtype)
        if tol.exact:
            np.testing.assert_array_equal(actual, value, err_msg=name)
        else:
            np.testing.assert_allclose(actual, value, rtol=tol.rtol, atol=tol.atol, err_msg=name)


def test_the_server_reads_the_ragged_layout_from_the_signature(feature_model):
    server, _ = feature_model
    sig = server.manager.get("recs", None).signatures["serving_default"]
    assert [(g.splits, g.values) for g in sig.input_groups] == [
        ("history_splits", ("history_items", "history_times"))]
    assert [(g.splits, g.values) for g in sig.output_groups] == [
        ("history_splits", ("history_values",))]


def test_rest_and_grpc_equal_the_saved_model(feature_model, world):
    server, loaded = feature_model
    features = _features(world, slice(0, 3))
    want = _expected(loaded, features)
    _assert_equal(grpc_predict(server.grpc_port, features), want)
    _assert_equal(_rest_columnar(server.rest_port, features), want)


def test_concurrent_requests_are_merged_and_re_split(feature_model, world):
    server, loaded = feature_model
    labels = {"model_name": "recs"}
    calls_before = server.metrics.registry.get_sample_value("xgr_serving_batch_size_count", labels) or 0
    requests = [_features(world, [i, (i + 5) % 16]) for i in range(8)]
    start = threading.Barrier(len(requests))

    def client(i):
        start.wait()
        return (grpc_predict if i % 2 else _rest_columnar)(
            server.grpc_port if i % 2 else server.rest_port, requests[i])

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(client, range(len(requests))))
    for request, answer in zip(requests, answers):
        _assert_equal(answer, _expected(loaded, request))
    calls = server.metrics.registry.get_sample_value("xgr_serving_batch_size_count", labels)
    assert calls - calls_before < len(requests)
