"""Concatenates several requests into one model call and splits the outputs back.

Batch-major tensors are concatenated on axis 0. A ragged group (row splits ``int[B + 1]``
over values ``[E, ...]``) is merged by concatenating the values and shifting each request's
splits by the number of values before it; outputs are cut back the same way, so every
request receives exactly its own rows.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from tf_frontend.serving.signature import SignatureInfo
from tf_frontend.serving.validation import PreparedRequest


class UnsplittableOutput(Exception):
    """An output has no batch dimension matching the merged rows; run the requests alone."""


def merge_inputs(requests: Sequence[PreparedRequest]) -> dict[str, np.ndarray]:
    """Inputs of one model call serving all ``requests`` (same signature and merge key)."""
    sig = requests[0].signature
    merged: dict[str, np.ndarray] = {}
    splits_names = {g.splits for g in sig.input_groups}
    for name in sig.inputs:
        if name not in splits_names:
            merged[name] = np.concatenate([r.inputs[name] for r in requests], axis=0)
    for group in sig.input_groups:
        pieces, offset = [np.zeros(1, dtype=requests[0].inputs[group.splits].dtype)], 0
        for r in requests:
            splits = r.inputs[group.splits]
            pieces.append(splits[1:] + offset)
            offset += int(splits[-1])
        merged[group.splits] = np.concatenate(pieces)
    return merged


def _row_bounds(row_counts: Sequence[int]) -> list[tuple[int, int]]:
    ends = np.cumsum(row_counts).tolist()
    return list(zip([0] + ends[:-1], ends))


def split_outputs(sig: SignatureInfo, outputs: Mapping[str, np.ndarray],
                  row_counts: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cuts merged ``outputs`` into one dict per request with ``row_counts[i]`` rows each."""
    total = int(sum(row_counts))
    bounds = _row_bounds(row_counts)
    results: list[dict[str, np.ndarray]] = [{} for _ in row_counts]
    grouped = set()
    for group in sig.output_groups:
        splits = outputs[group.splits]
        if splits.ndim != 1 or splits.shape[0] != total + 1:
            raise UnsplittableOutput(f"output {group.splits!r} has shape {list(splits.shape)}, "
                                     f"expected [{total + 1}]")
        grouped.update((group.splits, *group.values))
        for result, (lo, hi) in zip(results, bounds):
            start, stop = int(splits[lo]), int(splits[hi])
            result[group.splits] = splits[lo:hi + 1] - splits[lo]
            for value in group.values:
                result[value] = outputs[value][start:stop]
    for name, array in outputs.items():
        if name in grouped:
            continue
        if array.ndim == 0 or array.shape[0] != total:
            raise UnsplittableOutput(f"output {name!r} has shape {list(array.shape)}, whose first "
                                     f"dim is not the merged batch size {total}")
        for result, (lo, hi) in zip(results, bounds):
            result[name] = array[lo:hi]
    return results
