"""One loaded version of a SavedModel: its signatures, its batcher, and ``predict``.

``predict`` validates a request, then either queues it on the version's batcher (when
batching is on and the signature is batchable) or calls the signature directly. A model-side
``InvalidArgumentError`` (e.g. a custom op's ``OP_REQUIRES``) becomes ``InvalidInputError``;
when it happens inside a merged batch, the batch's requests are re-run one by one so only the
request at fault receives the error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from xgr_common.errors import CapacityError, ExportError, InvalidInputError, ServingError
from xgr_common.serving_names import SERVING_SIGNATURE
from tf_frontend.serving.batch_merge import UnsplittableOutput, merge_inputs, split_outputs
from tf_frontend.serving.batching import BatchScheduler, BatchTask, SchedulerClosed
from tf_frontend.serving.config import BatchingConfig
from tf_frontend.serving.signature import ServingSpec, SignatureInfo, describe_signature
from tf_frontend.serving.validation import prepare

LOG = logging.getLogger("xgr.serving")


class ModelExecutionError(ServingError):
    """The model failed on a request it accepted (not the caller's fault): HTTP 500 / INTERNAL."""


def _model_limit(loaded) -> int | None:
    """A ``max_history_events`` the SavedModel carries as an attribute (int or scalar tensor)."""
    value = getattr(loaded, "max_history_events", None)
    if value is None:
        return None
    try:
        return int(value.numpy()) if hasattr(value, "numpy") else int(value)
    except (TypeError, ValueError):
        return None


def _read_signature_defs(path: str) -> meta_graph_pb2.SignatureDef:
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto.meta_graphs[0].signature_def


class ServableVersion:
    """A loaded ``<model_base_path>/<version>`` directory; thread-safe."""

    def __init__(self, model_name: str, version: int, path: str,
                 batching: BatchingConfig | None, max_history_events: int | None,
                 observe_batch: Callable[[int], None] = lambda rows: None,
                 max_rows: int | None = None):
        self.model_name, self.version, self.path = model_name, version, path
        try:
            self._loaded = tf.saved_model.load(path)
            self.signature_defs = _read_signature_defs(path)
        except (OSError, ValueError, tf.errors.OpError) as e:
            raise ExportError(f"cannot load SavedModel {path}: {e}") from e
        spec = ServingSpec.read(path)
        limit = max_history_events or spec.max_history_events or _model_limit(self._loaded)
        rows = max_rows or spec.max_rows
        self._functions = dict(self._loaded.signatures)
        if not self._functions:
            raise ExportError(f"SavedModel {path} has no signatures to serve")
        self.signatures: dict[str, SignatureInfo] = {
            name: describe_signature(name, fn, spec, limit, rows)
            for name, fn in self._functions.items()}
        self._observe_batch = observe_batch
        self._scheduler = None if batching is None else BatchScheduler(
            batching, self._run_batch, name=f"{model_name}-{version}")
        self._inflight = 0
        self._idle = threading.Condition()

    # -- request path -------------------------------------------------------------------------
    def signature(self, name: str) -> SignatureInfo:
        name = name or SERVING_SIGNATURE
        if name not in self.signatures:
            raise InvalidInputError(f"signature {name!r} not found in model {self.model_name!r} "
                                    f"version {self.version}; available: {sorted(self.signatures)}")
        return self.signatures[name]

    def predict(self, signature_name: str, inputs: Mapping[str, np.ndarray],
                batched: bool = True) -> tuple[SignatureInfo, dict[str, np.ndarray]]:
        """Runs one request; returns its signature and outputs (name -> array)."""
        request = prepare(self.signature(signature_name), inputs)
        with self._idle:
            self._inflight += 1
        try:
            if batched and self._scheduler is not None and request.merge_key is not None:
                try:
                    return request.signature, self._scheduler.submit(request).result()
                except SchedulerClosed:
                    pass  # the version is being unloaded: serve this last request directly
            self._observe_batch(request.rows or 1)
            return request.signature, self._call(request.signature, request.inputs)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _call(self, sig: SignatureInfo, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {n: tf.constant(a, dtype=sig.inputs[n].dtype) for n, a in inputs.items()}
        try:
            outputs = self._functions[sig.name](**tensors)
        except tf.errors.InvalidArgumentError as e:
            raise InvalidInputError(f"model rejected the request: {e.message}") from e
        except tf.errors.ResourceExhaustedError as e:   # the device's memory: 503, retry later
            raise CapacityError(f"model ran out of memory: {e.message}") from e
        except tf.errors.OpError as e:
            raise ModelExecutionError(f"model failed: {type(e).__name__}: {e.message}") from e
        return {n: t.numpy() for n, t in outputs.items()}

    def _run_batch(self, tasks: Sequence[BatchTask]) -> None:
        requests = [t.request for t in tasks]
        try:
            if len(tasks) == 1:
                results = [self._call(requests[0].signature, requests[0].inputs)]
            else:
                merged = self._call(requests[0].signature, merge_inputs(requests))
                results = split_outputs(requests[0].signature, merged, [r.rows for r in requests])
            self._observe_batch(sum(r.rows for r in requests))
        except (InvalidInputError, UnsplittableOutput) as e:
            if len(tasks) == 1:
                tasks[0].future.set_exception(e)
                return
            LOG.info("merged call failed; running its requests one by one",
                     extra={"model": self.model_name, "version": self.version,
                            "requests": len(tasks), "reason": str(e)})
            self._run_alone(tasks)
            return
        except Exception as e:  # a failure of the whole call reaches every caller
            for task in tasks:
                task.future.set_exception(e)
            return
        for task, result in zip(tasks, results):
            task.future.set_result(result)

    def _run_alone(self, tasks: Sequence[BatchTask]) -> None:
        for task in tasks:
            try:
                self._observe_batch(task.request.rows)
                task.future.set_result(self._call(task.request.signature, task.request.inputs))
            except Exception as e:
                task.future.set_exception(e)

    # -- life cycle ---------------------------------------------------------------------------
    def unload(self, timeout_s: float) -> None:
        """Waits (up to ``timeout_s``) for in-flight requests, then stops the batcher."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._inflight and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
        if self._scheduler is not None:
            self._scheduler.close()
