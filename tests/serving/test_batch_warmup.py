"""The server's warm-up at its batch sizes (``warmup.warm_batch_sizes``): the warm-up file's
longest row repeated to each power-of-two batch size, a miss's shape then a hit's where the
signature takes a user key, stopping where the graph budget or the memory runs out."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tf_frontend.serving.config import BatchingConfig
from tf_frontend.serving.servable import ServableVersion
from tf_frontend.serving.warmup import (GraphCounts, WARMUP_USER_KEY, batch_sizes, run_warmup,
                                        warm_batch_sizes)
from tests.serving.helpers import HISTORY_SPEC, start_server, write_warmup
from xgr_common.errors import CapacityError, ConfigError, ExportError
from xgr_common.serving_names import SERVING_SIGNATURE, USER_KEY

BATCHING = BatchingConfig(max_batch_size=8, batch_timeout_micros=1000)
NO_GRAPHS = staticmethod(lambda version: GraphCounts(False, 0, False, False))


class KeyedModel(tf.Module):
    """The history layout plus a user key; refuses calls of more than ``max_rows`` rows, as a
    model fault would."""

    def __init__(self, max_rows: int):
        super().__init__()
        self.max_rows = max_rows

    @tf.function(input_signature=[*HISTORY_SPEC, tf.TensorSpec([None], tf.string, name=USER_KEY)])
    def serve(self, user_id, country, history_items, history_times, history_splits,
              request_time, user_key):
        tf.debugging.assert_less_equal(tf.size(user_id), self.max_rows,
                                       message="too many rows for this model")
        lengths = history_splits[1:] - history_splits[:-1]
        return {"score": tf.cast(user_id + lengths, tf.float32)
                + tf.cast(tf.strings.length(user_key), tf.float32)}


def _row(length: int, user: int, key: bytes | None) -> dict:
    request = {"user_id": np.array([user], np.int64), "country": np.array([b"de"], object),
               "history_items": np.arange(length, dtype=np.int64),
               "history_times": np.full(length, 900, np.int64),
               "history_splits": np.array([0, length], np.int64),
               "request_time": np.array([1000], np.int64)}
    if key is not None:
        request[USER_KEY] = np.array([key], object)
    return request


def _two_rows(first: dict, second: dict) -> dict:
    merged = {name: np.concatenate([first[name], second[name]]) for name in first
              if name != "history_splits"}
    a, b = int(first["history_splits"][-1]), int(second["history_splits"][-1])
    merged["history_splits"] = np.array([0, a, a + b], np.int64)
    return merged


def _version(tmp_path, requests, max_rows: int = 64, keyed: bool = True) -> ServableVersion:
    path = str(tmp_path / "1")
    if keyed:
        module = KeyedModel(max_rows)
        tf.saved_model.save(module, path,
                            signatures={SERVING_SIGNATURE: module.serve.get_concrete_function()})
    else:
        from tests.serving.helpers import save_history_model
        save_history_model(path, 1.0)
    write_warmup(path, requests)
    return ServableVersion("recs", 1, path, BATCHING)


def _recorded(version: ServableVersion, fail_at: int | None = None) -> list[dict]:
    """The inputs of every ``run`` of ``version`` from now on; ``fail_at``: a call of that
    many rows raises the device's out-of-memory error instead."""
    calls, run = [], version.run

    def spy(request, deadline=None):
        calls.append(dict(request.inputs))
        if fail_at is not None and request.rows == fail_at:
            raise CapacityError("model ran out of memory on this request; retry later")
        return run(request, deadline)

    version.run = spy
    return calls


def test_batch_sizes_are_powers_of_two_then_the_largest():
    assert batch_sizes(32) == [2, 4, 8, 16, 32]
    assert batch_sizes(12) == [2, 4, 8, 12]
    assert batch_sizes(2) == [2]
    assert batch_sizes(1) == []


def test_the_longest_row_runs_at_every_batch_size_without_then_with_its_key(tmp_path):
    longest = _row(5, 7, b"user-7")
    version = _version(tmp_path, [_two_rows(_row(3, 1, b"user-1"), longest),
                                  _row(1, 2, b"user-2")])
    assert run_warmup(version) == 2
    calls = _recorded(version)
    assert warm_batch_sizes(version, "all", 8, graph_counts=NO_GRAPHS) == 8
    (first, hit), tiled = calls[:2], calls[2:]
    assert first[USER_KEY].tolist() == [b"user-7"]   # the entry the hit rounds read
    assert hit[USER_KEY].tolist() == [b"user-7"]     # read back: the one-row hit's shape
    np.testing.assert_array_equal(hit["history_splits"], [0, 5])
    assert [len(c["user_id"]) for c in tiled] == [2, 2, 4, 4, 8, 8]
    for call in tiled:
        rows = len(call["user_id"])
        np.testing.assert_array_equal(call["history_splits"], np.arange(rows + 1) * 5)
        assert call["user_id"].tolist() == [7] * rows
    assert [set(c[USER_KEY].tolist()) for c in tiled] == [{b""}, {b"user-7"}] * 3


