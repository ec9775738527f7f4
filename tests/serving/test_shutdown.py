"""The watchdog that ends a stop which overran, and the exit that follows a clean stop."""

import logging
import threading
import time

from tf_frontend.serving.shutdown import (EXIT_CLEAN, EXIT_STOP_OVERRAN, ShutdownWatchdog,
                                          leave, watchdog_seconds)


class _Exits:
    def __init__(self):
        self.codes = []
        self.called = threading.Event()

    def __call__(self, code):
        self.codes.append(code)
        self.called.set()


def test_a_stop_that_overruns_is_ended_with_every_threads_stack(tmp_path, caplog):
    exits, trace = _Exits(), tmp_path / "stacks.txt"
    holder = threading.Event()
    held = threading.Thread(target=holder.wait, name="held-pool-worker", daemon=True)
    held.start()
    with open(trace, "w") as stream, caplog.at_level(logging.ERROR, logger="xgr.serving"):
        ShutdownWatchdog(0.2, exit_process=exits, stream=stream).arm()
        assert exits.called.wait(10)
    holder.set()
    assert exits.codes == [EXIT_STOP_OVERRAN]
    text = trace.read_text()
    assert "threads holding the stop" in text and "Thread 0x" in text
    assert "in wait" in text          # the held worker's frame is in the dump
    assert any("overran" in r.getMessage() for r in caplog.records)


def test_a_stop_that_finishes_in_time_is_left_alone():
    exits = _Exits()
    finished = ShutdownWatchdog(0.3, exit_process=exits).arm()
    finished.set()
    time.sleep(0.6)
    assert exits.codes == []


def test_leave_flushes_the_logs_then_exits_with_the_code(monkeypatch):
    exits, order = _Exits(), []
    # The real logging.shutdown would close the test runner's own handlers.
    monkeypatch.setattr(logging, "shutdown", lambda: order.append("logs flushed"))
    leave(EXIT_CLEAN, lambda code: (order.append(f"exit {code}"), exits(code)))
    assert order == ["logs flushed", "exit 0"] and exits.codes == [0]


def test_the_watchdog_allows_the_grace_and_time_to_unload():
    assert watchdog_seconds(10.0) == 20.0
    assert watchdog_seconds(0.0) == 10.0
    assert watchdog_seconds(60.0) == 90.0
