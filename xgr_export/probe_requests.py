"""Requests drawn from a catalog: what export checks a feature graph with and what
``--verify_requests`` sends through the SavedModel and the in-process pipeline.

Varied on purpose: empty, short and over-long histories, unknown item ids, events outside the
history window, known and unknown context values, repeated events.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from xgr_common.errors import ConfigError, require
from xgr_common.prompt_spec import PromptSpec

REQUEST_TIME = 1_750_000_000


def probe_features(item_ids: np.ndarray, spec: PromptSpec, count: int, seed: int = 0
                   ) -> dict[str, tf.Tensor]:
    """``count`` requests (``FeatureGraph``'s input dict) over catalog ``item_ids``."""
    require(isinstance(count, int) and count >= 1, ConfigError,
            f"probe request count must be a positive int, got {count!r}")
    rng = np.random.default_rng(seed)
    item_ids = np.asarray(item_ids, np.int64)
    lengths = rng.integers(0, 2 * spec.keep_last + 2, count)
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
    countries = list(spec.context_vocab) + ["zz"]        # "zz": out of the vocabulary
    return {
        "user_id": tf.constant(rng.integers(1, 2**40, count), tf.int64),
        "country": tf.constant([countries[i] for i in rng.integers(0, len(countries), count)]),
        "history_items": tf.constant(items, tf.int64),
        "history_times": tf.constant(times, tf.int64),
        "history_splits": tf.constant(splits, tf.int64),
        "request_time": tf.constant(np.full(count, REQUEST_TIME, np.int64)),
    }
