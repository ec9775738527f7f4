"""The demo round trip in prompt version 2: the quick world fitted on the version 2 prompt,
its checkpoint, card, catalog and trained feature graph through ``xgr export`` as a team's
files, with the prompt-KV cache in the engine's runtime; the SavedModel (the version 2 feature
graph with its SOFT markers, an engine package that places the profile vectors there and
reads the users' frozen long-term parts from its cache), verified against the in-process
pipeline (its first call and a repeated one, answered from the cache) and reloaded in a fresh
process with TF + custom_ops alone, returns the in-process pipeline's items. Served by the
server with TF Serving clients: keys in the body or the header, hits once users return, a
catalog-only version keeping the entries and a model version starting empty."""

from __future__ import annotations

import numpy as np
import pytest

from tests.pipeline.conftest import export_team_files
from tf_frontend.feature_graph import features_from_world
from xgr_common.layout import MaskMode
from xgr_export.verify import run_fresh

# Heavy (a fit, an AOTInductor compile of the fitted model, fresh processes).
pytestmark = pytest.mark.heavy

BEAMS, TOP_K, TOP_N, USERS = 16, 12, 8, 12


@pytest.fixture(scope="module")
def v2_model(tmp_path_factory):
    from xgr_world import default_model as dm

    settings = dm.with_prompt_version(dm.QUICK, 2)
    return dm.fit_or_load(settings, tmp_path_factory.mktemp("v2_fit"), progress=False)


@pytest.fixture(scope="module")
def v2_export(v2_model, xgr, tmp_path_factory):
    out = tmp_path_factory.mktemp("v2_export") / "saved_model"
    done, report = export_team_files(xgr, out, v2_model.export_files(), BEAMS, TOP_K, TOP_N,
                                     "--verify_requests=8", "--prompt_cache",
                                     "--catalog_headroom=1.2")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    return out, report


@pytest.fixture(scope="module")
def reference(v2_model):
    """The in-process pipeline over ``Engine.recommend`` (no cache): features -> outputs."""
    from bridge.pipeline import RecommendPipeline
    from tf_frontend.pipeline_spec import PipelineConfig
    from torch_engine.catalog import Catalog
    from torch_engine.config import engine_config_for
    from torch_engine.engine import Engine

    world, spec = v2_model.world, v2_model.settings.spec
    engine = Engine(v2_model.model, Catalog.from_arrays(world.item_ids, world.item_codes,
                                                        spec.layout), engine_config_for(spec))
    return RecommendPipeline.for_engine(
        v2_model.feature_graph(), engine, BEAMS, TOP_K, PipelineConfig(top_n=TOP_K),
        catalog=(world.item_ids, world.item_codes), prefill_mask=MaskMode.CAUSAL)


def test_the_card_and_the_export_are_version_2(v2_model, v2_export):
    from xgr_common.model_card import ModelCard

    card = ModelCard.read(v2_model.export_files()["model"])
    assert card.spec.version == 2 and card.spec == v2_model.settings.spec
    report = v2_export[1]
    assert report["prompt_version"] == 2 and report["prefill_mask"] == "causal"
    assert report["max_prompt_tokens"] == card.spec.max_prompt_tokens
    assert report["verify"]["ok"] and report["verify"]["requests"] == 8
    assert report["prompt_cache"] and "cache runtime=5" in report["engine_signature"]


def test_the_reloaded_saved_model_returns_the_pipelines_items(v2_model, v2_export, reference):
    world = v2_model.world
    users = v2_model.settings.eval_users[:USERS]
    features = features_from_world(world, users)
    keyed = {**features, "user_key": np.array([f"u{u}".encode() for u in users], object)}
    got = run_fresh(v2_export[0], keyed, repeats=2)
    want = reference(features)
    np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy()[:, :TOP_N])
    # The repeated call reads every user's long-term part from the cache: the same items.
    np.testing.assert_array_equal(got["repeat_item_ids"], got["item_ids"])
    assert (got["num_items"] > 0).all()
    assert not {m for m in got["modules"].tolist() if m.split(".")[0] == "torch"}
    # The history of both parts is excluded: no seen item comes back.
    for row, user in enumerate(users):
        seen = set(world.history_items[world.history_splits[user]:
                                       world.history_splits[user + 1]].tolist())
        assert not seen & set(got["item_ids"][row][got["item_ids"][row] >= 0].tolist())


def _caches() -> dict[str, dict]:
    """The prompt caches of the engine packages this process holds, by the folder of the
    version that first loaded each package."""
    from custom_ops.torch_call import package_stats

    return {path.split("/assets/")[0].rsplit("/", 1)[-1]: s["prompt_cache"]
            for path, s in package_stats().items() if s.get("prompt_cache")}


def _served_stats(server) -> dict:
    """The prompt cache's counters of the one engine package the server holds."""
    caches = _caches()
    assert len(caches) == 1, caches
    return next(iter(caches.values()))


