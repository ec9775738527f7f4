"""TF Serving's REST JSON formats against a signature, without a server."""

import base64

import numpy as np
import pytest
import tensorflow as tf

from xgr_common.errors import InvalidInputError
from tf_frontend.serving.json_codec import decode_request, encode_response, to_array
from tf_frontend.serving.signature import RaggedGroup, SignatureInfo, TensorInfo

SIG = SignatureInfo(
    name="serving_default",
    inputs={"ids": TensorInfo("ids", tf.int64, (None,)),
            "items": TensorInfo("items", tf.int64, (None,)),
            "times": TensorInfo("times", tf.int64, (None,)),
            "splits": TensorInfo("splits", tf.int64, (None,))},
    outputs={"label_bytes": TensorInfo("label_bytes", tf.string, (None,)),
             "name": TensorInfo("name", tf.string, (None,))},
    input_groups=(RaggedGroup("splits", ("items", "times")),), output_groups=(),
    max_history_events=None)


def test_row_format_derives_row_splits_from_each_instance():
    inputs, row_format = decode_request(SIG, {"instances": [
        {"ids": 1, "items": [4, 5], "times": [7, 8]}, {"ids": 2, "items": [], "times": []},
        {"ids": 3, "items": [6], "times": [9]}]})
    assert row_format
    np.testing.assert_array_equal(inputs["splits"], [0, 2, 2, 3])
    np.testing.assert_array_equal(inputs["items"], [4, 5, 6])
    assert inputs["items"].dtype == np.int64 and inputs["ids"].tolist() == [1, 2, 3]


@pytest.mark.parametrize("body, fragment", [
    ({"instances": [{"ids": 1, "items": [4, 5], "times": [7]}]}, "per-instance lengths"),
    ({"instances": [{"ids": 1, "items": [4], "times": [7], "splits": [0, 1]}]}, "do not send"),
    ({"instances": [{"ids": 1, "items": [4], "times": [7]}, {"ids": 2}]}, "differ from instance 0"),
    ({"instances": [1, 2]}, "must be objects naming the inputs"),
    ({"instances": []}, "non-empty list"),
    ({"inputs": [1, 2]}, "must be an object naming the inputs"),
])
def test_row_format_errors_name_the_problem(body, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        decode_request(SIG, body)


def test_value_conversion_checks_dtype_range_and_raggedness():
    info = TensorInfo("x", tf.int32, (None, 2))
    assert to_array("x", [[1, 2], [3, 4]], info).dtype == np.int32
    with pytest.raises(InvalidInputError, match="out of range for int32"):
        to_array("x", [[1, 2**40]], info)
    with pytest.raises(InvalidInputError, match="ragged"):
        to_array("x", [[1, 2], [3]], info)
    with pytest.raises(InvalidInputError, match="expected int32 values, got bool"):
        to_array("x", [[True, False]], info)
    strings = to_array("s", [["a", {"b64": base64.b64encode(b"\xff").decode()}]],
                       TensorInfo("s", tf.string, (None, 2)))
    assert strings.tolist() == [[b"a", b"\xff"]]


def test_binary_outputs_are_base64_like_tf_serving():
    outputs = {"label_bytes": np.array([b"ok", b"\x00\x01"], dtype=object),
               "name": np.array([b"caf\xc3\xa9", b"\xff"], dtype=object)}
    body = encode_response(SIG, outputs, row_format=False, rows=None)
    assert body["outputs"]["label_bytes"] == [{"b64": "b2s="}, {"b64": "AAE="}]
    assert body["outputs"]["name"] == ["café", {"b64": "/w=="}]  # not UTF-8 -> b64
    rows = encode_response(SIG, outputs, row_format=True, rows=2)["predictions"]
    assert rows[0] == {"label_bytes": {"b64": "b2s="}, "name": "café"}