def test_a_longest_row_without_a_key_hits_under_the_warmup_key(tmp_path):
    version = _version(tmp_path, [_row(4, 3, b"")])
    calls = _recorded(version)
    assert warm_batch_sizes(version, "all", 2, graph_counts=NO_GRAPHS) == 4
    assert calls[0][USER_KEY].tolist() == calls[1][USER_KEY].tolist() == [WARMUP_USER_KEY]
    assert calls[3][USER_KEY].tolist() == [WARMUP_USER_KEY] * 2


def test_a_signature_without_a_key_runs_one_round_per_size(tmp_path):
    rng = np.random.default_rng(3)
    from tests.serving.helpers import random_request
    version = _version(tmp_path, [random_request(rng, 2), random_request(rng, 1)], keyed=False)
    calls = _recorded(version)
    assert warm_batch_sizes(version, "all", 8, graph_counts=NO_GRAPHS) == 3
    assert [len(c["user_id"]) for c in calls] == [2, 4, 8]


def test_auto_warms_only_a_version_whose_packages_replay_graphs(tmp_path):
    version = _version(tmp_path, [_row(4, 3, b"k")])
    calls = _recorded(version)
    assert warm_batch_sizes(version, "auto", 8, graph_counts=NO_GRAPHS) == 0
    assert warm_batch_sizes(version, "none", 8, graph_counts=NO_GRAPHS) == 0
    assert calls == []
    # No batching: only the keyed row, stored and read back at one row.
    assert warm_batch_sizes(version, "all", None, graph_counts=NO_GRAPHS) == 2
    assert [len(c["user_id"]) for c in calls] == [1, 1]
    calls.clear()
    graphed = lambda v: GraphCounts(True, 0, False, False)
    assert warm_batch_sizes(version, "auto", 8, graph_counts=graphed) == 8
    with pytest.raises(ConfigError, match="warmup_batches must be one of"):
        warm_batch_sizes(version, "always", 8, graph_counts=graphed)


def test_it_stops_where_a_capture_would_evict_a_graph_or_memory_runs_out(tmp_path, caplog):
    version = _version(tmp_path, [_row(4, 3, b"k")])
    calls = _recorded(version)
    # The calls: the keyed row stored and read back, then 2 rows without and with the key...
    evictions = lambda v: GraphCounts(True, 1 if len(calls) > 3 else 0, False, False)
    assert warm_batch_sizes(version, "all", 8, graph_counts=evictions) == 4
    assert "graph budget is full" in caplog.text
    calls.clear()
    full = lambda v: GraphCounts(True, 0, False, len(calls) > 4)   # full after 5 calls
    assert warm_batch_sizes(version, "all", 8, graph_counts=full) == 5
    failed = lambda v: GraphCounts(True, 0, len(calls) > 2, False)
    calls.clear()
    assert warm_batch_sizes(version, "all", 8, graph_counts=failed) == 3
    version = _version(tmp_path / "oom", [_row(4, 3, b"k")])
    _recorded(version, fail_at=4)   # out of memory at 4 rows: after 2 rows' two calls
    assert warm_batch_sizes(version, "all", 8, graph_counts=NO_GRAPHS) == 4
    assert "ran out of memory" in caplog.text


def test_a_model_fault_at_a_batch_size_fails_the_load_naming_the_size(tmp_path):
    version = _version(tmp_path, [_row(4, 3, b"k")], max_rows=4)
    with pytest.raises(ExportError, match="warm-up at 8 rows .* failed"):
        warm_batch_sizes(version, "all", 8, graph_counts=NO_GRAPHS)


def test_the_server_warms_its_batch_sizes_before_the_version_is_available(tmp_path):
    from tests.serving.helpers import random_request, save_history_model

    base = tmp_path / "recs"
    save_history_model(str(base / "1"), 1.0)
    rng = np.random.default_rng(5)
    write_warmup(str(base / "1"), [random_request(rng, 2), random_request(rng, 1)])
    server = start_server(str(base), file_system_poll_wait_seconds=0, warmup_batches="all",
                          batching=BatchingConfig(max_batch_size=4, batch_timeout_micros=1000))
    try:
        labels = {"model_name": "recs"}
        registry = server.metrics.registry
        # The file's two requests, then its longest row at 2 and 4 rows.
        assert registry.get_sample_value("xgr_serving_batch_size_count", labels) == 4
        assert registry.get_sample_value("xgr_serving_batch_size_sum", labels) == 2 + 1 + 2 + 4
    finally:
        server.stop()
    assert os.path.exists(base / "1" / "assets.extra" / "tf_serving_warmup_requests")


def test_packages_under_names_the_engine_package_of_a_loaded_version(engine_models, tmp_path):
    import shutil

    from custom_ops.torch_call import packages_under
    from tf_frontend.serving.warmup import _graph_counts

    path = tmp_path / "recs" / "1"
    shutil.copytree(engine_models[1], path)
    version = ServableVersion("recs", 1, str(path), BATCHING)
    assert run_warmup(version) >= 1          # the package loads on its first call
    found = packages_under(path)
    assert len(found) == 1 and next(iter(found)).startswith(str(path))
    assert packages_under(tmp_path / "elsewhere") == {}
    assert _graph_counts(version) == (False, 0, False, False)   # a CPU package runs eagerly
    version.unload(0.0)
