"""The prompt-KV cache TorchCall's runtime keeps for a package exported with one
(``xgr_export.cached_package``), driven as a served SavedModel drives it: host inputs with the
version 2 feature graph's ``frozen_lengths`` and the users' keys, in a child process with TF
and custom_ops only. Every answer equals ``Engine.recommend`` without a cache; the counters
show misses, hits, appends and evictions; hostile frozen lengths are refused by name and cost
the next request nothing; a request without a key, or with another user's key, is never
served another user's entry."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.child_env import child_env
from tests.export.prompt_v2_rows import v2_rows
from tests.export.tiny_cached import BEAMS, TOP_K, export_tiny_cached
from xgr_common.errors import ConfigError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.tolerances import tolerance_for
from xgr_export import cached_package
from xgr_export.cached_package import PAGE_TOKENS, export_cached_engine
from xgr_export.config import EngineExportConfig
from xgr_export.torch_package import SIGNATURE_KEY

HERE = Path(__file__).resolve().parent
ATOL = tolerance_for(torch.float32).atol
pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def cached(tiny_cached_package):
    """The suite's CPU package of a tiny version 2 model with the cache, its engine and spec
    (``tests/export/tiny_cached.py``)."""
    return tiny_cached_package


def _key(name: str | None) -> np.ndarray:
    if name is None:
        return np.zeros(8, np.uint8)
    return np.frombuffer(name.encode().ljust(8, b"\0")[:8], np.uint8)


class Calls:
    """The calls one child makes: each a batch of users (their long-term and recent item
    counts over their own part of the catalog) and keys, with the reference answer."""

    def __init__(self, cached, device: str = "cpu"):
        _, self.engine, self.spec, ids, self.codes = cached
        self.arrays, self.count = {"atol": np.float64(ATOL)}, 0
        self.ids, self.device = ids, device

    def user_rows(self, users: list[tuple[int, int, int]]):
        """One prompt row per (user, long items, recent items): a user's items start at
        catalog row ``7 * user``, so users differ and one user's parts agree across calls."""
        rows = [v2_rows(self.spec, np.roll(self.codes, -7 * u, axis=0), [n], [m])
                for u, n, m in users]
        width = max(r.token_ids.shape[1] for r in rows)

        def stack(name, pad):
            return np.concatenate([
                np.pad(getattr(r, name).numpy(), ((0, 0), (0, width - r.token_ids.shape[1])),
                       constant_values=pad) for r in rows])
        return (stack("token_ids", self.spec.layout.pad_id), np.concatenate(
            [r.lengths.numpy() for r in rows]), stack("segment_ids", -1),
            np.concatenate([r.frozen_lengths.numpy() for r in rows]))

    def add(self, users, keys, frozen=None, refused=False) -> int:
        tokens, lengths, segments, own_frozen = self.user_rows(users)
        rows = len(users)
        gen = torch.Generator().manual_seed(self.count)
        embeds = torch.randn(rows, self.spec.profile_tokens, self.spec.model_hidden,
                             generator=gen)
        exclude = np.full((rows, 2), -1, np.int64)
        exclude[0, 0] = int(self.ids[3])
        i, a = self.count, self.arrays
        a[f"tokens_{i}"], a[f"lengths_{i}"], a[f"segments_{i}"] = tokens, lengths, segments
        a[f"embeds_{i}"], a[f"exclude_{i}"] = embeds.numpy(), exclude
        a[f"frozen_{i}"] = (own_frozen if frozen is None else np.array(frozen, np.int32))
        a[f"keys_{i}"] = np.stack([_key(k) for k in keys])
        if not refused:
            with torch.no_grad():
                on = [torch.from_numpy(x).to(self.device) for x in (tokens, lengths, segments)]
                items, scores = self.engine.recommend(
                    *on, BEAMS, TOP_K, prefix_embeds=embeds.to(self.device),
                    exclude_items=torch.from_numpy(exclude).to(self.device))
            a[f"want_items_{i}"] = items.cpu().numpy()
            a[f"want_scores_{i}"] = scores.cpu().numpy()
        self.count += 1
        return i

    def run(self, package: Path, folder: Path, budget: int, host_budget: int = 0,
            split_tokens: int | None = None) -> dict:
        self.arrays["calls"] = np.int64(self.count)
        requests = folder / f"requests_{budget}_{host_budget}.npz"
        np.savez(requests, **self.arrays)
        split = {} if split_tokens is None else {
            "XGR_PROMPT_CACHE_SPLIT_TOKENS": str(split_tokens)}
        done = subprocess.run(
            [sys.executable, str(HERE / "prompt_cache_child.py"), str(package), str(requests)],
            env=child_env(TF_CPP_MIN_LOG_LEVEL="3", XGR_PROMPT_CACHE_BYTES=str(budget),
                          XGR_PROMPT_CACHE_HOST_BYTES=str(host_budget), **split),
            capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


def test_hits_appends_keys_and_hostile_frozen_lengths(cached, tmp_path):
    package = cached[0]
    calls = Calls(cached)
    trio = [(0, 3, 2), (1, 2, 3), (2, 1, 1)]
    first = calls.add(trio, ["alice", "bob", "carol"])
    again = calls.add(trio, ["alice", "bob", "carol"])
    keyless = calls.add(trio, [None, None, None])
    others = calls.add(trio, ["mallory", "mallory", "mallory"])
    tokens, lengths, segments, frozen = calls.user_rows(trio)
    soft = int(np.nonzero(tokens[0] == calls.spec.layout.soft_id)[0][0])
    hostile = {"negative": [-1, 0, 0], "whole prompt": [int(lengths[0]), 0, 0],
               "soft marker": [soft + 1, 0, 0], "cut item": [int(frozen[0]) - 1, 0, 0]}
    refused = {name: calls.add(trio, ["alice", "bob", "carol"], value, refused=True)
               for name, value in hostile.items()}
    after = calls.add(trio, ["alice", "bob", "carol"])
    grown = calls.add([(0, 4, 2)], ["alice"])          # a block closed: one more item
    whole = calls.add([(0, 4, 1)], ["alice"])
    result = calls.run(package, tmp_path, 64 << 20)
    outcomes, stats = result["outcomes"], result["stats"]
    for i in (first, again, keyless, others, after, grown, whole):
        assert outcomes[i] == "ok", (i, outcomes[i])
    assert stats[first]["misses"] == 3 and stats[first]["hits"] == 0
    assert stats[again]["hits"] == 3 and stats[again]["tokens_reused"] == int(frozen.sum())
    # No key: no lookup, nothing kept. Another key: its own entries, never alice's.
    assert stats[keyless]["lookups"] == stats[again]["lookups"]
    assert stats[others]["misses"] == 6 and stats[others]["hits"] == 3
    for name, i in refused.items():
        kind, message = outcomes[i]
        assert kind == "InvalidArgumentError" and "frozen_lengths[0]" in message, (name, message)
    assert stats[refused["cut item"]] == stats[others]      # refused before any lookup
    assert stats[after]["hits"] == 6
    # The grown part finds the old one as its prefix and appends in place; then a whole hit.
    assert stats[grown]["partial_hits"] == 1 and stats[grown]["entries"] == stats[after]["entries"]
    assert stats[whole]["hits"] == stats[grown]["hits"] + 1
    assert stats[whole]["partial_hits"] == 1


def test_a_batch_of_hits_and_misses_runs_the_hits_apart(cached, tmp_path):
    """A run pads every row to its longest suffix. With a second run priced at nothing
    (``XGR_PROMPT_CACHE_SPLIT_TOKENS=0``), a batch of a returning user between two new ones
    runs as two sub-batches, the hit apart, and every row gets its own answer back in its
    place; a batch of new users alone (equal suffixes) is one run. At the default price these
    short prompts never split."""
    package = cached[0]
    calls = Calls(cached)
    first = calls.add([(0, 4, 1)], ["alice"])
    mixed = calls.add([(3, 4, 2), (0, 4, 1), (5, 4, 1)], ["dave", "alice", "erin"])
    fresh = calls.add([(7, 4, 2), (9, 4, 2)], ["frank", "grace"])
    split = calls.run(package, tmp_path, 64 << 20, split_tokens=0)
    assert split["outcomes"] == ["ok"] * 3
    stats = split["stats"]
    assert stats[first]["split_batches"] == 0
    assert stats[mixed]["split_batches"] == 1 and stats[mixed]["hits"] == 1
    assert stats[fresh]["split_batches"] == 1 and stats[fresh]["misses"] == 5
    default = calls.run(package, tmp_path, 64 << 20)
    assert default["outcomes"] == ["ok"] * 3 and default["stats"][-1]["split_batches"] == 0


def test_the_pool_stays_within_its_budget_and_evicts(cached, tmp_path):
    """24 users, each returning at once, then all again, in a pool of 6 one-page entries:
    every answer right, the pool never over its capacity, the least recently used entries
    evicted (so the second round misses), the immediate returns hit."""
    package = cached[0]
    calls = Calls(cached)
    users = [(u, 3, 2) for u in range(24)]
    for user in [u for user in users for u in (user, user)] + users:
        calls.add([user], [f"user{user[0]}"])
    page = 2 * 2 * 2 * 16 * PAGE_TOKENS * 4    # layers x (K, V) x KV heads x dim x tokens x fp32
    result = calls.run(package, tmp_path, 6 * page)
    assert result["outcomes"] == ["ok"] * 72
    final = result["stats"][-1]
    assert final["capacity_bytes"] == 6 * page
    assert all(s["bytes"] <= s["capacity_bytes"] for s in result["stats"])
    assert final["hits"] == 24 and final["misses"] == 48 and final["entries"] == 6
    assert final["evictions"] == 48 - 6
    assert final["host_hits"] == 0 and final["host_capacity_bytes"] == 0
    # Every kept call timed; no host tier, so nothing spilled or restored.
    assert final["calls"] == 72 and final["call_seconds"] > 0
    assert final["spills"] == 0 and final["spill_seconds"] == final["restore_seconds"] == 0


def test_the_host_tier_keeps_what_the_pool_evicts(cached, tmp_path):
    """12 users, each returning at once, then all again, in a pool of 6 one-page entries.
    With a host tier the pool evicts ahead of need, keeping one entry's page free after
    each call's planning (its spill overlaps the run on a GPU), so it holds 5 entries and
    the first round evicts 7. With a host tier that holds those 7, every user of the second
    round is a hit copied back from it (each copy evicting the pool's oldest ahead into the
    host tier); with a host tier of 4 entries, it drops its oldest for room. Every answer
    right, each tier within its budget."""
    package = cached[0]
    calls = Calls(cached)
    users = [(u, 3, 2) for u in range(12)]
    for user in [u for user in users for u in (user, user)] + users:
        calls.add([user], [f"user{user[0]}"])
    page = 2 * 2 * 2 * 16 * PAGE_TOKENS * 4
    assert int(calls.user_rows(users[:1])[3][0]) <= PAGE_TOKENS    # one page an entry
    # Host pages have the pool's geometry: an entry takes whole pages there too.
    roomy = calls.run(package, tmp_path, 6 * page, host_budget=7 * page)
    assert roomy["outcomes"] == ["ok"] * 36
    stats = roomy["stats"]
    assert all(s["bytes"] <= s["capacity_bytes"] and s["host_bytes"] <= s["host_capacity_bytes"]
               for s in stats)
    # One page kept free (or on its way out) after every call: 5 entries at most.
    assert max(s["bytes"] for s in stats) == 5 * page and max(s["entries"] for s in stats) == 5
    first_round = stats[23]
    assert first_round["host_entries"] == 7 and first_round["host_evictions"] == 0
    assert first_round["hits"] == 12 and first_round["host_hits"] == 0
    assert first_round["evictions"] == 7
    final = stats[-1]
    assert final["host_hits"] == 12 and final["hits"] == 24 and final["misses"] == 12
    assert final["evictions"] == 7 + 12 and final["host_entries"] == 7
    # Each eviction spilled (timed on the request's path), each host hit's copy back timed.
    assert final["spills"] == final["evictions"] and final["spill_seconds"] > 0
    assert final["restore_seconds"] > 0 and first_round["restore_seconds"] == 0
    tight = calls.run(package, tmp_path, 6 * page, host_budget=4 * page)
    assert tight["outcomes"] == ["ok"] * 36
    assert tight["stats"][23]["host_evictions"] == 3
    assert all(s["host_bytes"] <= 4 * page for s in tight["stats"])


@pytest.mark.gpu
def test_on_a_gpu_the_spills_copy_beside_the_runs(tmp_path):
    """The host tier's scenario above with a CUDA package: the spills' copies run on a stream
    of their own, and a spilled page is handed out, or a spilled entry read back, only once
    its copy is done. Every answer equals the engine's on the same device; the counts are the
    CPU's (the policy does not depend on when a copy finishes)."""
    cached = export_tiny_cached(tmp_path, "cuda:0")
    calls = Calls(cached, device="cuda:0")
    users = [(u, 3, 2) for u in range(12)]
    for user in [u for user in users for u in (user, user)] + users:
        calls.add([user], [f"user{user[0]}"])
    page = 2 * 2 * 2 * 16 * PAGE_TOKENS * 4
    # Beside a GPU the host memory is pinned in power-of-two chunks, so a budget of 7 pages
    # would keep one chunk of 4 and thrash; 8 pages hold the CPU scenario's 7 entries.
    roomy = calls.run(cached[0], tmp_path, 6 * page, host_budget=8 * page)
    assert roomy["outcomes"] == ["ok"] * 36
    final = roomy["stats"][-1]
    assert final["host_capacity_bytes"] == 8 * page
    assert final["host_hits"] == 12 and final["hits"] == 24 and final["misses"] == 12
    assert final["evictions"] == final["spills"] == 7 + 12
    assert max(s["bytes"] for s in roomy["stats"]) == 5 * page


def test_a_version_1_model_cannot_keep_a_cache(cached, tmp_path):
    _, engine, spec, _, _ = cached
    v1 = PromptSpec(model_hidden=spec.model_hidden, profile_tokens=2)
    with pytest.raises(ConfigError, match="version 2 prompt"):
        export_cached_engine(engine, v1, tmp_path / "v1.pt2", EngineExportConfig(BEAMS, TOP_K))


def test_a_pool_past_the_package_bound_is_refused_naming_its_flag(cached, tmp_path):
    """A budget of more pages than the package takes (and than any device holds): every call
    is refused, before any allocation, with an error that names the pool's size, the bound and
    the flag that sets it; nothing aborts the process."""
    calls = Calls(cached)
    for user in range(2):
        calls.add([(user, 3, 2)], [f"user{user}"], refused=True)
    result = calls.run(cached[0], tmp_path, 1 << 52)
    for outcome in result["outcomes"]:
        assert outcome[0] == "FailedPreconditionError", outcome
        assert "prompt-KV pool of 4194304 GiB" in outcome[1] and "--prompt_cache_gb" in outcome[1]
        assert f"at most {cached_package.MAX_POOL_PAGES} pages" in outcome[1], outcome


def _without_the_pool_bound(package: Path, out: Path) -> Path:
    """A copy of ``package`` whose calling contract leaves the pool's pages unbounded, as a
    package exported before the bound existed states it (``torch.export``'s largest int for
    a dimension without an upper bound); the runtime reads only the contract."""
    unbounded = f"\\1 {(1 << 63) - 2}"
    with zipfile.ZipFile(package) as source, zipfile.ZipFile(out, "w") as copy:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("_metadata.json"):
                metadata = json.loads(data)
                signature, count = re.subn(rf"^(dim \S+ \d+) {cached_package.MAX_POOL_PAGES}$",
                                           unbounded, metadata[SIGNATURE_KEY], flags=re.M)
                assert count == 1, metadata[SIGNATURE_KEY]
                data = json.dumps({**metadata, SIGNATURE_KEY: signature}).encode()
            copy.writestr(info, data)
    return out


def test_a_package_without_a_pool_bound_takes_no_pool_past_32_bit_indexing(cached, tmp_path):
    """A package exported before the pool's pages had an upper bound indexes the pool in 32
    bits: a pool past 2**31 elements is refused by name (it would be written out of bounds),
    one under it serves."""
    old = _without_the_pool_bound(cached[0], tmp_path / "unbounded.pt2")
    calls = Calls(cached)
    calls.add([(0, 3, 2)], ["user0"], refused=True)
    refused = calls.run(old, tmp_path, 16 << 30)     # 2**32 fp32 elements
    outcome = refused["outcomes"][0]
    assert outcome[0] == "FailedPreconditionError", outcome
    assert "without an upper bound on the pool's pages" in outcome[1], outcome
    assert "re-export" in outcome[1] and "--prompt_cache_gb" in outcome[1], outcome
    calls = Calls(cached)
    calls.add([(0, 3, 2)], ["user0"])
    assert calls.run(old, tmp_path, 64 << 20)["outcomes"] == ["ok"]
