"""What the server reads from the model itself: the history limit and the ragged pairing."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from xgr_common.errors import CapacityError, ExportError, InvalidInputError
from tf_frontend.serving import status_codes
from tf_frontend.serving.servable import ModelExecutionError, ServableVersion
from tests.serving.helpers import random_request


def _long_request(events: int) -> dict:
    request = random_request(np.random.default_rng(30), rows=1)
    request.update(history_items=np.arange(events, dtype=np.int64),
                   history_times=np.zeros(events, np.int64),
                   history_splits=np.array([0, events], np.int64))
    return request


def test_history_limit_comes_from_the_model_unless_a_flag_sets_it(model_base):
    path = os.path.join(model_base, "1")
    from_model = ServableVersion("recs", 1, path, batching=None, max_history_events=None)
    assert from_model.signatures["serving_default"].max_history_events == 50
    from_model.predict("", _long_request(50))
    with pytest.raises(InvalidInputError, match="row 0 has 51 events; the maximum history length is 50"):
        from_model.predict("", _long_request(51))
    from_flag = ServableVersion("recs", 1, path, batching=None, max_history_events=60)
    from_flag.predict("", _long_request(51))


def test_serving_spec_file_declares_ragged_groups_and_limit(model_base, tmp_path):
    path = tmp_path / "1"
    shutil.copytree(os.path.join(model_base, "1"), path)
    os.makedirs(path / "assets.extra")
    spec = {"ragged": {"history_splits": ["history_items"]}, "max_history_events": 3}
    (path / "assets.extra" / "xgr_serving.json").write_text(json.dumps(spec))
    version = ServableVersion("recs", 1, str(path), batching=None, max_history_events=None)
    sig = version.signatures["serving_default"]
    assert [(g.splits, g.values) for g in sig.input_groups] == [("history_splits", ("history_items",))]
    assert sig.output_groups == ()  # recent_* are not declared: no longer treated as ragged
    assert sig.max_history_events == 3
    with pytest.raises(InvalidInputError, match="maximum history length is 3"):
        version.predict("", _long_request(4))
    # The most rows a request may carry: the export's, unless the server sets its own.
    (path / "assets.extra" / "xgr_serving.json").write_text(json.dumps({**spec, "max_rows": 1}))
    limited = ServableVersion("recs", 1, str(path), batching=None, max_history_events=None)
    assert limited.signatures["serving_default"].max_rows == 1
    with pytest.raises(InvalidInputError, match="the request has 2 rows; at most 1"):
        limited.predict("", random_request(np.random.default_rng(31), rows=2, max_events=1))
    wider = ServableVersion("recs", 1, str(path), batching=None, max_history_events=None,
                            max_rows=8)
    assert wider.signatures["serving_default"].max_rows == 8
    (path / "assets.extra" / "xgr_serving.json").write_text('{"ragged": {"history_splits": ["nope"]}}')
    with pytest.raises(ExportError, match="only partly present"):
        ServableVersion("recs", 1, str(path), batching=None, max_history_events=None)


@pytest.mark.parametrize("error, expected, status", [
    (tf.errors.InvalidArgumentError(None, None, "bad token"), InvalidInputError, 400),
    (tf.errors.ResourceExhaustedError(None, None, "out of memory"), CapacityError, 503),
    (tf.errors.InternalError(None, None, "torch failed"), ModelExecutionError, 500),
    (tf.errors.FailedPreconditionError(None, None, "cannot load"), ModelExecutionError, 500),
])
def test_model_errors_take_their_status_class(model_base, error, expected, status):
    """The caller's mistakes are 400s; the server's own faults (TorchCall's Internal,
    FailedPrecondition, ResourceExhausted) are 5xx, memory a 503 to retry."""
    version = ServableVersion("recs", 1, os.path.join(model_base, "1"), batching=None,
                              max_history_events=None)

    def failing(**inputs):
        raise error

    version._functions = {name: failing for name in version._functions}
    with pytest.raises(expected) as raised:
        version.predict("", random_request(np.random.default_rng(32), rows=1))
    assert status_codes.http_status(raised.value) == status


def test_a_grpc_code_reads_as_the_rest_status_of_its_class():
    import grpc

    codes = grpc.StatusCode
    assert [status_codes.http_status_for_code(c) for c in (
        codes.INVALID_ARGUMENT, codes.RESOURCE_EXHAUSTED, codes.UNAVAILABLE,
        codes.DEADLINE_EXCEEDED, codes.NOT_FOUND, codes.INTERNAL, codes.DATA_LOSS)] == [
        400, 503, 503, 504, 404, 500, 500]
