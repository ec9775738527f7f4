"""gRPC request tensors (``TensorProto``) -> numpy arrays, checked before anything is
materialised.

``tf.make_ndarray`` trusts what a proto declares: a 14-byte proto declaring 200M elements and
one value fills 1.6 GB; three values for shape [2] fail with "negative values"; a
``DT_RESOURCE`` tensor fails with a ``KeyError``. So the names, dtype, shape, element count
and value count are checked first, each failure an ``InvalidInputError`` naming the input and
the rule, and only a proto that passes is converted.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from xgr_common.errors import InvalidInputError, require
from tf_frontend.serving.signature import SignatureInfo, TensorInfo

# The TensorProto field that carries each dtype's values, and how many numbers per element.
_VALUE_FIELD = {
    tf.float16: ("half_val", 1), tf.bfloat16: ("half_val", 1), tf.float32: ("float_val", 1),
    tf.float64: ("double_val", 1), tf.int32: ("int_val", 1), tf.int16: ("int_val", 1),
    tf.int8: ("int_val", 1), tf.uint16: ("int_val", 1), tf.uint8: ("int_val", 1),
    tf.string: ("string_val", 1), tf.complex64: ("scomplex_val", 2),
    tf.complex128: ("dcomplex_val", 2), tf.int64: ("int64_val", 1), tf.bool: ("bool_val", 1),
    tf.uint32: ("uint32_val", 1), tf.uint64: ("uint64_val", 1),
}
_ALL_VALUE_FIELDS = tuple(f.name for f in tensor_pb2.TensorProto.DESCRIPTOR.fields
                          if f.name.endswith("_val"))


def _dtype(name: str, proto: tensor_pb2.TensorProto, info: TensorInfo) -> tf.DType:
    try:
        dtype = tf.as_dtype(proto.dtype)
    except (TypeError, ValueError):
        raise InvalidInputError(f"input {name!r}: TensorProto dtype {proto.dtype} is not a "
                                f"TensorFlow dtype; expected {info.dtype.name}") from None
    require(dtype not in (tf.resource, tf.variant) and not dtype.is_quantized
            and dtype.base_dtype == dtype, InvalidInputError,
            f"input {name!r}: {dtype.name} tensors cannot be sent in a request; expected "
            f"{info.dtype.name}")
    require(dtype == info.dtype, InvalidInputError,
            f"input {name!r}: expected dtype {info.dtype.name}, got {dtype.name}")
    return dtype


def to_array(name: str, proto: tensor_pb2.TensorProto, info: TensorInfo,
             max_elements: int) -> np.ndarray:
    """One request tensor as an array of ``info``'s dtype; every check before conversion."""
    dtype = _dtype(name, proto, info)
    require(not proto.tensor_shape.unknown_rank, InvalidInputError,
            f"input {name!r}: TensorProto must give its shape (unknown_rank is set)")
    dims = [d.size for d in proto.tensor_shape.dim]
    require(all(size >= 0 for size in dims), InvalidInputError,
            f"input {name!r}: TensorProto declares negative dimensions {dims}")
    count = math.prod(dims)
    require(count <= max_elements, InvalidInputError,
            f"input {name!r}: TensorProto declares {count} elements (shape {dims}); at most "
            f"{max_elements} are accepted per input (--max_tensor_elements)")
    require(dtype in _VALUE_FIELD, InvalidInputError,
            f"input {name!r}: {dtype.name} tensors cannot be sent in a request")
    field, per = _VALUE_FIELD[dtype]
    strays = [f for f in _ALL_VALUE_FIELDS if f != field and len(getattr(proto, f))]
    require(not strays, InvalidInputError,
            f"input {name!r}: a {dtype.name} tensor carries values in {strays}; its values "
            f"go in {field} or tensor_content")
    values = len(getattr(proto, field))
    if proto.tensor_content:
        require(dtype != tf.string, InvalidInputError,
                f"input {name!r}: string tensors cannot use tensor_content; use string_val")
        need = count * np.dtype(dtype.as_numpy_dtype).itemsize
        require(values == 0 and len(proto.tensor_content) == need, InvalidInputError,
                f"input {name!r}: tensor_content holds {len(proto.tensor_content)} bytes; shape "
                f"{dims} of {dtype.name} needs exactly {need}"
                + (f" (and no {field})" if values else ""))
    else:
        # One value per element, or a single value for all of them (as TF reads a proto).
        require(values == count * per or (values == per and count >= 1), InvalidInputError,
                f"input {name!r}: {values // per if per > 1 else values} value(s) in {field} for "
                f"shape {dims} ({count} elements); send one value per element, or one for all")
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise InvalidInputError(f"input {name!r}: malformed TensorProto: {e}") from e


def decode_inputs(sig: SignatureInfo, protos: Mapping[str, tensor_pb2.TensorProto],
                  max_elements: int) -> dict[str, np.ndarray]:
    """A PredictRequest's ``inputs`` for ``sig``: unknown names are refused before any input is
    converted (each could otherwise declare ``max_elements`` of its own)."""
    unknown = sorted(set(protos) - set(sig.inputs))
    require(not unknown, InvalidInputError,
            f"signature {sig.name!r}: unknown input(s) {unknown}; expected {sorted(sig.inputs)}")
    return {name: to_array(name, proto, sig.inputs[name], max_elements)
            for name, proto in protos.items()}
