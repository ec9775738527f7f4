"""The end of a server process: a bounded stop, then an exit that nothing can hold.

``ModelServer.stop`` bounds its own waits by the shutdown grace, but the process can still be
held after it: by a thread that the interpreter joins at exit (a pool worker inside a model
call), or by library teardown (CUDA contexts, captured graphs, the engine package). An
orchestrator then waits out its own timeout and kills the server without a word. So the stop
runs under a watchdog, and the process leaves with ``os._exit`` once its logs are flushed:
the work that exit skips (the interpreter's finalisers) has nothing left to save.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, TextIO

LOG = logging.getLogger("xgr.serving")

EXIT_CLEAN = 0
EXIT_STOP_OVERRAN = 3   # distinct from absl's 1 (a usage error): the stop itself hung


@dataclass(frozen=True)
class ShutdownWatchdog:
    """Ends the process with ``EXIT_STOP_OVERRAN`` when a stop is still under way
    ``seconds`` after ``arm``; before that it logs an ERROR and writes every thread's stack to
    ``stream``, so the operator sees what held the stop."""

    seconds: float
    exit_process: Callable[[int], None] = os._exit
    stream: TextIO | None = None

    def arm(self) -> threading.Event:
        """Starts the countdown; setting the returned event (the stop finished) disarms it."""
        finished = threading.Event()
        threading.Thread(target=self._watch, args=(finished,), name="shutdown-watchdog",
                         daemon=True).start()
        return finished

    def _watch(self, finished: threading.Event) -> None:
        if finished.wait(self.seconds):
            return
        LOG.error("shutdown overran its deadline; exiting without finishing it",
                  extra={"deadline_seconds": self.seconds, "exit_code": EXIT_STOP_OVERRAN})
        stream = self.stream or sys.stderr
        stream.write("threads holding the stop:\n")
        stream.flush()
        try:
            faulthandler.dump_traceback(file=stream, all_threads=True)
        except (ValueError, OSError, AttributeError):  # a stream without a file descriptor
            pass
        leave(EXIT_STOP_OVERRAN, self.exit_process)


def leave(code: int, exit_process: Callable[[int], None] = os._exit) -> None:
    """Flushes logs and standard streams, then exits with ``code`` without the interpreter's
    teardown (which joins worker threads and runs library destructors, either of which can
    hang the process after its work is done)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (ValueError, OSError):
            pass
    exit_process(code)


def watchdog_seconds(grace_seconds: float) -> float:
    """How long a stop may take before the watchdog ends it: the grace, plus time to unload
    a large engine package and leave."""
    return grace_seconds + max(10.0, 0.5 * grace_seconds)
