"""TF Serving's REST JSON formats <-> numpy arrays, checked against a signature.

Request: ``{"signature_name": ..., "instances": [...]}`` (row format: one entry per batch row,
an object naming the inputs or a bare value for a one-input signature) or
``{"inputs": {...}}`` (columnar: one value per input, or a bare value). Strings are JSON
strings or ``{"b64": "<base64>"}``. In the row format a ragged group is given per row as a
list of that row's events; its row-splits input is derived, not sent. In the columnar format
values and row splits are sent as they are.

Response: ``{"predictions": [...]}`` for the row format, ``{"outputs": ...}`` for the
columnar one. String outputs whose name ends in ``_bytes`` (or that are not UTF-8) are sent as
``{"b64": ...}``, as TF Serving does.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Mapping

import numpy as np

from xgr_common.errors import InvalidInputError, require
from tf_frontend.serving.signature import SignatureInfo, TensorInfo


# Deepest list nesting a JSON input may have: tensors of real requests have a few dimensions,
# and the flattening below recurses once per level.
MAX_NESTING = 32


def _string_leaf(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:   # a lone surrogate (\ud800) survives json.loads
            raise InvalidInputError(f"input {name!r}: a string is not valid Unicode "
                                    f"({e.reason} at character {e.start})") from None
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error as e:
            raise InvalidInputError(f"input {name!r}: invalid base64 in {{'b64': ...}}: {e}") from e
    raise InvalidInputError(f"input {name!r}: expected strings or {{'b64': ...}} objects, "
                            f"got {type(value).__name__} {str(value)[:40]}")


def _nested_shape(name: str, value: Any, leaf, depth: int = 0) -> tuple[list[int], list]:
    """Flattens a nested list, checking that every level is rectangular."""
    if not isinstance(value, list):
        return [], [leaf(name, value)]
    require(depth < MAX_NESTING, InvalidInputError,
            f"input {name!r}: lists nested deeper than {MAX_NESTING} levels")
    parts = [_nested_shape(name, v, leaf, depth + 1) for v in value]
    shapes = {tuple(s) for s, _ in parts}
    require(len(shapes) <= 1, InvalidInputError,
            f"input {name!r}: nested lists have different lengths (ragged); send a ragged "
            "input as values + row splits")
    inner = list(shapes.pop()) if shapes else []
    return [len(value)] + inner, [x for _, flat in parts for x in flat]


def _count_leaves(name: str, value: Any, limit: int) -> None:
    """Refuses a value of more than ``limit`` scalars before numpy builds it (iterative: the
    nesting depth is checked separately)."""
    count, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
            continue
        count += 1
        require(count <= limit, InvalidInputError,
                f"input {name!r}: more than {limit} values; at most {limit} are accepted per "
                "input (--max_tensor_elements)")


def _only_ints(value: Any) -> bool:
    """Whether every scalar in the nested list ``value`` is a JSON integer."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif not isinstance(item, int) or isinstance(item, bool):
            return False
    return True


def _not_numeric(name: str, info: TensorInfo, value: Any, raw: np.ndarray) -> str:
    """Why ``raw`` (numpy's reading of the JSON ``value``) is not ``info``'s dtype, said
    plainly: integers past int64 make numpy fall back to float64 or object arrays."""
    if raw.dtype.kind in "fO" and _only_ints(value):
        return f"input {name!r}: integers out of range for {info.dtype.name}"
    got = "non-numeric" if raw.dtype.kind in "OUS" else raw.dtype.name
    return f"input {name!r}: expected {info.dtype.name} values, got {got} data"


def to_array(name: str, value: Any, info: TensorInfo,
             max_elements: int | None = None) -> np.ndarray:
    """One JSON value -> array of ``info``'s dtype; InvalidInputError names the input."""
    if info.dtype.name == "string":
        shape, flat = _nested_shape(name, value, _string_leaf)
        require(max_elements is None or len(flat) <= max_elements, InvalidInputError,
                f"input {name!r}: {len(flat)} values; at most {max_elements} are accepted per "
                "input (--max_tensor_elements)")
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    depth, probe = 0, value
    while isinstance(probe, list) and probe:
        depth, probe = depth + 1, probe[0]
    require(depth <= MAX_NESTING, InvalidInputError,
            f"input {name!r}: lists nested deeper than {MAX_NESTING} levels")
    if max_elements is not None:
        _count_leaves(name, value, max_elements)
    try:
        raw = np.asarray(value)
    except RecursionError:   # deep nesting below a shallow first element: [[1], [[[...]]]]
        raise InvalidInputError(f"input {name!r}: lists nested deeper than {MAX_NESTING} "
                                "levels") from None
    except (ValueError, OverflowError) as e:
        raise InvalidInputError(f"input {name!r}: nested lists have different lengths (ragged); "
                                "send a ragged input as values + row splits") from e
    target = np.dtype(info.dtype.as_numpy_dtype)
    kind = raw.dtype.kind
    empty = raw.size == 0 and kind == "f"
    if target.kind in "iu":
        ok = kind in "iu" or empty
    elif target.kind in "fc":
        ok = kind in "iuf"
    elif target.kind == "b":
        ok = kind == "b" or empty
    else:
        ok = False
    require(ok, InvalidInputError, _not_numeric(name, info, value, raw))
    require(raw.ndim <= MAX_NESTING, InvalidInputError,
            f"input {name!r}: lists nested deeper than {MAX_NESTING} levels")
    if target.kind in "iu" and raw.size and not empty:
        limits = np.iinfo(target)
        require(int(raw.min()) >= limits.min and int(raw.max()) <= limits.max, InvalidInputError,
                f"input {name!r}: values out of range for {info.dtype.name}")
    return raw.astype(target)


