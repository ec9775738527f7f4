"""REST API of the real server on loopback, driven with plain HTTP (urllib)."""

import base64
import json
import re

import numpy as np
import pytest

from tests.serving.conftest import MAX_ROWS
from tests.serving.helpers import (columnar, history_reference, http, http_full, instances,
                                   random_request)

PREDICT = "/v1/models/recs:predict"


def test_status_and_metadata(server):
    status, body = http(server.rest_port, "/v1/models/recs")
    assert status == 200
    assert body["model_version_status"] == [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]
    status, body = http(server.rest_port, "/v1/models/recs/versions/1/metadata")
    assert status == 200 and body["model_spec"] == {"name": "recs", "signature_name": "",
                                                    "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures) == ["dense", "serving_default", "total"]
    assert sorted(signatures["serving_default"]["inputs"]) == [
        "country", "history_items", "history_splits", "history_times", "request_time", "user_id"]
    assert signatures["serving_default"]["inputs"]["country"]["dtype"] == "DT_STRING"


def test_columnar_predict_equals_in_process(server, in_process):
    request = random_request(np.random.default_rng(1), rows=4)
    status, body = http(server.rest_port, PREDICT, {"inputs": columnar(request)})
    assert status == 200, body
    expected = in_process(request)
    outputs = body["outputs"]
    np.testing.assert_array_equal(np.array(outputs["score"], np.float32), expected["score"])
    assert outputs["country_upper"] == [c.decode() for c in expected["country_upper"]]
    assert outputs["recent_items"] == expected["recent_items"].tolist()
    assert outputs["recent_splits"] == expected["recent_splits"].tolist()
    reference = history_reference(1.0, **request)
    np.testing.assert_allclose(outputs["score"], reference["score"], rtol=1e-6)


def test_row_predict_splits_ragged_output_per_instance(server, in_process):
    request = random_request(np.random.default_rng(2), rows=3)
    status, body = http(server.rest_port, PREDICT,
                        {"signature_name": "serving_default", "instances": instances(request)})
    assert status == 200, body
    expected = in_process(request)
    splits = expected["recent_splits"]
    assert len(body["predictions"]) == 3
    for r, row in enumerate(body["predictions"]):
        assert set(row) == {"score", "country_upper", "recent_items"}
        assert row["score"] == pytest.approx(float(expected["score"][r]))
        assert row["country_upper"] == expected["country_upper"][r].decode()
        assert row["recent_items"] == expected["recent_items"][splits[r]:splits[r + 1]].tolist()


def test_b64_strings_and_named_signature(server, in_process):
    request = random_request(np.random.default_rng(3), rows=2)
    body = columnar(request)
    body["country"] = [{"b64": base64.b64encode(c).decode()} for c in request["country"]]
    status, answer = http(server.rest_port, PREDICT, {"inputs": body})
    assert status == 200, answer
    assert answer["outputs"]["country_upper"] == [c.decode() for c in
                                                  in_process(request)["country_upper"]]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    status, answer = http(server.rest_port, "/v1/models/recs/versions/1:predict",
                          {"signature_name": "dense", "instances": x.tolist()})
    assert status == 200, answer
    assert answer["predictions"] == in_process({"x": x}, "dense")["y"].tolist()


def _good(server):
    request = random_request(np.random.default_rng(9), rows=2)
    status, body = http(server.rest_port, PREDICT, {"inputs": columnar(request)})
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["score"],
                               history_reference(1.0, **request)["score"], rtol=1e-6)


def _nested(leaves: list, depth: int) -> list:
    """``leaves`` wrapped in ``depth`` more single-element lists."""
    for _ in range(depth):
        leaves = [leaves]
    return leaves


def instances_of(good: dict) -> list[dict]:
    """The columnar request ``good`` (two rows, histories split) in the row format."""
    splits = good["history_splits"]
    return [{"user_id": good["user_id"][r], "country": good["country"][r],
             "history_items": good["history_items"][splits[r]:splits[r + 1]],
             "history_times": good["history_times"][splits[r]:splits[r + 1]],
             "request_time": good["request_time"][r]} for r in range(2)]


# What no error body may show: server paths, graph node names, traced function names.
_INTERNALS = re.compile(r"(?<![\w.])/(tmp|home|work|root|usr|opt|var)/|\{\{node|\[\[node|"
                        r"__inference|Detected at node|StatefulPartitionedCall")


