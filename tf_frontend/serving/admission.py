"""The bounded request queue of one model version: requests admitted at once are counted,
and one past the limit is refused before any work (decoding, queueing, running).

Refusing at the door keeps overload from turning into memory and latency: a full server
answers 503 / RESOURCE_EXHAUSTED in microseconds instead of queueing work it will answer too
late. The count also tells an unloading version when its last request is done.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from xgr_common.errors import OverloadedError


class AdmissionGate:
    """``capacity`` places; ``on_change(delta)`` is told of each place taken (+1) and given
    back (-1), for a gauge of the queue's depth."""

    def __init__(self, capacity: int, what: str,
                 on_change: Callable[[int], None] = lambda delta: None):
        self._capacity, self._what, self._on_change = capacity, what, on_change
        self._count = 0
        self._cond = threading.Condition()

    @property
    def admitted(self) -> int:
        with self._cond:
            return self._count

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Holds one of the places for the duration of the ``with`` block; raises
        ``OverloadedError`` at once when all are taken."""
        with self._cond:
            if self._count >= self._capacity:
                raise OverloadedError(
                    f"{self._what} is at its limit of {self._capacity} pending requests "
                    f"(--max_pending_requests); retry later")
            self._count += 1
        self._on_change(1)
        try:
            yield
        finally:
            with self._cond:
                self._count -= 1
                self._cond.notify_all()
            self._on_change(-1)

    def wait_idle(self, deadline: float) -> bool:
        """Waits until no request is admitted or ``deadline`` (``time.monotonic``) passes;
        returns whether it became idle."""
        with self._cond:
            while self._count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True
