"""Batches for ``ctr_tf_keras``'s models, importable from any process (numpy only)."""

from __future__ import annotations

import numpy as np

from ctr_keras3 import VOCAB


def multi_tower_batches(count: int = 2, rows: int = 5, seed: int = 0) -> list[dict]:
    """user_ids [rows, 3] and item_ids [rows, 2], int32 ids into the shared embedding."""
    rng = np.random.default_rng(seed)
    return [{"user_ids": rng.integers(0, VOCAB, (rows, 3)).astype(np.int32),
             "item_ids": rng.integers(0, VOCAB, (rows, 2)).astype(np.int32)}
            for _ in range(count)]