def test_served_with_keys_hits_returning_users_across_versions(v2_model, v2_export, reference,
                                                               xgr, tmp_path, monkeypatch):
    """The served SavedModel with TF Serving clients: each answer equals the in-process
    pipeline's; returning users hit (the key in the body, the gRPC metadata or the REST
    header); a malformed or unknown key is served, uncached or a miss; a catalog-only version
    (its package hard-linked) keeps the entries, a model version (another package) starts
    empty; the pool stays within --prompt_cache_gb's budget."""
    import gc
    import shutil
    import time

    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from tests.pipeline.conftest import export_team_files
    from tests.serving.helpers import http, http_full, start_server

    world = v2_model.world
    users = list(v2_model.settings.eval_users[:USERS])
    features = {k: np.asarray(v) for k, v in features_from_world(world, users).items()}
    want = reference(features)["item_ids"].numpy()[:, :TOP_N]
    keys = np.array([f"user-{u}".encode() for u in users], object)
    base = tmp_path / "recs"
    shutil.copytree(v2_export[0], base / "1")
    monkeypatch.setenv("XGR_PROMPT_CACHE_BYTES", str(8 << 20))
    # A host tier too: its memory is one arena the model versions' caches share.
    monkeypatch.setenv("XGR_PROMPT_CACHE_HOST_BYTES", str(4 << 20))
    server = start_server(str(base), file_system_poll_wait_seconds=0.2)

    def states():
        _, body = http(server.rest_port, "/v1/models/recs")
        return {int(v["version"]): v["state"] for v in body["model_version_status"]}

    def wait_for(version):
        deadline = time.monotonic() + 300
        while states() != {version: "AVAILABLE", **{v: "END" for v in range(1, version)}}:
            assert time.monotonic() < deadline, states()
            time.sleep(0.2)

    def grpc_items(inputs, metadata=()):
        proto = predict_pb2.PredictRequest()
        proto.model_spec.name = "recs"
        for name, array in inputs.items():
            proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            answer = stub.Predict(proto, timeout=120, metadata=metadata)
        return tf.make_ndarray(answer.outputs["item_ids"])

    try:
        wait_for(1)
        first = _served_stats(server)
        np.testing.assert_array_equal(grpc_items({**features, "user_key": keys}), want)
        filled = _served_stats(server)
        assert filled["misses"] - first["misses"] == USERS
        np.testing.assert_array_equal(grpc_items({**features, "user_key": keys}), want)
        again = _served_stats(server)
        assert again["hits"] - filled["hits"] == USERS and again["misses"] == filled["misses"]
        # One user's key in the gRPC metadata, then in the REST header (the body has none).
        one = {k: np.asarray(v) for k, v in features_from_world(world, users[:1]).items()}
        np.testing.assert_array_equal(
            grpc_items(one, metadata=(("x-user-key", f"user-{users[0]}"),)), want[:1])
        body = {"inputs": {k: (v.tolist() if v.dtype != object else [x.decode() for x in v])
                           for k, v in one.items()}}
        status, answer, _ = http_full(server.rest_port, "/v1/models/recs:predict", body,
                                      headers={"x-user-key": f"user-{users[0]}"})
        assert status == 200, answer
        np.testing.assert_array_equal(np.array(answer["outputs"]["item_ids"]), want[:1])
        header = _served_stats(server)
        assert header["hits"] - again["hits"] == 2 and header["misses"] == again["misses"]
        # A key over 256 bytes is no key (uncached, no lookup); an unknown key is a miss.
        odd = np.array([b"x" * 300] + [f"stranger-{u}".encode() for u in users[1:]], object)
        np.testing.assert_array_equal(grpc_items({**features, "user_key": odd}), want)
        strangers = _served_stats(server)
        assert strangers["lookups"] - header["lookups"] == USERS - 1
        assert strangers["misses"] - header["misses"] == USERS - 1
        assert strangers["hits"] == header["hits"]
        assert strangers["bytes"] <= strangers["capacity_bytes"] == 8 << 20
        status, text = http(server.rest_port, "/monitoring/prometheus/metrics")
        assert status == 200 and "xgr_prompt_cache_hits_total" in text
        assert "xgr_prompt_cache_hit_latency_seconds_bucket" in text

        # A catalog-only version: the package is reused (hard-linked), so is its cache.
        done, report = export_team_files(
            xgr, tmp_path / "staged" / "2", v2_model.export_files(), BEAMS, TOP_K, TOP_N,
            f"--engine_from={base / '1'}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert report["package_shared"] and report["prompt_cache"]
        (tmp_path / "staged" / "2").rename(base / "2")
        wait_for(2)
        # The new version's warm-up requests already read the old version's entries.
        swapped = _served_stats(server)
        assert swapped["misses"] == strangers["misses"]
        assert swapped["entries"] == strangers["entries"] and swapped["hits"] > strangers["hits"]
        np.testing.assert_array_equal(grpc_items({**features, "user_key": keys}), want)
        kept = _served_stats(server)
        assert kept["hits"] - swapped["hits"] == USERS and kept["misses"] == swapped["misses"]

        # A model version: another package file, so a cache of its own, empty.
        staged = tmp_path / "staged" / "3"
        shutil.copytree(base / "2", staged)     # a copy, not a link: another package
        staged.rename(base / "3")
        wait_for(3)
        np.testing.assert_array_equal(grpc_items({**features, "user_key": keys}), want)
        fresh = _caches()["3"]
        assert fresh["hits"] == 0 and fresh["misses"] >= USERS
        assert 0 < fresh["host_capacity_bytes"] <= 4 << 20
        # The old package, its cache with it, goes once the old version's graph is freed.
        deadline = time.monotonic() + 60
        while set(_caches()) != {"3"}:
            assert time.monotonic() < deadline, sorted(_caches())
            gc.collect()
            time.sleep(0.2)
    finally:
        server.stop()
