"""What the server knows about one signature: tensor specs and which inputs are ragged.

Ragged inputs (a batch of variable-length histories) reach a signature as a flat ``values``
tensor ``[E, ...]`` plus a ``row_splits`` tensor ``int[B + 1]``. The batcher must offset the
splits when it concatenates requests and re-split outputs the same way, so it has to know
which tensors belong together. That pairing comes from, in order:

1. ``assets.extra/xgr_serving.json`` in the version directory::

       {"ragged": {"history_splits": ["history_items", "history_times"]},
        "max_history_events": 512}

   ``ragged`` maps a row-splits tensor to the value tensors it partitions; it applies to the
   inputs and outputs of every signature that has those names. ``defaults`` names inputs a
   request may leave out: a number fills a batch-major input (one value per row), ``[]`` a
   ragged group's values (every row empty, its splits all zero).
2. A naming convention when the file is absent: a rank-1 integer tensor named ``P_splits``
   or ``P_row_splits`` partitions every other tensor named ``P_*`` whose first dimension is
   unknown (``history_splits`` -> ``history_items``, ``history_times``).

A signature is *batchable* when every input is batch-major (first dim unknown) or part of a
ragged group and no output has a known non-batch leading shape; otherwise each request gets
its own model call.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping

import tensorflow as tf

from xgr_common.errors import ExportError, require
from xgr_common.serving_names import SERVING_SPEC_FILE
from tf_frontend.serving.config import RequestLimits

_SPLITS_SUFFIXES = ("_row_splits", "_splits")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One signature tensor. ``shape`` is None when the rank is unknown; dims may be None."""

    name: str
    dtype: tf.DType
    shape: tuple[int | None, ...] | None

    @property
    def batch_major(self) -> bool:
        return self.shape is not None and len(self.shape) >= 1 and self.shape[0] is None

    def describe(self) -> str:
        dims = "?" if self.shape is None else ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"


@dataclasses.dataclass(frozen=True)
class RaggedGroup:
    """``splits`` (int[B + 1]) partitions the first dimension of each of ``values``."""

    splits: str
    values: tuple[str, ...]


# Keys of ``xgr_serving.json``; the limits among them are RequestLimits fields.
_LIMIT_KEYS = tuple(field.name for field in dataclasses.fields(RequestLimits))
_SPEC_KEYS = {"ragged", "defaults", "per_call", *_LIMIT_KEYS}


@dataclasses.dataclass(frozen=True)
class ServingSpec:
    """The model's own serving hints (``assets.extra/xgr_serving.json``), or none.

    ragged: splits name -> the value names it partitions.
    defaults: input name -> the value a request that leaves it out gets (a number or a string
      per row, or ``()`` for a ragged value input: empty rows).
    limits: the request limits the model asks for (``RequestLimits``; server flags win):
      ``max_rows`` (the largest batch the model's engine accepts), ``max_history_events``,
      ``max_tensor_elements``, ``max_pending_requests``, ``rest_api_timeout_in_ms``.
    per_call: batch-major inputs whose value is one per model call (e.g. ``beam_width``: the
      model runs one width per call): every row of a request must carry the same value, and
      only requests with equal values share a call.
    """

    ragged: Mapping[str, tuple[str, ...]] | None = None
    limits: RequestLimits = RequestLimits()
    defaults: Mapping[str, int | float | str | tuple] = dataclasses.field(default_factory=dict)
    per_call: tuple[str, ...] = ()

    @property
    def max_history_events(self) -> int | None:
        return self.limits.max_history_events

    @property
    def max_rows(self) -> int | None:
        return self.limits.max_rows

    @classmethod
    def read(cls, version_dir: str) -> "ServingSpec":
        path = os.path.join(version_dir, SERVING_SPEC_FILE)
        if not os.path.exists(path):
            return cls()
        where = SERVING_SPEC_FILE   # what messages name: never the server's absolute path
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise ExportError(f"{where}: not readable JSON: {e}") from e
        require(isinstance(raw, dict), ExportError, f"{where}: expected a JSON object")
        unknown = sorted(set(raw) - _SPEC_KEYS)
        require(not unknown, ExportError,
                f"{where}: unknown key(s) {unknown}; known: {sorted(_SPEC_KEYS)}")
        ragged = raw.get("ragged")
        if ragged is not None:
            require(isinstance(ragged, dict) and all(
                isinstance(v, list) and all(isinstance(n, str) for n in v) for v in ragged.values()),
                ExportError, f"{where}: 'ragged' must map a splits name to a list of value names")
            ragged = {k: tuple(v) for k, v in ragged.items()}
        defaults = raw.get("defaults", {})
        require(isinstance(defaults, dict) and all(
            v == [] or isinstance(v, str) or (isinstance(v, (int, float))
                                              and not isinstance(v, bool))
            for v in defaults.values()), ExportError,
            f"{where}: 'defaults' must map an input name to a number, a string or []")
        defaults = {k: (() if v == [] else v) for k, v in defaults.items()}
        per_call = raw.get("per_call", [])
        require(isinstance(per_call, list) and all(isinstance(n, str) for n in per_call),
                ExportError, f"{where}: 'per_call' must be a list of input names")
        values = {key: raw.get(key) for key in _LIMIT_KEYS}
        for key, value in values.items():
            require(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                      and value >= 1), ExportError,
                    f"{where}: {key!r} must be a positive integer, got {value!r}")
        return cls(ragged=ragged, limits=RequestLimits(**values), defaults=defaults,
                   per_call=tuple(per_call))


