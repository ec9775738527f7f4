"""A team's behaviour log as training examples: its requests run through the feature graph
(the same TF graph the SavedModel serves, so training sees exactly the prompts serving sees),
their next items as target code paths."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import torch
from tqdm.auto import tqdm

from bridge import to_torch
from xgr_common.errors import InvalidInputError, require
from xgr_common.layout import PAD_SEGMENT
from xgr_train.logs import Requests
from xgr_world.train import TrainingExamples

# Requests per feature-graph call: bounds the TF graph's memory on a large log.
CHUNK = 4096


def target_codes(item_ids: np.ndarray, item_codes: np.ndarray, targets: np.ndarray
                 ) -> np.ndarray:
    """Code paths ``[R, levels]`` int64 of ``targets`` (each must be a catalog item)."""
    order = np.argsort(item_ids)
    rows = order[np.clip(np.searchsorted(item_ids, targets, sorter=order), 0, len(order) - 1)]
    missing = np.flatnonzero(item_ids[rows] != targets)
    require(missing.size == 0, InvalidInputError,
            f"target item {int(targets[missing[0]]) if missing.size else 0} (request "
            f"{int(missing[0]) if missing.size else 0}) is not in the catalog")
    return item_codes[rows].astype(np.int64)


def _features(requests: Requests, rows: slice) -> dict[str, tf.Tensor]:
    f = requests.features
    splits = f["history_splits"][rows.start:rows.stop + 1]
    lo, hi = int(splits[0]), int(splits[-1])
    return {"user_id": tf.constant(f["user_id"][rows]),
            "country": tf.constant(f["country"][rows], tf.string),
            "history_items": tf.constant(f["history_items"][lo:hi]),
            "history_times": tf.constant(f["history_times"][lo:hi]),
            "history_splits": tf.constant(splits - lo),
            "request_time": tf.constant(f["request_time"][rows])}


def examples_of(graph, requests: Requests, item_ids: np.ndarray, item_codes: np.ndarray,
                pad_id: int, progress: bool = True) -> TrainingExamples:
    """``TrainingExamples`` of ``requests`` through ``graph`` (a feature graph over the
    catalog), in chunks of ``CHUNK`` requests; rows padded with ``pad_id``."""
    require(len(requests) > 0, InvalidInputError, "no training requests: the log holds no "
            "user with an event after another one among the catalog's items")
    codes = target_codes(item_ids, item_codes, requests.targets)
    parts = []
    for start in tqdm(range(0, len(requests), CHUNK), desc="prompts", unit="chunk",
                      disable=not progress, leave=False):
        out = graph(_features(requests, slice(start, min(start + CHUNK, len(requests)))))
        parts.append({name: to_torch(out[name]) for name in
                      ("token_ids", "lengths", "segment_ids", "profile_ids")})
    width = max(int(p["token_ids"].shape[1]) for p in parts)

    def padded(name: str, value) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(p[name], (0, width - p[name].shape[1]),
                                                  value=value) for p in parts])
    return TrainingExamples(
        token_ids=padded("token_ids", pad_id).long(),
        lengths=torch.cat([p["lengths"] for p in parts]).long(),
        segment_ids=padded("segment_ids", PAD_SEGMENT),
        profile_ids=torch.cat([p["profile_ids"] for p in parts]).long(),
        target_codes=torch.from_numpy(codes))
