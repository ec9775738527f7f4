"""Batches for the parity harness, from ``.npz`` or TFRecord files.

**npz**: one key per input and batch, ``"<batch>/<input>"`` (e.g. ``"0/x"``, ``"1/x"``);
a file whose keys have no ``/`` is a single batch. A ragged input is stored as two arrays,
``"<batch>/<input>.values"`` and ``"<batch>/<input>.row_splits"``. Strings are stored as
numpy bytes arrays (``dtype='S'``), so no pickling is needed::

    np.savez("batches.npz", **{"0/x": x0, "1/x": x1})

**TFRecord** (``.tfrecord`` / ``.tfrecords``): one ``tf.train.Example`` per row, one feature
per model input with the input's name; rows are grouped into batches of ``batch_size``.
Fixed-shape inputs parse as ``FixedLenFeature(shape[1:])``, ragged inputs as ``RaggedFeature``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from xgr_common.errors import InvalidInputError

TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords")


def _as_tf(array: np.ndarray) -> Any:
    return tf.constant(array.astype(bytes) if array.dtype.kind == "U" else array)


def load_npz(path: Path) -> list[dict[str, Any]]:
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    grouped: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for key, array in arrays.items():
        batch, _, name = key.rpartition("/")
        grouped[batch][name] = array
    batches = []
    for batch in sorted(grouped, key=lambda b: (len(b), b)):
        parts, out = grouped[batch], {}
        for name, array in parts.items():
            if name.endswith(".row_splits"):
                continue
            if name.endswith(".values"):
                base = name[: -len(".values")]
                if f"{base}.row_splits" not in parts:
                    raise InvalidInputError(f"{path}: batch {batch!r} has {name} without "
                                            f"{base}.row_splits")
                out[base] = tf.RaggedTensor.from_row_splits(
                    _as_tf(array), tf.constant(parts[f"{base}.row_splits"], dtype=tf.int64))
            else:
                out[name] = _as_tf(array)
        batches.append(out)
    if not batches:
        raise InvalidInputError(f"{path}: no arrays in the file")
    return batches


def _feature_spec(model: Any) -> dict[str, Any]:
    if not getattr(model, "inputs", None):
        raise InvalidInputError("TFRecord data needs a Functional model (its inputs give the "
                                "feature spec); use an .npz file for this model")
    spec = {}
    for ref in model.inputs:
        dtype = tf.as_dtype(ref.dtype)
        parse_dtype = tf.string if dtype == tf.string else \
            tf.float32 if dtype.is_floating else tf.int64
        if getattr(ref, "ragged", False) or \
                isinstance(getattr(ref, "type_spec", None), tf.RaggedTensorSpec):  # tf_keras
            spec[ref.name] = tf.io.RaggedFeature(parse_dtype, row_splits_dtype=tf.int64)
        else:
            spec[ref.name] = tf.io.FixedLenFeature(list(ref.shape[1:]), parse_dtype)
    return spec


def load_tfrecord(path: Path, model: Any, batch_size: int) -> Iterator[dict[str, Any]]:
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be >= 1 for TFRecord data, got {batch_size}")
    spec = _feature_spec(model)
    dtypes = {ref.name: tf.as_dtype(ref.dtype) for ref in model.inputs}
    dataset = tf.data.TFRecordDataset(str(path)).batch(batch_size)
    for serialized in dataset:
        parsed = tf.io.parse_example(serialized, spec)
        yield {name: tf.cast(value, dtypes[name]) if dtypes[name] != value.dtype else value
               for name, value in parsed.items()}


def load_batches(path: str | Path, model: Any, batch_size: int = 32) -> list[dict]:
    """All batches of ``path`` (npz or TFRecord), each a dict input name -> TF tensor."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"data file {path} does not exist")
    if path.suffix == ".npz":
        return load_npz(path)
    if path.suffix in TFRECORD_SUFFIXES:
        return list(load_tfrecord(path, model, batch_size))
    raise InvalidInputError(f"data file {path}: expected .npz or one of {TFRECORD_SUFFIXES}")


def save_npz(path: str | Path, batches: list[dict[str, Any]]) -> None:
    """Write batches in the npz layout above (TF tensors, ragged tensors or arrays)."""
    arrays = {}
    for i, batch in enumerate(batches):
        for name, value in batch.items():
            if isinstance(value, tf.RaggedTensor):
                arrays[f"{i}/{name}.values"] = value.flat_values.numpy()
                arrays[f"{i}/{name}.row_splits"] = value.row_splits.numpy()
            else:
                array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
                arrays[f"{i}/{name}"] = array.astype(bytes) if array.dtype.kind in "OU" else array
    np.savez(path, **arrays)
