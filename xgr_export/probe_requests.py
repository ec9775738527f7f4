"""Requests drawn from a catalog: what export checks a feature graph with and what
``--verify_requests`` sends through the SavedModel and the in-process pipeline.

Varied on purpose: empty, short and over-long histories, unknown item ids, events outside the
history window, known and unknown context values, repeated events; and one request whose
history fills every slot the prompt has, so the longest prompt and the widest exclusion row the
graph can emit are among the requests checked.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from xgr_common.errors import ConfigError, require
from xgr_common.prompt_spec import PromptSpec

REQUEST_TIME = 1_750_000_000


def probe_features(item_ids: np.ndarray, spec: PromptSpec, count: int, seed: int = 0
                   ) -> dict[str, tf.Tensor]:
    """``count`` requests (``FeatureGraph``'s input dict) over catalog ``item_ids``: the first
    without history, the second (``count`` >= 2) with a full one (``full_history``), the
    rest random."""
    require(isinstance(count, int) and count >= 1, ConfigError,
            f"probe request count must be a positive int, got {count!r}")
    rng = np.random.default_rng(seed)
    item_ids = np.asarray(item_ids, np.int64)
    lengths = rng.integers(0, 2 * spec.max_history_items + 2, count)
    lengths[0] = 0                                       # one request without history
    total = int(lengths.sum())
    items = item_ids[rng.integers(0, len(item_ids), total)]
    unknown = rng.random(total) < 0.05
    items[unknown] = item_ids.max() + 1 + rng.integers(0, 1000, int(unknown.sum()))
    repeat = np.r_[False, rng.random(total - 1) < 0.1] if total else np.zeros(0, bool)
    items[repeat] = items[np.flatnonzero(repeat) - 1]
    splits = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    # Ages up to 1.2 windows: the oldest events fall outside it. Chronological per request.
    ages = rng.integers(0, int(spec.window_seconds * 1.2) + 1, total)
    times = np.empty(total, np.int64)
    for start, end in zip(splits[:-1], splits[1:]):
        times[start:end] = REQUEST_TIME - np.sort(ages[start:end])[::-1]
    if count >= 2:
        full_items, full_times = full_history(item_ids, spec, rng)
        start, end = splits[1], splits[2]
        items = np.concatenate([items[:start], full_items, items[end:]])
        times = np.concatenate([times[:start], full_times, times[end:]])
        lengths[1] = len(full_items)
        splits = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    countries = list(spec.context_vocab) + ["zz"]        # "zz": out of the vocabulary
    return {
        "user_id": tf.constant(rng.integers(1, 2**40, count), tf.int64),
        "country": tf.constant([countries[i] for i in rng.integers(0, len(countries), count)]),
        "history_items": tf.constant(items, tf.int64),
        "history_times": tf.constant(times, tf.int64),
        "history_splits": tf.constant(splits, tf.int64),
        "request_time": tf.constant(np.full(count, REQUEST_TIME, np.int64)),
    }


def full_history(item_ids: np.ndarray, spec: PromptSpec, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(items, times) of one history that keeps ``spec.max_history_items`` known items: no
    two neighbours equal (the cleaning keeps one of a run), every event inside the window, and
    for a version 2 prompt the long-term events spread over the closed blocks before the
    request's and the recent ones inside its block (more of each than the prompt keeps where the
    layout allows, so the cuts are exercised too)."""
    picks = rng.integers(0, len(item_ids), spec.max_history_items + 2)
    # Neighbours differ: a pick equal to its predecessor moves to the next catalog item.
    for k in range(1, len(picks)):
        if picks[k] == picks[k - 1]:
            picks[k] = (picks[k] + 1) % len(item_ids)
    items = item_ids[picks]
    if spec.prompt_v2 is None:
        steps = max(spec.window_seconds // (len(items) + 1), 1)
        times = REQUEST_TIME - steps * np.arange(len(items), 0, -1)
        return items, np.maximum(times, REQUEST_TIME - spec.window_seconds + 1).astype(np.int64)
    split = spec.prompt_v2.split
    block = split.block_seconds
    opened = REQUEST_TIME - REQUEST_TIME % block            # the request's block starts here
    # Long-term: the split keeps whole closed blocks while they fit, so the prompt's items fill
    # the newest closed block and one older event (two blocks back) is cut.
    newest = opened - block + np.arange(split.long_term_items) * block // max(
        split.long_term_items, 1)
    older = [opened - 2 * block] if split.long_term_blocks >= 2 else []
    long_times = np.concatenate([older, newest]).astype(np.int64)
    recent_count = len(items) - len(long_times)
    elapsed = max(REQUEST_TIME - opened, 0)
    recent_times = opened + np.arange(recent_count) * elapsed // max(recent_count - 1, 1)
    return items, np.concatenate([long_times, recent_times]).astype(np.int64)