def _bad_cases():
    good = columnar(random_request(np.random.default_rng(4), rows=2))

    def changed(**kw):
        inputs = dict(good)
        for k, v in kw.items():
            if v is None:
                inputs.pop(k)
            else:
                inputs[k] = v
        return {"inputs": inputs}

    long_history = dict(good, history_items=list(range(25)), history_times=[0] * 25,
                        history_splits=[0, 25, 25])
    return {
        "malformed_json": (PREDICT, b'{"inputs": [1, 2', 400, "malformed JSON"),
        "not_an_object": (PREDICT, b"[1, 2]", 400, "JSON object"),
        "both_formats": (PREDICT, {"inputs": good, "instances": [good]}, 400, "exactly one"),
        "missing_input": (PREDICT, changed(request_time=None), 400, "request_time"),
        "unknown_input": (PREDICT, changed(extra=[1, 2]), 400, "extra"),
        "wrong_dtype": (PREDICT, changed(user_id=["a", "b"]), 400, "user_id"),
        "float_for_int": (PREDICT, changed(user_id=[1.5, 2.0]), 400, "int64"),
        "wrong_rank": (PREDICT, changed(user_id=[[1], [2]]), 400, "rank"),
        "batch_mismatch": (PREDICT, changed(user_id=[1, 2, 3]), 400, "batch size"),
        "bad_splits": (PREDICT, changed(history_splits=[0, 1, 99]), 400, "history_splits"),
        "bad_b64": (PREDICT, changed(country=[{"b64": "%%%"}, {"b64": "AA=="}]), 400, "base64"),
        "too_long_history": (PREDICT, {"inputs": long_history}, 400, "maximum history length"),
        "model_invalid_argument": (PREDICT, changed(history_items=[-1] * len(good["history_items"])
                                                    or [-1]), 400, "history_items must be >= 0"),
        "unknown_signature": (PREDICT, {"signature_name": "nope", "inputs": good}, 400, "nope"),
        "unknown_model": ("/v1/models/other:predict", {"inputs": good}, 404, "other"),
        "unknown_version": ("/v1/models/recs/versions/7:predict", {"inputs": good}, 404,
                            "version 7"),
        "oversized": (PREDICT, b"{" + b" " * 70_000 + b"}", 400, "max_request_bytes"),
        "unknown_path": ("/v1/models/recs:explode", {"inputs": good}, 404, "no such endpoint"),
        "deep_json": (PREDICT, b'{"inputs": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", 400,
                      "nested deeper than the parser allows"),
        "deep_string_list": (PREDICT, changed(country=_nested(["de", "fr"], 500)), 400,
                             "nested deeper than 32 levels"),
        "deep_number_list": (PREDICT, changed(user_id=_nested([1, 2], 70)), 400,
                             "nested deeper than 32 levels"),
        "lone_surrogate": (PREDICT, json.dumps({"inputs": dict(good, country=["\ud800", "de"])})
                           .encode(), 400, "not valid Unicode"),
        "too_many_rows": (PREDICT, {"inputs": columnar(random_request(
            np.random.default_rng(5), rows=MAX_ROWS + 1, max_events=0))}, 400,
                          f"at most {MAX_ROWS} are served"),
        # Each of these was a 500 or a misleading message once (issue 27).
        "unknown_ragged_input": (PREDICT, changed(extra=[[1, 2], [3]]), 400,
                                 "unknown input(s) ['extra']"),
        "unknown_input_in_rows": (PREDICT, {"instances": [dict(instances_of(good)[0],
                                                               bogus=[1, [2]])]}, 400,
                                  "unknown input(s) ['bogus']"),
        "int_just_past_int64": (PREDICT, changed(user_id=[2**63, 1]), 400,
                                "out of range for int64"),
        "int_past_uint64": (PREDICT, changed(user_id=[2**64, 1]), 400,
                            "integers out of range for int64"),
        "mixed_depth_list": (PREDICT, changed(user_id=[[1], [[[[2]]]]]), 400, "'user_id'"),
        "query_string_on_unknown_model": ("/v1/models/other:predict?x=recs", {"inputs": good},
                                          404, "model 'other' not found"),
    }


@pytest.mark.parametrize("case", sorted(_bad_cases()))
def test_bad_request_is_refused_and_server_keeps_serving(server, case):
    path, body, want_status, fragment = _bad_cases()[case]
    raw = body if isinstance(body, bytes) else None
    status, answer, headers = http_full(server.rest_port, path, None if raw else body,
                                        method="POST", raw=raw)
    assert status == want_status, answer
    assert fragment in answer["error"], answer
    assert answer["request_id"] == headers["X-Request-Id"]
    assert not _INTERNALS.search(answer["error"]), answer
    _good(server)


def test_unknown_model_status_is_404(server):
    status, body = http(server.rest_port, "/v1/models/other")
    assert status == 404 and "other" in body["error"]
    status, body = http(server.rest_port, "/v1/models/recs/versions/3")
    assert status == 404 and "version 3" in body["error"]


def test_health_and_prometheus_metrics(server):
    _good(server)
    http(server.rest_port, PREDICT, raw=b"not json", method="POST")
    status, body = http(server.rest_port, "/healthz")
    assert status == 200 and body == {"status": "SERVING"}
    status, text = http(server.rest_port, "/monitoring/prometheus/metrics")
    assert status == 200
    assert 'xgr_serving_requests_total{api="rest_predict",code="200",model_name="recs"}' in text
    assert 'xgr_serving_errors_total{api="rest_predict",code="400",model_name="recs"}' in text
    assert "xgr_serving_request_latency_seconds_bucket" in text
    assert "xgr_serving_batch_size_count" in text
