"""A shared batch queue with TF Serving's knobs (max_batch_size, batch_timeout_micros,
max_enqueued_batches, num_batch_threads).

Requests wait in one queue; a batch thread takes the oldest request and, until the batch
holds ``max_batch_size`` rows or the oldest request has waited ``batch_timeout_micros``,
adds every queued request with the same merge key (same signature, same non-batch dims).
The batch then runs as one model call through ``run_batch``, which resolves each request's
future with its own result or error.

A request whose caller gave up (its future cancelled: a cancelled gRPC call, a closed REST
connection, a REST timeout) or whose deadline passed is taken out of the queue and out of its
batch before the batch runs: the model never spends time on an answer nobody reads.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable, Sequence

from xgr_common.errors import (DeadlineExceededError, InvalidInputError, OverloadedError,
                               ServingError, UnavailableError, require)
from tf_frontend.serving.config import BatchingConfig
from tf_frontend.serving.validation import PreparedRequest


@dataclasses.dataclass(eq=False)  # identity equality: the queue removes tasks by identity
class BatchTask:
    """A queued request and the future its caller waits on."""

    request: PreparedRequest
    future: concurrent.futures.Future
    enqueued_at: float
    deadline: float | None = None   # time.monotonic(); None: the caller waits as long as it takes

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


class SchedulerClosed(ServingError):
    """The scheduler is closing (its version is unloading); the caller runs the request itself."""


class BatchScheduler:
    def __init__(self, config: BatchingConfig,
                 run_batch: Callable[[Sequence[BatchTask]], None], name: str,
                 on_drop: Callable[[str], None] = lambda reason: None):
        self._config = config
        self._run_batch = run_batch
        self._on_drop = on_drop
        self._queue: collections.deque[BatchTask] = collections.deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._closing = False
        self._threads = [threading.Thread(target=self._loop, name=f"batch-{name}-{i}", daemon=True)
                         for i in range(config.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, request: PreparedRequest,
               deadline: float | None = None) -> concurrent.futures.Future:
        """Queues ``request``; the future resolves to its output dict. Cancelling the future
        while the request waits drops it; so does ``deadline`` (``time.monotonic``) passing."""
        rows = request.rows
        require(rows is not None and rows <= self._config.max_batch_size, InvalidInputError,
                f"batch of {rows} rows is larger than max_batch_size "
                f"{self._config.max_batch_size}")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the batch queue of this model version is closed")
            self._purge(time.monotonic())
            if self._queued_rows + rows > self._config.max_enqueued_rows:
                raise OverloadedError(
                    f"the batch queue is full ({self._config.max_enqueued_batches} batches of "
                    f"{self._config.max_batch_size} rows); retry later")
            self._queue.append(BatchTask(request, future, time.monotonic(), deadline))
            self._queued_rows += rows
            self._cond.notify_all()
        return future

    def _drop(self, task: BatchTask, now: float) -> bool:
        """Resolves a task nobody waits for any more (cancelled, or past its deadline);
        returns whether it was dropped."""
        if task.future.cancelled():
            self._on_drop("cancelled")
            return True
        if task.expired(now):
            if task.future.set_running_or_notify_cancel():
                task.future.set_exception(DeadlineExceededError(
                    f"the request's deadline passed after {now - task.enqueued_at:.3f} s in the "
                    "batch queue; it was not run"))
                self._on_drop("deadline")
            else:
                self._on_drop("cancelled")
            return True
        return False

    def _purge(self, now: float) -> None:
        """Takes dropped tasks out of the queue (under the lock)."""
        if not any(t.future.cancelled() or t.expired(now) for t in self._queue):
            return
        kept: collections.deque[BatchTask] = collections.deque()
        for task in self._queue:
            if self._drop(task, now):
                self._queued_rows -= task.request.rows
            else:
                kept.append(task)
        self._queue = kept

    def _take_compatible(self, batch: list[BatchTask], rows: int) -> int:
        key = batch[0].request.merge_key
        for task in list(self._queue):
            if rows >= self._config.max_batch_size:
                break
            if task.request.merge_key == key and rows + task.request.rows <= self._config.max_batch_size:
                self._queue.remove(task)
                self._queued_rows -= task.request.rows
                batch.append(task)
                rows += task.request.rows
        return rows

    def _next_batch(self) -> list[BatchTask] | None:
        timeout = self._config.batch_timeout_micros / 1e6
        with self._cond:
            while True:
                self._purge(time.monotonic())
                if self._queue or self._closing:
                    break
                self._cond.wait()
            if not self._queue:
                return None
            head = self._queue.popleft()
            self._queued_rows -= head.request.rows
            batch, rows = [head], head.request.rows
            deadline = head.enqueued_at + timeout
            while True:
                self._purge(time.monotonic())
                rows = self._take_compatible(batch, rows)
                remaining = deadline - time.monotonic()
                if rows >= self._config.max_batch_size or remaining <= 0 or self._closing:
                    return batch
                self._cond.wait(remaining)

    def _runnable(self, batch: list[BatchTask]) -> list[BatchTask]:
        """The tasks of ``batch`` still wanted, each marked running (a future cancelled from
        now on is no longer dropped: its call is under way)."""
        now, live = time.monotonic(), []
        for task in batch:
            if self._drop(task, now):
                continue
            if task.future.set_running_or_notify_cancel():
                live.append(task)
            else:   # cancelled since the check above
                self._on_drop("cancelled")
        return live

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            batch = self._runnable(batch)
            if not batch:
                continue
            try:
                self._run_batch(batch)
            except BaseException as e:  # never leave a caller waiting forever
                for task in batch:
                    if not task.future.done():
                        task.future.set_exception(e)

    def close(self, deadline: float | None = None) -> int:
        """Refuses new requests and runs what is already queued until ``deadline``
        (``time.monotonic``; None: as long as it takes). What is still queued then is answered
        ``UnavailableError`` without running, and a batch still running is not waited for (its
        thread is a daemon): a stop must end within its grace however long the queue.
        Returns how many requests were refused so."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._cond:   # a thread still running finds the queue empty and ends
            left, self._queue, self._queued_rows = list(self._queue), collections.deque(), 0
        refused = 0
        for task in left:
            if not task.future.set_running_or_notify_cancel():
                self._on_drop("cancelled")
                continue
            task.future.set_exception(UnavailableError(
                "the server is stopping: the request was still queued when the shutdown grace "
                "ended and was not run; retry"))
            refused += 1
            self._on_drop("shutdown")
        return refused
