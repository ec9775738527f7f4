"""Which replica serves a request (``tf_frontend.serving.affinity``), with fake replicas and a
fake clock: a user's requests stay on one replica, the keys spread evenly and move little
when a replica goes, a saturated owner hands its requests to the least loaded, faults drain a
replica for a while and it comes back."""

from __future__ import annotations

import collections

import pytest

from tf_frontend.serving.affinity import (AffinityConfig, HashRing, NoReplica, Replica,
                                          ReplicaSet)
from xgr_common.errors import ConfigError


def _set(count: int, **config) -> tuple[ReplicaSet, list[float]]:
    clock = [0.0]
    replicas = [Replica(f"r{i}", f"host:{i}", f"http://host:{i}") for i in range(count)]
    return ReplicaSet(replicas, AffinityConfig(**config), clock=lambda: clock[0]), clock


KEYS = [f"user-{i}".encode() for i in range(4000)]


def test_a_users_requests_stay_on_one_replica_and_keys_spread_evenly():
    replicas, _ = _set(4)
    owners = {}
    for key in KEYS:
        chosen = replicas.choose(key)
        replicas.done(chosen, fault=False)
        assert owners.setdefault(key, chosen.name) == chosen.name == replicas.owner(key)
        again = replicas.choose(key)
        replicas.done(again, fault=False)
        assert again.name == chosen.name
    shares = collections.Counter(owners.values())
    assert set(shares) == {"r0", "r1", "r2", "r3"}
    assert max(shares.values()) < 1.5 * min(shares.values())


def test_removing_a_replica_moves_only_its_keys():
    four, three = HashRing(["r0", "r1", "r2", "r3"]), HashRing(["r0", "r1", "r2"])
    moved = [key for key in KEYS if next(four.owners(key)) != next(three.owners(key))]
    assert all(next(four.owners(key)) == "r3" for key in moved)
    assert 0.15 < len(moved) / len(KEYS) < 0.35       # about a quarter


def test_a_saturated_owner_hands_requests_to_the_least_loaded():
    replicas, _ = _set(3, max_in_flight=2)
    key = KEYS[0]
    owner = replicas.owner(key)
    held = [replicas.choose(key) for _ in range(2)]          # the owner's two slots
    assert {r.name for r in held} == {owner}
    other = replicas.choose(key)
    assert other.name != owner and replicas.replicas[owner].fallbacks == 1
    replicas.done(held[0], fault=False)
    assert replicas.choose(key).name == owner                 # room again: back to its owner


def test_faults_drain_a_replica_until_its_time_is_up():
    replicas, clock = _set(2, fail_threshold=2, drain_seconds=10.0)
    key = KEYS[1]
    owner = replicas.owner(key)
    for _ in range(2):
        replicas.done(replicas.choose(key), fault=True)
    assert replicas.replicas[owner].drains == 1
    moved = replicas.choose(key)
    assert moved.name != owner                                # drained: the next on the ring
    replicas.done(moved, fault=False)
    clock[0] = 10.5
    assert replicas.choose(key).name == owner                 # its time is up
    replicas.drain("r0")
    replicas.drain("r1")
    with pytest.raises(NoReplica):
        replicas.choose(key)
    replicas.restore(owner)
    assert replicas.choose(key).name == owner


def test_an_answer_resets_the_fault_count():
    replicas, _ = _set(2, fail_threshold=2)
    key = KEYS[2]
    for fault in (True, False, True, False):
        replicas.done(replicas.choose(key), fault=fault)
    assert all(r.drains == 0 for r in replicas.replicas.values())


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError):
        AffinityConfig(max_in_flight=0)
    with pytest.raises(ConfigError, match="distinct replica names"):
        HashRing(["a", "a"])
