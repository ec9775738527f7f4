"""Hostile requests through the server's decoders, run in a child process
(``tests/fuzz_suite.py`` runs ``SURFACES[name]()``; ``python fuzz_decoders.py SURFACE...``
alone).

A crash in a decoder (an abort in TF's C++ under ``make_ndarray``, a segfault in numpy) would
kill this child, never the test session; faulthandler then prints where. Per surface, each
case must end in one of two ways:

* ``grpc``: a ``PredictRequest``'s tensors (random dtypes, declared shapes up to 2**62
  elements, values in any field, raw ``tensor_content``, unknown names) through
  ``tensor_proto.decode_inputs`` and the request checks: decoded within the element limit, or
  ``InvalidInputError``;
* ``rest``: a predict body (random JSON, raw bytes, deep nesting, lone surrogates, huge
  integers, either format) through the REST decoder and the request checks: the same.

Anything else (another exception type, an array past the limit) fails the run. The last line
per surface is ``surface NAME cases=N accepted=A refused=R``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st
from tensorflow.core.framework import tensor_pb2, types_pb2

from tf_frontend.serving.json_codec import decode_request
from tf_frontend.serving.rest import _parse_json
from tf_frontend.serving.signature import RaggedGroup, SignatureInfo, TensorInfo
from tf_frontend.serving.tensor_proto import decode_inputs
from tf_frontend.serving.validation import prepare
from xgr_common.errors import InvalidInputError

EXAMPLES = int(os.environ.get("XGR_FUZZ_EXAMPLES", "500"))
MAX_ELEMENTS = 1 << 16
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

_vec = lambda name, dtype: TensorInfo(name, dtype, (None,))  # noqa: E731
# The feature graph's serving signature, plus a float matrix input.
SIG = SignatureInfo(
    name="serving_default",
    inputs={"user_id": _vec("user_id", tf.int64), "country": _vec("country", tf.string),
            "history_items": _vec("history_items", tf.int64),
            "history_times": _vec("history_times", tf.int64),
            "history_splits": _vec("history_splits", tf.int64),
            "request_time": _vec("request_time", tf.int64),
            "dense": TensorInfo("dense", tf.float32, (None, 3))},
    outputs={"score": _vec("score", tf.float32)},
    input_groups=(RaggedGroup("history_splits", ("history_items", "history_times")),),
    output_groups=(), max_history_events=50, max_rows=64)
NAMES = sorted(SIG.inputs) + ["extra", ""]


class Tally:
    def __init__(self, surface: str):
        self.surface, self.cases, self.accepted, self.refused = surface, 0, 0, 0

    def check(self, work) -> None:
        self.cases += 1
        try:
            inputs = work()
        except InvalidInputError:
            self.refused += 1
            return
        for name, array in inputs.items():
            assert isinstance(array, np.ndarray) and array.size <= MAX_ELEMENTS, (name, array)
        self.accepted += 1

    def report(self) -> None:
        print(f"surface {self.surface} cases={self.cases} accepted={self.accepted} "
              f"refused={self.refused}", flush=True)


# -- JSON values, and a valid request to start from ----------------------------------------
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
                      st.sampled_from(["\ud800", "de", {"b64": "AA=="}, {"b64": "%%"}]))
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(NAMES + ["b64"]), inner,
                                                 max_size=3)), max_leaves=24)


@st.composite
def plausible_columns(draw, hostile: bool = True) -> dict:
    rows = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows))
    events = sum(lengths)
    body = {"user_id": list(range(rows)), "country": ["de"] * rows,
            "history_items": list(range(events)), "history_times": [0] * events,
            "history_splits": [int(x) for x in np.cumsum([0] + lengths)],
            "request_time": [5] * rows, "dense": [[0.5, 1.0, 2.0]] * rows}
    if hostile:
        for name in draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True)):
            body[name] = draw(JSON)                   # one or two inputs made hostile
    return body


# -- gRPC: TensorProtos ---------------------------------------------------------------------
_ALL_DTYPES = sorted(types_pb2.DataType.values())
_SCALAR_FIELDS = {  # field -> strategy of one value protobuf accepts there
    "float_val": st.floats(width=32, allow_nan=True), "double_val": st.floats(allow_nan=True),
    "int_val": st.integers(-(2**31), 2**31 - 1), "int64_val": st.integers(-(2**63), 2**63 - 1),
    "string_val": st.binary(max_size=6), "bool_val": st.booleans(),
    "half_val": st.integers(0, 2**16 - 1), "uint32_val": st.integers(0, 2**32 - 1),
    "uint64_val": st.integers(0, 2**64 - 1), "scomplex_val": st.floats(width=32),
    "dcomplex_val": st.floats(),
}
DIMS = st.lists(st.one_of(st.integers(0, 6), st.sampled_from([2**31, 2**40, 200_000_000, 2**62])),
                max_size=4)


@st.composite
def hostile_tensor(draw) -> tensor_pb2.TensorProto:
    proto = tensor_pb2.TensorProto()
    proto.dtype = draw(st.one_of(st.sampled_from(_ALL_DTYPES), st.integers(-3, 400)))
    if draw(st.integers(0, 9)) == 0:
        proto.tensor_shape.unknown_rank = True
    for size in draw(DIMS):
        proto.tensor_shape.dim.add().size = size
    for field in draw(st.lists(st.sampled_from(sorted(_SCALAR_FIELDS)), max_size=2, unique=True)):
        getattr(proto, field).extend(draw(st.lists(_SCALAR_FIELDS[field], max_size=8)))
    if draw(st.booleans()):
        proto.tensor_content = draw(st.binary(max_size=80))
    return proto


@st.composite
def plausible_tensor(draw, info: TensorInfo) -> tensor_pb2.TensorProto:
    """A well-formed proto of (usually) the right dtype, of random shape and values."""
    rows = draw(st.integers(0, 5))
    shape = (rows,) if info.dtype != tf.float32 else (rows, draw(st.sampled_from([3, 3, 2])))
    if info.dtype == tf.string:
        array = np.array(draw(st.lists(st.binary(max_size=4), min_size=rows, max_size=rows)),
                         dtype=object)
    elif info.dtype == tf.float32:
        array = np.array(draw(st.lists(st.floats(width=32), min_size=int(np.prod(shape)),
                                       max_size=int(np.prod(shape)))), np.float32).reshape(shape)
    else:
        array = np.array(draw(st.lists(st.integers(-3, 12), min_size=rows, max_size=rows)),
                         np.int64)
    dtype = draw(st.sampled_from([info.dtype] * 3 + [tf.int32, tf.float64]))
    if dtype != info.dtype and info.dtype != tf.string:
        with np.errstate(invalid="ignore"):
            array = array.astype(dtype.as_numpy_dtype)
    return tf.make_tensor_proto(array)


@st.composite
def grpc_inputs(draw) -> dict:
    """A valid request (a third of the time left whole) with some inputs replaced by
    plausible or hostile protos, dropped, or joined by unknown ones."""
    columns = draw(plausible_columns(hostile=False))
    inputs = {name: tf.make_tensor_proto(np.array(value, dtype=SIG.inputs[name].dtype.as_numpy_dtype
                                                  if name != "country" else object))
              for name, value in columns.items()}
    if draw(st.integers(0, 2)) == 0:
        return inputs
    for name in draw(st.lists(st.sampled_from(sorted(SIG.inputs)), min_size=1, max_size=3,
                              unique=True)):
        choice = draw(st.integers(0, 5))
        if choice == 0:
            del inputs[name]                           # missing
        else:
            inputs[name] = draw(hostile_tensor() if choice <= 3
                                else plausible_tensor(SIG.inputs[name]))
    for name in draw(st.lists(st.sampled_from(["extra", "", "x" * 300]), max_size=1)):
        inputs[name] = draw(hostile_tensor())
    return inputs


def grpc_surface() -> None:
    tally = Tally("grpc")

    @SETTINGS
    @given(grpc_inputs())
    def case(inputs):
        tally.check(lambda: prepare(SIG, decode_inputs(SIG, inputs, MAX_ELEMENTS)).inputs)

    case()
    tally.report()


@st.composite
def rest_body(draw) -> bytes:
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return draw(st.binary(max_size=40))
    if kind == 1:
        depth = draw(st.sampled_from([10, 31, 33, 70, 5000, 100_000]))
        return b'{"inputs": {"user_id": ' + b"[" * depth + b"1" + b"]" * depth + b"}}"
    if kind == 2:
        return json.dumps({"inputs": draw(JSON)}).encode()
    if kind == 3:
        return json.dumps({"instances": draw(st.lists(st.dictionaries(
            st.sampled_from(NAMES), JSON, max_size=4), max_size=3))}).encode()
    if kind == 4:
        return json.dumps({"signature_name": draw(JSON), "inputs": {}}).encode()
    body = json.dumps({"inputs": draw(plausible_columns())}).encode()
    if kind == 7:
        body = body[:draw(st.integers(0, len(body)))]  # cut short
    return body


def _rest_case(raw: bytes) -> dict:
    body = _parse_json(raw)
    name = body.get("signature_name", "")
    if not isinstance(name, str) or name not in ("", SIG.name):
        raise InvalidInputError("signature")          # what the servable answers for it
    inputs, _ = decode_request(SIG, body, MAX_ELEMENTS)
    return prepare(SIG, inputs).inputs


# -- REST: JSON bodies -----------------------------------------------------------------------
def rest_surface() -> None:
    tally = Tally("rest")

    @SETTINGS
    @given(rest_body())
    def case(raw):
        tally.check(lambda: _rest_case(raw))

    case()
    tally.report()


SURFACES = {"grpc": grpc_surface, "rest": rest_surface}

if __name__ == "__main__":
    faulthandler.enable()
    sys.setrecursionlimit(3000)   # the server's own (Python's default is 1000)
    for surface in sys.argv[1:] or sorted(SURFACES):
        SURFACES[surface]()
