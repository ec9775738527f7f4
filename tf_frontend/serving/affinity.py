"""Which replica serves a request: the user's own (consistent hashing of the user key, so the
replica that holds the user's cached long-term history keeps getting them), the least loaded
when that one is saturated, and never one that is drained after faults.

Pure Python, no network: ``xgr serve --replicas`` (``tf_frontend.serving.router``) asks
``ReplicaSet.choose`` and reports each answer's outcome back with ``ReplicaSet.done``.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from xgr_common.errors import ConfigError, require

# Points per replica on the ring: enough that each replica's share of the keys stays near
# 1 / N (about +-10% at 128) and a drain spreads its keys over all the others.
VIRTUAL_NODES = 128


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing of keys onto replica names: each replica at ``vnodes`` points of a
    64-bit ring; a key belongs to the first point at or after its hash. Adding or removing
    one of N replicas moves only about 1 / N of the keys."""

    def __init__(self, names: Sequence[str], vnodes: int = VIRTUAL_NODES):
        require(len(names) >= 1 and len(set(names)) == len(names), ConfigError,
                f"a hash ring needs distinct replica names, got {list(names)}")
        points = sorted((_point(f"{name}#{v}".encode()), name)
                        for name in names for v in range(vnodes))
        self._points = [p for p, _ in points]
        self._names = [n for _, n in points]

    def owners(self, key: bytes):
        """The replica names in ring order from ``key``'s point: its owner first, then where
        its requests go while the owner is drained (each name once)."""
        start = bisect.bisect_left(self._points, _point(key)) % len(self._points)
        seen = set()
        for i in range(len(self._names)):
            name = self._names[(start + i) % len(self._names)]
            if name not in seen:
                seen.add(name)
                yield name


@dataclass
class Replica:
    """One serving process: where it answers, what it is doing, whether it is drained."""

    name: str
    grpc_target: str
    rest_url: str
    in_flight: int = 0
    requests: int = 0
    failures: int = 0            # consecutive faults (reset by an answer)
    drained_until: float = 0.0   # monotonic time; 0: in service
    drains: int = 0
    fallbacks: int = 0           # requests of its keys sent elsewhere while it was saturated
    extra: dict = field(default_factory=dict)

    def drained(self, now: float) -> bool:
        return now < self.drained_until


@dataclass(frozen=True)
class AffinityConfig:
    """When a replica counts as saturated (``max_in_flight`` requests at once: its batcher's
    worth, after which the least loaded serves), when it is drained (``fail_threshold``
    faults in a row: no answer, or the server's own 5xx / UNAVAILABLE) and for how long
    before it is tried again (``drain_seconds``)."""

    max_in_flight: int = 32
    fail_threshold: int = 3
    drain_seconds: float = 10.0

    def __post_init__(self) -> None:
        require(self.max_in_flight >= 1 and self.fail_threshold >= 1
                and self.drain_seconds > 0, ConfigError,
                f"AffinityConfig needs max_in_flight >= 1, fail_threshold >= 1 and "
                f"drain_seconds > 0, got {self}")


class NoReplica(Exception):
    """Every replica is drained."""


class ReplicaSet:
    """The replicas behind one router and the rule that picks one per request (thread-safe)."""

    def __init__(self, replicas: Sequence[Replica], config: AffinityConfig = AffinityConfig(),
                 clock: Callable[[], float] = time.monotonic):
        self.replicas = {r.name: r for r in replicas}
        self.config, self._clock = config, clock
        self._ring = HashRing(list(self.replicas))
        self._lock = threading.Lock()

    def choose(self, key: bytes | None) -> Replica:
        """The replica for a request of user ``key`` (None: no key): the key's owner in
        service and not saturated; else the least loaded in service. Counts it in flight."""
        with self._lock:
            now = self._clock()
            live = [r for r in self.replicas.values() if not r.drained(now)]
            if not live:
                raise NoReplica("every replica is drained after faults; retry later")
            chosen = None
            if key:
                owner = next(self.replicas[n] for n in self._ring.owners(key)
                             if not self.replicas[n].drained(now))
                if owner.in_flight < self.config.max_in_flight:
                    chosen = owner
                else:
                    owner.fallbacks += 1
            if chosen is None:
                chosen = min(live, key=lambda r: (r.in_flight, r.requests))
            chosen.in_flight += 1
            chosen.requests += 1
            return chosen

    def owner(self, key: bytes) -> str:
        """The replica that owns ``key`` when every replica is in service."""
        return next(self._ring.owners(key))

    def done(self, replica: Replica, fault: bool) -> None:
        """Reports a request's end: ``fault`` when the replica gave no answer or its own
        5xx / UNAVAILABLE (a client's 4xx is an answer). After ``fail_threshold`` faults in
        a row the replica is drained for ``drain_seconds``."""
        with self._lock:
            replica.in_flight -= 1
            if not fault:
                replica.failures = 0
                return
            replica.failures += 1
            if replica.failures >= self.config.fail_threshold and \
                    not replica.drained(self._clock()):
                self._drain(replica)

    def drain(self, name: str) -> None:
        """Takes ``name`` out of service now (a failed health check, an operator)."""
        with self._lock:
            self._drain(self.replicas[name])

    def restore(self, name: str) -> None:
        """Puts ``name`` back in service (its health check answered)."""
        with self._lock:
            replica = self.replicas[name]
            replica.drained_until, replica.failures = 0.0, 0

    def _drain(self, replica: Replica) -> None:
        replica.drained_until = self._clock() + self.config.drain_seconds
        replica.drains += 1
        replica.failures = 0

    def snapshot(self) -> list[dict]:
        """Per replica: name, in flight, requests, fallbacks, drains, whether drained."""
        with self._lock:
            now = self._clock()
            return [{"name": r.name, "in_flight": r.in_flight, "requests": r.requests,
                     "fallbacks": r.fallbacks, "drains": r.drains, "drained": r.drained(now)}
                    for r in self.replicas.values()]
