"""The committed support tables equal the generated ones; parity data files load as documented."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import toy_models

from bridge.onnx_torch.support_table import render
from bridge.parity.data import load_batches, save_npz
from xgr_common.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[2]


def test_committed_support_tables_match_the_registries():
    committed = (ROOT / "migration_guide" / "support_tables.md").read_text()
    assert committed == render(), ("regenerate: python -m bridge.onnx_torch.support_table "
                                   "> migration_guide/support_tables.md")


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "LayerNormalization", "Softmax",
                                "XgrAssemblePrompt", "Erfc"])
def test_committed_support_tables_list_the_core_ops(op):
    assert f"`{op}`" in (ROOT / "migration_guide" / "support_tables.md").read_text()


def test_npz_round_trip_with_strings_and_ragged(tmp_path):
    batches = [{"country": tf.constant([b"us", b"gb"]),
                "items": tf.ragged.constant([[1, 2, 3], []], dtype=tf.int64),
                "x": tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))},
               {"country": tf.constant([b"de"]), "items": tf.ragged.constant([[7]], dtype=tf.int64),
                "x": tf.zeros((1, 3))}]
    save_npz(tmp_path / "b.npz", batches)
    loaded = load_batches(tmp_path / "b.npz", model=None)
    assert len(loaded) == 2
    assert loaded[0]["country"].dtype == tf.string
    assert loaded[0]["items"].to_list() == [[1, 2, 3], []]
    assert loaded[1]["items"].to_list() == [[7]]
    np.testing.assert_array_equal(loaded[0]["x"].numpy(), batches[0]["x"].numpy())


def test_single_batch_npz_without_prefixes(tmp_path):
    np.savez(tmp_path / "one.npz", x=np.ones((2, toy_models.FEATURES), np.float32))
    (batch,) = load_batches(tmp_path / "one.npz", model=None)
    assert batch["x"].shape == (2, toy_models.FEATURES)


def test_tfrecord_rows_are_batched_by_model_inputs(tmp_path):
    model = toy_models.with_unconvertible()
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(tmp_path / "rows.tfrecord")) as writer:
        for i in range(5):
            feature = {
                "country": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"us"])),
                "user": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "x": tf.train.Feature(float_list=tf.train.FloatList(
                    value=rng.normal(size=toy_models.FEATURES))),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature))
                         .SerializeToString())
    batches = load_batches(tmp_path / "rows.tfrecord", model, batch_size=2)
    assert [b["x"].shape[0] for b in batches] == [2, 2, 1]
    assert batches[0]["user"].dtype == tf.int64 and batches[0]["x"].dtype == tf.float32
    assert batches[2]["user"].numpy().tolist() == [[4]]


def test_bad_data_files_are_named(tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_batches(tmp_path / "missing.npz", model=None)
    (tmp_path / "data.csv").write_text("x\n")
    with pytest.raises(InvalidInputError, match="expected .npz"):
        load_batches(tmp_path / "data.csv", model=None)
    np.savez(tmp_path / "bad.npz", **{"0/items.values": np.arange(3)})
    with pytest.raises(InvalidInputError, match="without items.row_splits"):
        load_batches(tmp_path / "bad.npz", model=None)
