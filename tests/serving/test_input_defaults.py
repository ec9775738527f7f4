"""Inputs a request may leave out (``xgr_serving.json``'s ``defaults``): filled per row before
the checks, so an omitted control behaves as the model's own default and merges into batches
with requests that sent it."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tf_frontend.serving.signature import (RaggedGroup, ServingSpec, SignatureInfo,
                                           TensorInfo, describe_signature)
from tf_frontend.serving.validation import prepare
from xgr_common.errors import ExportError, InvalidInputError


def _sig() -> SignatureInfo:
    vec = lambda n, d=tf.int64: TensorInfo(n, d, (None,))  # noqa: E731
    return SignatureInfo(
        name="serving_with_controls",
        inputs={"user_id": vec("user_id"), "exclude_items": vec("exclude_items"),
                "exclude_splits": vec("exclude_splits"), "top_k": vec("top_k", tf.int32)},
        outputs={"item_ids": TensorInfo("item_ids", tf.int64, (None, 5))},
        input_groups=(RaggedGroup("exclude_splits", ("exclude_items",)),),
        output_groups=(), max_history_events=None,
        defaults={"exclude_items": (), "top_k": 10})


def test_left_out_controls_get_their_defaults_per_row():
    request = prepare(_sig(), {"user_id": np.array([3, 4, 5], np.int64)})
    assert request.rows == 3
    np.testing.assert_array_equal(request.inputs["top_k"], [10, 10, 10])
    assert request.inputs["top_k"].dtype == np.int32
    np.testing.assert_array_equal(request.inputs["exclude_splits"], [0, 0, 0, 0])
    assert request.inputs["exclude_items"].shape == (0,)
    # Sent or filled, the same merge key: such requests share a model call.
    sent = prepare(_sig(), {"user_id": np.array([1], np.int64),
                            "exclude_items": np.array([7], np.int64),
                            "exclude_splits": np.array([0, 1], np.int64),
                            "top_k": np.array([4], np.int32)})
    assert sent.merge_key == request.merge_key
    np.testing.assert_array_equal(sent.inputs["top_k"], [4])


def test_a_scalar_where_a_batch_is_expected_is_a_clear_refusal():
    # No batch size to fill the defaults with: a 400 naming what the signature takes.
    with pytest.raises(InvalidInputError, match=r"missing input.*user_id: int64\[\?\]"):
        prepare(_sig(), {"user_id": np.array(3, np.int64)})


def test_half_a_ragged_group_is_still_refused():
    with pytest.raises(InvalidInputError, match="missing input.*exclude_splits"):
        prepare(_sig(), {"user_id": np.array([3], np.int64),
                         "exclude_items": np.array([7], np.int64)})


def test_the_spec_file_declares_defaults(tmp_path):
    (tmp_path / "assets.extra").mkdir()
    path = tmp_path / "assets.extra" / "xgr_serving.json"
    path.write_text(json.dumps({"ragged": {"exclude_splits": ["exclude_items"]},
                                "defaults": {"exclude_items": [], "top_k": 10}}))
    assert ServingSpec.read(str(tmp_path)).defaults == {"exclude_items": (), "top_k": 10}
    path.write_text(json.dumps({"defaults": {"top_k": True}}))
    with pytest.raises(ExportError, match="'defaults' must map an input name"):
        ServingSpec.read(str(tmp_path))


def _keyed_function(folder):
    """A saved signature taking a user id and a user key (as a prompt-cache export does)."""
    module = tf.Module()
    module.serve = tf.function(
        lambda user_id, user_key: {"n": tf.strings.length(user_key)},
        input_signature=[tf.TensorSpec([None], tf.int64, name="user_id"),
                         tf.TensorSpec([None], tf.string, name="user_key")])
    tf.saved_model.save(module, str(folder), signatures={
        "s": module.serve.get_concrete_function()})
    return tf.saved_model.load(str(folder)).signatures["s"]


def test_a_default_must_match_its_input_dtype(tmp_path):
    """A string default (a user key's "") fills string inputs only, a number numeric ones."""
    function = _keyed_function(tmp_path)
    with pytest.raises(ExportError, match="default of 'user_id' must be a number"):
        describe_signature("s", function, ServingSpec(defaults={"user_id": "ten"}), None)
    with pytest.raises(ExportError, match="default of 'user_key' must be a string"):
        describe_signature("s", function, ServingSpec(defaults={"user_key": 0}), None)


def test_a_user_key_comes_from_the_body_the_header_or_the_default(tmp_path):
    sig = describe_signature("s", _keyed_function(tmp_path),
                             ServingSpec(defaults={"user_key": ""}), None)
    users = {"user_id": np.array([3, 4], np.int64)}
    assert prepare(sig, users).inputs["user_key"].tolist() == ["", ""]
    header = prepare(sig, users, user_key="alice").inputs["user_key"]
    assert header.tolist() == [b"alice", b"alice"]
    body = prepare(sig, {**users, "user_key": np.array([b"bob", b"eve"], object)},
                   user_key="alice").inputs["user_key"]
    assert body.tolist() == [b"bob", b"eve"]            # the body's keys win


def _per_call_sig() -> SignatureInfo:
    sig = _sig()
    vec = TensorInfo("beam_width", tf.int32, (None,))
    return SignatureInfo(name=sig.name, inputs={**sig.inputs, "beam_width": vec},
                         outputs=sig.outputs, input_groups=sig.input_groups, output_groups=(),
                         max_history_events=None,
                         defaults={**sig.defaults, "beam_width": 16}, per_call=("beam_width",))


def test_per_call_inputs_split_the_merge_key_by_value():
    sig = _per_call_sig()
    users = {"user_id": np.array([3, 4], np.int64)}
    default = prepare(sig, users)
    np.testing.assert_array_equal(default.inputs["beam_width"], [16, 16])
    same = prepare(sig, {**users, "beam_width": np.array([16, 16], np.int32)})
    other = prepare(sig, {**users, "beam_width": np.array([64, 64], np.int32)})
    # Left out or sent, width 16 shares a call; width 64 never joins them.
    assert default.merge_key == same.merge_key != other.merge_key


def test_a_request_whose_rows_disagree_on_a_per_call_input_is_refused():
    with pytest.raises(InvalidInputError, match=r"beam_width: every row of one request must "
                                                r"carry the same value.*\[16, 64\]"):
        prepare(_per_call_sig(), {"user_id": np.array([3, 4], np.int64),
                                  "beam_width": np.array([16, 64], np.int32)})


def test_the_spec_file_declares_per_call_inputs(tmp_path):
    (tmp_path / "assets.extra").mkdir()
    path = tmp_path / "assets.extra" / "xgr_serving.json"
    path.write_text(json.dumps({"per_call": ["beam_width"], "defaults": {"beam_width": 16}}))
    assert ServingSpec.read(str(tmp_path)).per_call == ("beam_width",)
    path.write_text(json.dumps({"per_call": "beam_width"}))
    with pytest.raises(ExportError, match="'per_call' must be a list of input names"):
        ServingSpec.read(str(tmp_path))