@dataclasses.dataclass(frozen=True)
class SignatureInfo:
    name: str
    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]
    input_groups: tuple[RaggedGroup, ...]
    output_groups: tuple[RaggedGroup, ...]
    max_history_events: int | None
    max_rows: int | None = None
    # Inputs a request may leave out, and what they get (ServingSpec.defaults).
    defaults: Mapping[str, int | float | tuple] = dataclasses.field(default_factory=dict)
    # Inputs with one value per model call (ServingSpec.per_call).
    per_call: tuple[str, ...] = ()

    @property
    def ragged_input_names(self) -> frozenset[str]:
        return frozenset(n for g in self.input_groups for n in (g.splits, *g.values))

    @property
    def batchable(self) -> bool:
        """Inputs all batch-major or ragged, and no output statically without a batch dim (an
        output of unknown shape is checked per merged call, which falls back to single calls)."""
        ragged = self.ragged_input_names
        ragged_out = {n for g in self.output_groups for n in (g.splits, *g.values)}
        return bool(self.inputs) and all(
            info.batch_major or name in ragged for name, info in self.inputs.items()) and all(
            info.shape is None or info.batch_major or name in ragged_out
            for name, info in self.outputs.items())


def _tensor_info(name: str, spec) -> TensorInfo:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorInfo(name=name, dtype=tf.as_dtype(spec.dtype), shape=shape)


def _groups_by_convention(tensors: Mapping[str, TensorInfo]) -> tuple[RaggedGroup, ...]:
    groups = []
    splits_names = {n for n in tensors if n.endswith(_SPLITS_SUFFIXES)}
    for splits in sorted(splits_names):
        info = tensors[splits]
        if info.shape is None or len(info.shape) != 1 or not info.dtype.is_integer:
            continue
        prefix = splits[: -len(next(s for s in _SPLITS_SUFFIXES if splits.endswith(s)))] + "_"
        values = tuple(sorted(n for n, t in tensors.items()
                              if n.startswith(prefix) and n not in splits_names and t.batch_major))
        if values:
            groups.append(RaggedGroup(splits=splits, values=values))
    return tuple(groups)


def _groups_from_spec(tensors: Mapping[str, TensorInfo], ragged: Mapping[str, tuple[str, ...]],
                      signature: str) -> tuple[RaggedGroup, ...]:
    groups = []
    for splits, values in ragged.items():
        present = [n for n in (splits, *values) if n in tensors]
        if not present:
            continue
        require(len(present) == 1 + len(values), ExportError,
                f"signature {signature!r}: ragged group {splits!r} -> {list(values)} is only "
                f"partly present ({present})")
        groups.append(RaggedGroup(splits=splits, values=tuple(values)))
    return tuple(groups)


def describe_signature(name: str, function, spec: ServingSpec,
                       max_history_events: int | None,
                       max_rows: int | None = None) -> SignatureInfo:
    """Builds the SignatureInfo of a loaded ``ConcreteFunction`` (``loaded.signatures[name]``)."""
    _, kwargs = function.structured_input_signature
    inputs = {n: _tensor_info(n, s) for n, s in sorted(kwargs.items())}
    outputs = {n: _tensor_info(n, t) for n, t in sorted(function.structured_outputs.items())}
    if spec.ragged is not None:
        in_groups = _groups_from_spec(inputs, spec.ragged, name)
        out_groups = _groups_from_spec(outputs, spec.ragged, name)
    else:
        in_groups, out_groups = _groups_by_convention(inputs), _groups_by_convention(outputs)
    defaults = {n: v for n, v in spec.defaults.items() if n in inputs}
    grouped = {n for g in in_groups for n in g.values}
    for n, v in defaults.items():   # a ragged value's default is its rows left empty
        require((v == ()) == (n in grouped), ExportError,
                f"signature {name!r}: the default of {n!r} must be [] exactly when it is a "
                f"ragged value input")
        if v != ():
            text = inputs[n].dtype == tf.string
            require(isinstance(v, str) == text, ExportError,
                    f"signature {name!r}: the default of {n!r} must be a "
                    f"{'string' if text else 'number'} ({inputs[n].dtype.name} input), got "
                    f"{v!r}")
    per_call = tuple(n for n in spec.per_call if n in inputs)
    for n in per_call:
        info = inputs[n]
        require(n not in grouped and info.batch_major and info.shape is not None
                and len(info.shape) == 1, ExportError,
                f"signature {name!r}: per-call input {n!r} must be a 1-D batch-major input, got "
                f"{info.describe()}")
    return SignatureInfo(name=name, inputs=inputs, outputs=outputs, input_groups=in_groups,
                         output_groups=out_groups, max_history_events=max_history_events,
                         max_rows=max_rows, defaults=defaults, per_call=per_call)
