"""Batch merge/split, the batching parameters file and the batch queue, without a server."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from xgr_common.errors import (ConfigError, DeadlineExceededError, InvalidInputError,
                               OverloadedError, UnavailableError)
from tf_frontend.serving.batch_merge import UnsplittableOutput, merge_inputs, split_outputs
from tf_frontend.serving.batching import BatchScheduler
from tf_frontend.serving.config import BatchingConfig, parse_batching_parameters
from tf_frontend.serving.signature import RaggedGroup, SignatureInfo, TensorInfo
from tf_frontend.serving.validation import prepare


def _sig(max_history_events=None) -> SignatureInfo:
    vec = lambda n, d=tf.int64: TensorInfo(n, d, (None,))  # noqa: E731
    return SignatureInfo(
        name="serving_default",
        inputs={"ids": vec("ids"), "items": vec("items"), "splits": vec("splits"),
                "emb": TensorInfo("emb", tf.float32, (None, 2))},
        outputs={"out": vec("out"), "o_items": vec("o_items"), "o_splits": vec("o_splits")},
        input_groups=(RaggedGroup("splits", ("items",)),),
        output_groups=(RaggedGroup("o_splits", ("o_items",)),),
        max_history_events=max_history_events)


def _request(ids, rows_items):
    splits = np.concatenate([[0], np.cumsum([len(r) for r in rows_items])]).astype(np.int64)
    return {"ids": np.array(ids, np.int64), "splits": splits,
            "items": np.array([x for r in rows_items for x in r], np.int64),
            "emb": np.ones((len(ids), 2), np.float32) * np.array(ids, np.float32)[:, None]}


def test_merge_offsets_splits_and_split_returns_each_request_its_rows():
    sig = _sig()
    a = prepare(sig, _request([1, 2], [[5], [6, 7]]))
    b = prepare(sig, _request([3], [[]]))
    c = prepare(sig, _request([4, 5], [[8, 9, 10], [11]]))
    merged = merge_inputs([a, b, c])
    np.testing.assert_array_equal(merged["splits"], [0, 1, 3, 3, 6, 7])
    np.testing.assert_array_equal(merged["items"], [5, 6, 7, 8, 9, 10, 11])
    np.testing.assert_array_equal(merged["ids"], [1, 2, 3, 4, 5])
    # A model that echoes ids and keeps the history: outputs follow the merged rows.
    outputs = {"out": merged["ids"] * 10, "o_items": merged["items"], "o_splits": merged["splits"]}
    parts = split_outputs(sig, outputs, [2, 1, 2])
    np.testing.assert_array_equal(parts[0]["out"], [10, 20])
    np.testing.assert_array_equal(parts[1]["o_splits"], [0, 0])
    np.testing.assert_array_equal(parts[2]["o_items"], [8, 9, 10, 11])
    np.testing.assert_array_equal(parts[2]["o_splits"], [0, 3, 4])


def test_split_refuses_outputs_without_the_batch_dimension():
    sig = _sig()
    with pytest.raises(UnsplittableOutput, match="out"):
        split_outputs(sig, {"out": np.zeros(2), "o_items": np.zeros(0),
                            "o_splits": np.zeros(4, np.int64)}, [2, 1])


def test_validation_names_the_rule():
    with pytest.raises(InvalidInputError, match="maximum history length is 2"):
        prepare(_sig(max_history_events=2), _request([1], [[1, 2, 3]]))
    bad = _request([1, 2], [[1], [2]])
    bad["splits"] = np.array([0, 2, 1], np.int64)
    with pytest.raises(InvalidInputError, match="non-decreasing"):
        prepare(_sig(), bad)
    with pytest.raises(InvalidInputError, match="emb.*dim 1 = 2"):
        prepare(_sig(), dict(_request([1], [[1]]), emb=np.ones((1, 3), np.float32)))


def test_batching_parameters_file():
    config = parse_batching_parameters("""
        # TF Serving's format
        max_batch_size { value: 64 }
        batch_timeout_micros { value: 500 }
        pad_variable_length_inputs: true
        num_batch_threads { value: 3 }""")
    assert config == BatchingConfig(max_batch_size=64, batch_timeout_micros=500,
                                    max_enqueued_batches=100, num_batch_threads=3)
    with pytest.raises(ConfigError, match="unknown field 'max_batch'"):
        parse_batching_parameters("max_batch { value: 3 }")
    with pytest.raises(ConfigError, match="max_batch_size must be >= 1"):
        parse_batching_parameters("max_batch_size { value: 0 }")


def test_scheduler_fills_batches_in_order_and_refuses_when_full():
    sig = _sig()
    calls, started, release = [], threading.Event(), threading.Event()

    def run_batch(tasks):
        started.set()
        release.wait(10)
        calls.append([int(t.request.inputs["ids"][0]) for t in tasks])
        for t in tasks:
            t.future.set_result(t.request.inputs["ids"] * 2)

    scheduler = BatchScheduler(BatchingConfig(max_batch_size=4, batch_timeout_micros=1_000_000,
                                              max_enqueued_batches=2), run_batch, "unit")
    two_rows = lambda i: prepare(sig, _request([i, i], [[1], [2]]))  # noqa: E731
    try:
        futures = {1: scheduler.submit(two_rows(1)), 2: scheduler.submit(two_rows(2))}
        assert started.wait(10)  # batch [1, 2] is full and running; the thread is busy
        futures.update({i: scheduler.submit(two_rows(i)) for i in (3, 4)})
        futures[5] = scheduler.submit(prepare(sig, _request([5], [[7]])))
        futures[6] = scheduler.submit(two_rows(6))  # 7 of 8 queued rows
        with pytest.raises(OverloadedError, match="queue is full"):   # 503 / RESOURCE_EXHAUSTED
            scheduler.submit(two_rows(7))
        with pytest.raises(InvalidInputError, match="larger than max_batch_size"):
            scheduler.submit(prepare(sig, _request([1] * 5, [[]] * 5)))
        release.set()
        for i, future in futures.items():
            assert future.result(10).tolist() == [2 * i] * (1 if i == 5 else 2)
    finally:
        release.set()
        scheduler.close()
    assert calls == [[1, 2], [3, 4], [5, 6]]


def test_scheduler_drops_cancelled_and_expired_requests_before_their_batch_runs():
    sig = _sig()
    calls, dropped, started, release = [], [], threading.Event(), threading.Event()

    def run_batch(tasks):
        started.set()
        release.wait(10)
        calls.append([int(t.request.inputs["ids"][0]) for t in tasks])
        for t in tasks:
            t.future.set_result(t.request.inputs["ids"])

    scheduler = BatchScheduler(BatchingConfig(max_batch_size=4, batch_timeout_micros=50_000,
                                              max_enqueued_batches=4), run_batch, "unit",
                               on_drop=dropped.append)
    one = lambda i: prepare(sig, _request([i], [[i]]))  # noqa: E731
    try:
        first = scheduler.submit(one(1))
        assert started.wait(10)  # batch [1] runs; everything below waits in the queue
        cancelled = scheduler.submit(one(2))
        expired = scheduler.submit(one(3), deadline=time.monotonic() + 0.05)
        kept = scheduler.submit(one(4), deadline=time.monotonic() + 30)
        assert cancelled.cancel()
        time.sleep(0.1)
        release.set()
        assert kept.result(10).tolist() == [4] and first.result(10).tolist() == [1]
        with pytest.raises(DeadlineExceededError, match="not run"):
            expired.result(10)
        # A cancelled future no longer counts against the queue, and nothing it held ran.
        assert calls == [[1], [4]] and sorted(dropped) == ["cancelled", "deadline"]
    finally:
        release.set()
        scheduler.close()


def test_close_runs_the_queue_until_its_deadline_then_refuses_the_rest():
    sig = _sig()
    dropped, started, release = [], threading.Event(), threading.Event()

    def run_batch(tasks):
        started.set()
        release.wait(30)   # a model call far longer than the stop's grace
        for t in tasks:
            t.future.set_result(t.request.inputs["ids"])

    scheduler = BatchScheduler(BatchingConfig(max_batch_size=1, batch_timeout_micros=0,
                                              max_enqueued_batches=8, num_batch_threads=1),
                               run_batch, "unit", on_drop=dropped.append)
    one = lambda i: prepare(sig, _request([i], [[i]]))  # noqa: E731
    try:
        running = scheduler.submit(one(1))
        assert started.wait(10)
        queued = [scheduler.submit(one(i)) for i in (2, 3, 4)]
        queued[0].cancel()   # its caller left: dropped, not refused
        began = time.monotonic()
        refused = scheduler.close(deadline=began + 0.3)
        assert time.monotonic() - began < 5   # bounded by the deadline, not by the queue
        assert refused == 2 and sorted(dropped) == ["cancelled", "shutdown", "shutdown"]
        for future in queued[1:]:
            with pytest.raises(UnavailableError, match="stopping.*not run"):
                future.result(1)
        with pytest.raises(Exception, match="closed"):
            scheduler.submit(one(5))
    finally:
        release.set()
    assert running.result(10).tolist() == [1]   # the batch under way still answers its caller
