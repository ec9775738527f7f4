"""Warm-up from ``assets.extra/tf_serving_warmup_requests``, as TF Serving does, then at the
server's batch sizes.

The file is a TFRecord of ``PredictionLog`` protos; each ``predict_log`` request is replayed
once against the freshly loaded version before it becomes AVAILABLE. That is what proves a
version works: TorchCall loads its engine package on the first call, so a truncated or
corrupt package is found here, and the version stays out, instead of on the first client's
request. A failing warm-up request (of any kind: a rejected input as much as a model fault)
fails the load. Its tensors are checked as a client's are (``tensor_proto``).

A package replayed as CUDA graphs captures one graph per bucketed shape on the first call of
that shape, which costs that call far more than a replay. The file cannot know the server's
batching (a static file says nothing of ``--max_batch_size``), so ``warm_batch_sizes`` does
what it cannot: the file's longest row, repeated to every power-of-two batch size up to
``max_batch_size``, once without a user key (the shape of a prompt-cache miss) and once
with one key on every row (a hit), so full-length traffic of any batch size finds its graphs
captured. A signature with a user key also gets the row's hit at one row (the file's
requests run once each, so they are misses), with batching or without. It stops, keeping
the version, once the package's graph budget is full (a capture would evict another graph)
or the device runs out of memory at that size.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterator, Mapping, NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from custom_ops.torch_call import packages_under
from xgr_common.errors import CapacityError, ConfigError, ExportError, require
from xgr_common.serving_names import USER_KEY, WARMUP_FILE
from tf_frontend.serving.config import WARMUP_BATCH_MODES
from tf_frontend.serving.batch_merge import merge_inputs
from tf_frontend.serving.servable import ServableVersion
from tf_frontend.serving.signature import SignatureInfo
from tf_frontend.serving.tensor_proto import decode_inputs
from tf_frontend.serving.validation import PreparedRequest, prepare

LOG = logging.getLogger("xgr.serving")

MAX_RECORDS = 1000   # TF Serving's own bound on warm-up records
# The key the hit round uses for a longest row that carries none.
WARMUP_USER_KEY = b"xgr-warmup"


def _requests(path: str) -> Iterator[tuple[int, object]]:
    """The file's ``PredictRequest`` protos, numbered; ``ExportError`` for a malformed file."""
    try:
        records = list(tf.data.TFRecordDataset(path).take(MAX_RECORDS + 1).as_numpy_iterator())
    except tf.errors.OpError as e:
        raise ExportError(f"{WARMUP_FILE}: not a readable TFRecord file: {e.message}") from e
    if len(records) > MAX_RECORDS:
        raise ExportError(f"{WARMUP_FILE}: more than {MAX_RECORDS} records")
    for count, record in enumerate(records):
        log = prediction_log_pb2.PredictionLog()
        try:
            log.ParseFromString(record)
        except Exception as e:  # protobuf's DecodeError has no stable public base class
            raise ExportError(f"{WARMUP_FILE}: record {count} is not a PredictionLog") from e
        kind = log.WhichOneof("log_type")
        if kind != "predict_log":
            raise ExportError(f"{WARMUP_FILE}: record {count} is a {kind}; only predict_log "
                              "is served")
        yield count, log.predict_log.request


def run_warmup(version: ServableVersion) -> int:
    """Replays the version's warm-up requests; returns how many ran (0 without a file)."""
    path = os.path.join(version.path, WARMUP_FILE)
    if not os.path.exists(path):
        return 0
    ran = 0
    for index, request in _requests(path):
        try:
            sig = version.signature(request.model_spec.signature_name)
            inputs = decode_inputs(sig, request.inputs, version.limits.max_tensor_elements)
            version.predict(sig.name, inputs, batched=False)
        except Exception as e:
            raise ExportError(f"warm-up request {index} failed: {type(e).__name__}: {e}") from e
        ran += 1
    return ran


def batch_sizes(max_rows: int) -> list[int]:
    """The batch sizes worth a graph each: powers of two from 2 below ``max_rows``, then
    ``max_rows`` (a package pads a batch up to its power-of-two bucket)."""
    sizes, size = [], 2
    while size < max_rows:
        sizes.append(size)
        size *= 2
    return sizes + ([max_rows] if max_rows >= 2 else [])


