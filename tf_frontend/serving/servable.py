"""One loaded version of a SavedModel: its signatures, limits, request gate, batcher, and the
calls that run a request.

A request is *admitted* first (``admit``: the version's bounded request queue; past it the
caller gets 503 / RESOURCE_EXHAUSTED), then validated (``prepare``), then either queued on the
version's batcher (``submit``: batching on and the signature batchable) or run directly
(``run``). A deadline travels with it: a request still queued when it passes is dropped, not
run. A model-side ``InvalidArgumentError`` (e.g. a custom op's ``OP_REQUIRES``) becomes
``InvalidInputError``; when it happens inside a merged batch, the batch's requests are re-run
one by one so only the request at fault receives the error. Every other model failure is the
server's (``ModelExecutionError``, 500), never the caller's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import logging
import os
import time
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from xgr_common.errors import (CapacityError, DeadlineExceededError, ExportError,
                               InvalidInputError, RequestCancelledError, ServingError)
from xgr_common.serving_names import SERVING_SIGNATURE
from custom_ops.torch_call import release_packages
from tf_frontend.serving.admission import AdmissionGate
from tf_frontend.serving.batch_merge import UnsplittableOutput, merge_inputs, split_outputs
from tf_frontend.serving.batching import BatchScheduler, BatchTask, SchedulerClosed
from tf_frontend.serving.config import DEFAULT_LIMITS, BatchingConfig, RequestLimits
from tf_frontend.serving.public_text import public_text
from tf_frontend.serving.signature import ServingSpec, SignatureInfo, describe_signature
from tf_frontend.serving.validation import PreparedRequest, prepare

LOG = logging.getLogger("xgr.serving")


class VersionRetired(ServingError):
    """The version was unloaded between its lookup and its admission; the caller looks the
    model up again (``ModelManager.admitted``) and gets the version that replaced it."""


class ModelExecutionError(ServingError):
    """The model failed on a request it accepted (not the caller's fault): HTTP 500 / INTERNAL.
    ``str()`` is the full detail (for the log); ``public`` what the caller may be told."""

    def __init__(self, detail: str, public: str):
        super().__init__(detail)
        self.public = public


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
    """A loaded ``<model_base_path>/<version>`` directory; thread-safe.

    ``limits`` are the server's flags; those it leaves unset come from the version's
    ``xgr_serving.json``, then the model's own attributes, then ``DEFAULT_LIMITS``.
    ``max_history_events`` / ``max_rows`` are shorthands for the same two flags.
    """

    def __init__(self, model_name: str, version: int, path: str,
                 batching: BatchingConfig | None, max_history_events: int | None = None,
                 observe_batch: Callable[[int, float], None] = lambda rows, seconds: None,
                 max_rows: int | None = None, *, limits: RequestLimits = RequestLimits(),
                 observe_drop: Callable[[str], None] = lambda reason: None,
                 observe_pending: Callable[[int], None] = lambda delta: None):
        self.model_name, self.version, self.path = model_name, version, path
        self.label = f"model {model_name!r} version {version}"
        try:
            self._loaded = tf.saved_model.load(path)
            self.signature_defs = _read_signature_defs(path)
        except (OSError, ValueError, tf.errors.OpError) as e:
            raise ExportError(f"cannot load the SavedModel of {self.label}: "
                              f"{public_text(str(e))}") from e
        spec = ServingSpec.read(path)
        flags = RequestLimits(max_rows=max_rows, max_history_events=max_history_events).over(limits)
        self.limits = flags.over(spec.limits).over(
            RequestLimits(max_history_events=_model_limit(self._loaded))).over(DEFAULT_LIMITS)
        self._functions = dict(self._loaded.signatures)
        if not self._functions:
            raise ExportError(f"the SavedModel of {self.label} has no signatures to serve")
        self.signatures: dict[str, SignatureInfo] = {
            name: describe_signature(name, fn, spec, self.limits.max_history_events,
                                     self.limits.max_rows)
            for name, fn in self._functions.items()}
        self._observe_batch, self._observe_drop = observe_batch, observe_drop
        self._gate = AdmissionGate(self.limits.max_pending_requests, self.label,
                                   on_change=observe_pending)
        self._retired = False
        self._scheduler = None if batching is None else BatchScheduler(
            batching, self._run_batch, name=f"{model_name}-{version}", on_drop=observe_drop)

    # -- request path -------------------------------------------------------------------------
    @property
    def batching(self) -> bool:
        return self._scheduler is not None

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """One place in this version's request queue for a ``with`` block; raises
        ``OverloadedError`` (503 / RESOURCE_EXHAUSTED) at once when the queue is full, and
        ``VersionRetired`` once the version has begun to unload."""
        with self._gate.admit():
            if self._retired:
                raise VersionRetired(f"{self.label} is unloading")
            yield

    def signature(self, name: str) -> SignatureInfo:
        name = name or SERVING_SIGNATURE
        if name not in self.signatures:
            raise InvalidInputError(f"signature {name!r} not found in {self.label}; "
                                    f"available: {sorted(self.signatures)}")
        return self.signatures[name]

    def prepare(self, signature_name: str, inputs: Mapping[str, np.ndarray],
                user_key: str | None = None) -> PreparedRequest:
        """Validates a decoded request against the signature (InvalidInputError on a mistake);
        ``user_key``: the one the transport carried (``validation.with_user_key``)."""
        return prepare(self.signature(signature_name), inputs, user_key)

    def submit(self, request: PreparedRequest,
               deadline: float | None = None) -> concurrent.futures.Future | None:
        """Queues ``request`` on the batcher and returns the future of its outputs, or None
        when it runs alone (batching off, an unbatchable signature, the version unloading):
        the caller then calls ``run``."""
        if self._scheduler is None or request.merge_key is None:
            return None
        try:
            return self._scheduler.submit(request, deadline)
        except SchedulerClosed:
            return None  # the version is being unloaded: the caller serves this last one itself

    def run(self, request: PreparedRequest, deadline: float | None = None) -> dict[str, np.ndarray]:
        """Runs ``request`` as its own model call, unless its deadline has passed already."""
        if deadline is not None and time.monotonic() >= deadline:
            self._observe_drop("deadline")
            raise DeadlineExceededError("the request's deadline passed before it ran; it was "
                                        "not run")
        return self._call(request.signature, request.inputs, request.rows or 1)

    def predict(self, signature_name: str, inputs: Mapping[str, np.ndarray],
                batched: bool = True, deadline: float | None = None,
                on_future: Callable[[concurrent.futures.Future], None] = lambda future: None
                ) -> tuple[SignatureInfo, dict[str, np.ndarray]]:
        """Admits, validates and runs one request in the calling thread (batched when allowed);
        returns its signature and outputs. ``on_future`` receives the batch future, so a caller
        can cancel it when its client goes away."""
        with self.admit():
            request = self.prepare(signature_name, inputs)
            return request.signature, self.wait(request, deadline, batched, on_future)

    def wait(self, request: PreparedRequest, deadline: float | None, batched: bool = True,
             on_future: Callable[[concurrent.futures.Future], None] = lambda future: None
             ) -> dict[str, np.ndarray]:
        """``submit`` (when ``batched``) or ``run``, waiting in this thread until ``deadline``."""
        future = self.submit(request, deadline) if batched else None
        if future is None:
            return self.run(request, deadline)
        on_future(future)
        try:
            return future.result(None if deadline is None
                                 else max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            future.cancel()  # still queued: dropped; already running: its answer is dropped
            raise DeadlineExceededError("the request's deadline passed while it waited for "
                                        "its batch") from None
        except concurrent.futures.CancelledError:
            raise RequestCancelledError("the request was cancelled before it ran") from None

    def _call(self, sig: SignatureInfo, inputs: Mapping[str, np.ndarray],
              rows: int) -> dict[str, np.ndarray]:
        """One model call of ``rows`` rows; its rows and wall time go to the metrics, failed
        or not (a failed call held the model as long)."""
        tensors = {n: tf.constant(a, dtype=sig.inputs[n].dtype) for n, a in inputs.items()}
        started = time.perf_counter()
        try:
            outputs = self._functions[sig.name](**tensors)
        except tf.errors.InvalidArgumentError as e:
            raise InvalidInputError(f"model rejected the request: {public_text(e.message)}") from e
        except tf.errors.ResourceExhaustedError as e:   # the device's memory: 503, retry later
            raise CapacityError("model ran out of memory on this request; retry later") from e
        except tf.errors.OpError as e:
            raise ModelExecutionError(
                f"{self.label} failed: {type(e).__name__}: {e.message}",
                f"{self.label} failed on this request ({type(e).__name__})") from e
        finally:
            self._observe_batch(rows, time.perf_counter() - started)
        return {n: t.numpy() for n, t in outputs.items()}

    def _run_batch(self, tasks: Sequence[BatchTask]) -> None:
        requests = [t.request for t in tasks]
        try:
            if len(tasks) == 1:
                results = [self._call(requests[0].signature, requests[0].inputs,
                                      requests[0].rows)]
            else:
                merged = self._call(requests[0].signature, merge_inputs(requests),
                                    sum(r.rows for r in requests))
                results = split_outputs(requests[0].signature, merged, [r.rows for r in requests])
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
                task.future.set_result(self._call(task.request.signature, task.request.inputs,
                                                  task.request.rows))
            except Exception as e:
                task.future.set_exception(e)

    # -- life cycle ---------------------------------------------------------------------------
    def unload(self, deadline: float, collect: bool = True) -> None:
        """Waits (until ``deadline``, ``time.monotonic``) for the requests it admitted, stops
        the batcher (which runs what is still queued until the deadline and refuses the rest
        with 503 / UNAVAILABLE), then lets go of the model so its
        memory can be freed; ``collect`` runs the garbage collector for it (a loaded
        SavedModel is a graph of reference cycles; a collection takes a while, which a
        process about to exit need not spend)."""
        self._retired = True
        if not self._gate.wait_idle(deadline):
            LOG.warning("unloading with requests still in flight",
                        extra={"model": self.model_name, "version": self.version,
                               "in_flight": self._gate.admitted})
        if self._scheduler is not None:
            refused = self._scheduler.close(deadline)
            if refused:
                LOG.warning("requests still queued at the deadline were refused",
                            extra={"model": self.model_name, "version": self.version,
                                   "refused": refused})
        self._functions, self._loaded = {}, None
        if collect:
            gc.collect()
        # TF's kernel cache keeps the unloaded functions' kernels, which hold their engine
        # packages: let those go, so the version's packages (weights, device memory, prompt
        # cache) are freed unless another loaded version runs them too.
        release_packages(self.path)
