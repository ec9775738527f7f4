"""Checks a request's tensors against its signature before any model work starts.

Every failure raises ``InvalidInputError`` naming the input and the rule, so one bad request
gets a 400 and never reaches (or poisons) a shared batch.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from xgr_common.errors import InvalidInputError, require
from xgr_common.serving_names import USER_KEY
from tf_frontend.serving.signature import SignatureInfo, TensorInfo


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedRequest:
    """A validated request.

    inputs: name -> array with exactly the signature's dtype (strings: object array of bytes).
    rows: the request's batch size B (None when the signature has no batch dimension).
    merge_key: requests with equal keys may share one model call.
    """

    signature: SignatureInfo
    inputs: Mapping[str, np.ndarray]
    rows: int | None
    merge_key: tuple | None


def numpy_dtype_matches(array: np.ndarray, info: TensorInfo) -> bool:
    if info.dtype.name == "string":
        return array.dtype == object or array.dtype.kind in "SU"
    return array.dtype == np.dtype(info.dtype.as_numpy_dtype)


def _check_shape(name: str, array: np.ndarray, info: TensorInfo) -> None:
    require(numpy_dtype_matches(array, info), InvalidInputError,
            f"input {name!r}: expected dtype {info.dtype.name}, got {array.dtype}")
    if info.shape is None:
        return
    require(array.ndim == len(info.shape), InvalidInputError,
            f"input {name!r}: expected rank {len(info.shape)} ({info.describe()}), "
            f"got shape {list(array.shape)}")
    for axis, (want, got) in enumerate(zip(info.shape, array.shape)):
        require(want is None or want == got, InvalidInputError,
                f"input {name!r}: expected dim {axis} = {want} ({info.describe()}), "
                f"got shape {list(array.shape)}")


def _check_splits(sig: SignatureInfo, inputs: Mapping[str, np.ndarray]) -> None:
    for group in sig.input_groups:
        splits = inputs[group.splits]
        require(splits.ndim == 1 and splits.size >= 1, InvalidInputError,
                f"input {group.splits!r}: row splits need shape [B + 1], got {list(splits.shape)}")
        require(int(splits[0]) == 0, InvalidInputError,
                f"input {group.splits!r}: row splits must start at 0, got {int(splits[0])}")
        lengths = np.diff(splits)
        require(bool(np.all(lengths >= 0)), InvalidInputError,
                f"input {group.splits!r}: row splits must be non-decreasing")
        for value in group.values:
            require(int(splits[-1]) == inputs[value].shape[0], InvalidInputError,
                    f"input {group.splits!r}: last row split {int(splits[-1])} must equal the "
                    f"length of {value!r} ({inputs[value].shape[0]})")
        limit = sig.max_history_events
        if limit is not None and lengths.size:
            longest = int(lengths.max())
            require(longest <= limit, InvalidInputError,
                    f"input {group.splits!r}: row {int(lengths.argmax())} has {longest} events; "
                    f"the maximum history length is {limit}")


def _rows(sig: SignatureInfo, inputs: Mapping[str, np.ndarray]) -> int | None:
    """The common batch size of the batch-major inputs and ragged groups among ``inputs``
    (those of a rank the signature allows; ``prepare`` checks the ranks)."""
    ragged = sig.ragged_input_names
    sizes = {n: a.shape[0] for n, a in inputs.items()
             if n in sig.inputs and n not in ragged and sig.inputs[n].batch_major and a.ndim}
    sizes.update({g.splits: inputs[g.splits].shape[0] - 1 for g in sig.input_groups
                  if g.splits in inputs and inputs[g.splits].ndim})
    if not sizes:
        return None
    require(len(set(sizes.values())) == 1, InvalidInputError,
            "inputs disagree on the batch size: "
            + ", ".join(f"{n}={b}" for n, b in sorted(sizes.items())))
    return next(iter(sizes.values()))


def with_defaults(sig: SignatureInfo, inputs: Mapping[str, np.ndarray]
                  ) -> Mapping[str, np.ndarray]:
    """``inputs`` with the inputs it leaves out that ``sig.defaults`` fills: a ragged group
    whose values all have defaults gets empty rows, a batch-major input its value per row.
    The batch size comes from the inputs that were sent; nothing is filled without one."""
    absent = [n for n in sig.defaults if n not in inputs]
    if not absent:
        return inputs
    filled = dict(inputs)
    rows = _rows_if_agreed(sig, inputs)
    if rows is None:
        return inputs
    for group in sig.input_groups:
        if group.splits not in inputs and all(v in absent for v in group.values):
            filled[group.splits] = np.zeros(rows + 1, sig.inputs[group.splits].dtype.as_numpy_dtype)
            for value in group.values:
                info = sig.inputs[value]
                tail = tuple(d or 0 for d in (info.shape or (None,))[1:])
                filled[value] = np.zeros((0, *tail), info.dtype.as_numpy_dtype)
    grouped = {n for g in sig.input_groups for n in (g.splits, *g.values)}
    for name in absent:
        info = sig.inputs[name]
        if name not in grouped and info.batch_major and info.shape is not None \
                and len(info.shape) == 1:
            filled[name] = np.full(rows, sig.defaults[name], info.dtype.as_numpy_dtype)
    return filled


def with_user_key(sig: SignatureInfo, inputs: Mapping[str, np.ndarray],
                  user_key: str | None) -> Mapping[str, np.ndarray]:
    """``inputs`` with ``USER_KEY`` filled from the transport's ``user_key`` (the REST header
    or gRPC metadata entry ``USER_KEY_HEADER``), the same key for every row, where ``sig``
    takes one and the body sent none. The key is only a hint to the engine's prompt cache
    (the cached content decides), so any string is taken as it is."""
    if not user_key or USER_KEY not in sig.inputs or USER_KEY in inputs:
        return inputs
    rows = _rows_if_agreed(sig, inputs)
    if rows is None:
        return inputs
    return {**inputs, USER_KEY: np.full(rows, user_key.encode("utf-8", "replace"), object)}


def _rows_if_agreed(sig: SignatureInfo, inputs: Mapping[str, np.ndarray]) -> int | None:
    """The batch size the inputs agree on, or None (none sent, or a disagreement, which
    ``prepare`` then names)."""
    try:
        return _rows(sig, inputs)
    except InvalidInputError:
        return None


def prepare(sig: SignatureInfo, inputs: Mapping[str, np.ndarray],
            user_key: str | None = None) -> PreparedRequest:
    """Validates ``inputs`` (already decoded to arrays) against ``sig``, after filling the
    user key the transport carried (``with_user_key``) and the inputs it may leave out
    (``with_defaults``)."""
    inputs = with_defaults(sig, with_user_key(sig, inputs, user_key))
    missing = sorted(set(sig.inputs) - set(inputs))
    require(not missing, InvalidInputError,
            f"signature {sig.name!r}: missing input(s) {missing}; expected "
            + ", ".join(f"{n}: {i.describe()}" for n, i in sig.inputs.items()))
    unknown = sorted(set(inputs) - set(sig.inputs))
    require(not unknown, InvalidInputError,
            f"signature {sig.name!r}: unknown input(s) {unknown}; expected {sorted(sig.inputs)}")
    for name, info in sig.inputs.items():
        _check_shape(name, inputs[name], info)
    _check_splits(sig, inputs)
    rows = _rows(sig, inputs)
    require(rows is None or sig.max_rows is None or rows <= sig.max_rows, InvalidInputError,
            f"signature {sig.name!r}: the request has {rows} rows; at most {sig.max_rows} are "
            f"served per request (the engine's largest batch, or --max_request_rows)")
    values = {n: _per_call_value(n, inputs[n]) for n in sig.per_call}
    key = None
    if sig.batchable and rows is not None:
        splits = {g.splits for g in sig.input_groups}
        key = (sig.name,) + tuple((n, inputs[n].shape[1:]) for n in sorted(inputs) if n not in splits)
        # Requests share a call only with equal per-call values.
        key += tuple(sorted(values.items()))
    return PreparedRequest(signature=sig, inputs=dict(inputs), rows=rows, merge_key=key)


def _per_call_value(name: str, array: np.ndarray):
    """The one value every row of a per-call input carries (None for no rows); refused when
    the rows disagree."""
    flat = array.reshape(-1)
    if flat.size == 0:
        return None
    distinct = np.unique(flat)
    require(distinct.size == 1, InvalidInputError,
            f"{name}: every row of one request must carry the same value (the model runs one "
            f"{name} per call; send rows with other values as their own requests), got "
            f"{distinct[:8].tolist()}")
    return distinct[0].item()