def _row_sizes(sig: SignatureInfo, inputs: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """Each row's values across the signature's ragged groups (its history length)."""
    sizes = np.zeros(rows, np.int64)
    for group in sig.input_groups:
        sizes += np.diff(inputs[group.splits]).astype(np.int64)
    return sizes


def _one_row(sig: SignatureInfo, inputs: Mapping[str, np.ndarray], row: int) -> dict:
    """Row ``row`` of a validated request, as a request of its own."""
    out: dict[str, np.ndarray] = {}
    grouped = set()
    for group in sig.input_groups:
        splits = inputs[group.splits]
        start, stop = int(splits[row]), int(splits[row + 1])
        out[group.splits] = np.array([0, stop - start], splits.dtype)
        for name in group.values:
            out[name] = inputs[name][start:stop]
        grouped.update((group.splits, *group.values))
    for name, array in inputs.items():
        if name not in grouped:
            batch_major = sig.inputs[name].batch_major and array.ndim > 0
            out[name] = array[row:row + 1] if batch_major else array
    return out


def _longest_row(version: ServableVersion, path: str) -> PreparedRequest | None:
    """The file's longest row (by ragged length) of a batchable signature, as a request."""
    best, best_size = None, -1
    for _, request in _requests(path):
        sig = version.signature(request.model_spec.signature_name)
        prepared = version.prepare(sig.name, decode_inputs(
            sig, request.inputs, version.limits.max_tensor_elements))
        if prepared.merge_key is None or not prepared.rows:
            continue
        sizes = _row_sizes(sig, prepared.inputs, prepared.rows)
        row = int(sizes.argmax())
        if sizes[row] > best_size:
            best_size = int(sizes[row])
            best = prepare(sig, _one_row(sig, prepared.inputs, row))
    return best


class GraphCounts(NamedTuple):
    """The graphed packages of a version: whether there are any, their evictions so far,
    whether one gave up capturing, and whether one holds as many graphs as it may (its next
    new shape is captured only once seen again: ``graph_admission.h``)."""

    graphed: bool
    evictions: int
    failed: bool
    full: bool


def _graph_counts(version: ServableVersion) -> GraphCounts:
    stats = [s for s in packages_under(version.path).values() if s.get("graphs")]
    return GraphCounts(
        bool(stats), sum(int(s.get("evictions", 0)) for s in stats),
        any(bool(s.get("failure")) for s in stats),
        any(int(s.get("held", 0)) >= int(s.get("budget", 0)) > 0 for s in stats))


def warm_batch_sizes(version: ServableVersion, mode: str, max_batch_size: int | None,
                     graph_counts: Callable[[ServableVersion], GraphCounts]
                     = _graph_counts) -> int:
    """After ``run_warmup``: runs the file's longest row at each of ``batch_sizes`` up to the
    server's ``max_batch_size`` (None: batching off, only a keyed signature's one-row hit
    to warm); returns the calls run.
    A model fault fails the load as a warm-up request's does; running out of device memory
    or filling the graph budget at a size stops the warm-up there and keeps the version."""
    require(mode in WARMUP_BATCH_MODES, ConfigError,
            f"warmup_batches must be one of {WARMUP_BATCH_MODES}, got {mode!r}")
    path = os.path.join(version.path, WARMUP_FILE)
    if mode == "none" or not os.path.exists(path):
        return 0
    before = graph_counts(version)
    if mode == "auto" and not before.graphed:
        return 0
    row = _longest_row(version, path)
    if row is None:
        return 0
    sig = row.signature
    limit = min(max_batch_size or 1, sig.max_rows or max_batch_size or 1)
    rounds: list[bytes | None] = [None]
    calls, extra = 0, {"model": version.model_name, "version": version.version}
    if USER_KEY in sig.inputs:
        sent = row.inputs[USER_KEY][0]
        key = (sent if isinstance(sent, bytes) else str(sent).encode()) or WARMUP_USER_KEY
        keyed = prepare(sig, {**row.inputs, USER_KEY: np.array([key], object)})
        for what in ("stored under its user key", "read back as a hit"):
            try:   # the entry the hit rounds read, then the one-row hit's shape
                version.run(keyed)
            except Exception as e:
                raise ExportError(f"warm-up of the warm-up file's longest row, {what}, "
                                  f"failed: {type(e).__name__}: {e}") from e
            calls += 1
        rounds = [b"", key]   # a miss's shape (no key: computed, not kept), then a hit's
    if limit < 2:
        return calls
    for size in batch_sizes(limit):
        started = time.perf_counter()
        for key in rounds:
            tiled = merge_inputs([row] * size)
            if key is not None:
                tiled[USER_KEY] = np.full(size, key, object)
            try:
                version.run(prepare(sig, tiled))
            except CapacityError as e:
                LOG.warning("batch warm-up stopped: the device ran out of memory",
                            extra={**extra, "rows": size, "error": str(e)})
                return calls
            except Exception as e:
                raise ExportError(f"warm-up at {size} rows (the warm-up file's longest row, "
                                  f"repeated) failed: {type(e).__name__}: {e}") from e
            calls += 1
            now = graph_counts(version)
            if now.failed or now.full or now.evictions > before.evictions:
                LOG.warning("batch warm-up stopped: the package's CUDA graph budget is full "
                            "or a capture failed; larger batches run eagerly until seen often",
                            extra={**extra, "rows": size, "capture_failed": now.failed})
                return calls
        LOG.info("batch warm-up", extra={**extra, "rows": size,
                                         "seconds": round(time.perf_counter() - started, 3)})
    return calls