def _refuse_unknown(sig: SignatureInfo, names) -> None:
    unknown = sorted(set(names) - set(sig.inputs))
    require(not unknown, InvalidInputError,
            f"signature {sig.name!r}: unknown input(s) {unknown}; expected {sorted(sig.inputs)}")


def _rows_to_arrays(sig: SignatureInfo, instances: list,
                    max_elements: int | None) -> dict[str, np.ndarray]:
    named = all(isinstance(i, dict) for i in instances)
    if not named:
        require(len(sig.inputs) == 1, InvalidInputError,
                f"'instances' must be objects naming the inputs: signature {sig.name!r} has "
                f"{len(sig.inputs)} inputs {sorted(sig.inputs)}")
        only = next(iter(sig.inputs))
        instances = [{only: i} for i in instances]
    names = set(instances[0])
    for index, instance in enumerate(instances):
        require(set(instance) == names, InvalidInputError,
                f"instance {index}: inputs {sorted(instance)} differ from instance 0 {sorted(names)}")
    _refuse_unknown(sig, names)
    arrays: dict[str, np.ndarray] = {}
    grouped = set()
    for group in sig.input_groups:
        require(group.splits not in names, InvalidInputError,
                f"input {group.splits!r}: in the 'instances' format row splits are derived from "
                f"each instance's {list(group.values)} lists; do not send them")
        lengths = None
        for value in group.values:
            if value not in names:
                continue
            rows = [i[value] for i in instances]
            require(all(isinstance(r, list) for r in rows), InvalidInputError,
                    f"input {value!r}: each instance must give a list of events")
            row_lengths = [len(r) for r in rows]
            require(lengths is None or row_lengths == lengths, InvalidInputError,
                    f"input {value!r}: per-instance lengths {row_lengths} differ from the other "
                    f"inputs of its group {lengths}")
            lengths = row_lengths
            arrays[value] = to_array(value, [x for r in rows for x in r], sig.inputs[value],
                                     max_elements)
        if lengths is not None:
            dtype = np.dtype(sig.inputs[group.splits].dtype.as_numpy_dtype)
            arrays[group.splits] = np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)
        grouped.update((group.splits, *group.values))
    for name in sorted(names - grouped):
        info = sig.inputs[name]
        require(info.batch_major, InvalidInputError,
                f"input {name!r} ({info.describe()}) has no batch dimension; use the columnar "
                "'inputs' format")
        arrays[name] = to_array(name, [i[name] for i in instances], info, max_elements)
    return arrays


def decode_request(sig: SignatureInfo, body: Mapping[str, Any], max_elements: int | None = None
                   ) -> tuple[dict[str, np.ndarray], bool]:
    """A parsed predict body -> (inputs, row_format); each input holds at most
    ``max_elements`` values (None: no limit)."""
    has_rows, has_cols = "instances" in body, "inputs" in body
    require(has_rows != has_cols, InvalidInputError,
            "the request must contain exactly one of 'instances' (row format) or 'inputs' "
            "(columnar format)")
    if has_rows:
        instances = body["instances"]
        require(isinstance(instances, list) and len(instances) > 0, InvalidInputError,
                "'instances' must be a non-empty list")
        return _rows_to_arrays(sig, instances, max_elements), True
    inputs = body["inputs"]
    if not isinstance(inputs, dict):
        require(len(sig.inputs) == 1, InvalidInputError,
                f"'inputs' must be an object naming the inputs: signature {sig.name!r} has "
                f"{len(sig.inputs)} inputs {sorted(sig.inputs)}")
        inputs = {next(iter(sig.inputs)): inputs}
    _refuse_unknown(sig, inputs)
    return {n: to_array(n, v, sig.inputs[n], max_elements) for n, v in inputs.items()}, False


def _jsonable(name: str, array: np.ndarray) -> Any:
    if array.dtype != object and array.dtype.kind not in "SU":
        return array.tolist()

    def leaf(x: bytes):
        if not name.endswith("_bytes"):
            try:
                return x.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(x).decode("ascii")}

    flat = np.empty(array.size, dtype=object)
    flat[:] = [leaf(x) for x in array.reshape(-1).tolist()]
    return flat.reshape(array.shape).tolist()


def encode_response(sig: SignatureInfo, outputs: Mapping[str, np.ndarray], row_format: bool,
                    rows: int | None) -> dict[str, Any]:
    if not row_format:
        if len(outputs) == 1:
            return {"outputs": _jsonable(*next(iter(outputs.items())))}
        return {"outputs": {n: _jsonable(n, a) for n, a in outputs.items()}}
    per_row: list[dict[str, Any]] = [{} for _ in range(rows or 0)]
    grouped = set()
    for group in sig.output_groups:
        splits = outputs[group.splits]
        grouped.update((group.splits, *group.values))
        for value in group.values:
            for i, row in enumerate(per_row):
                row[value] = _jsonable(value, outputs[value][splits[i]:splits[i + 1]])
    for name, array in outputs.items():
        if name in grouped:
            continue
        require(array.ndim >= 1 and array.shape[0] == rows, InvalidInputError,
                f"output {name!r} has shape {list(array.shape)} without the batch dimension "
                f"{rows}; use the columnar 'inputs' format")
        for i, value in enumerate(_jsonable(name, array)):
            per_row[i][name] = value
    if len(per_row) and len(per_row[0]) == 1:
        return {"predictions": [next(iter(r.values())) for r in per_row]}
    return {"predictions": per_row}
