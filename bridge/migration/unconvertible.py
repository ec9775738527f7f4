"""Known reasons a Keras layer or TF op cannot move to Torch through tf2onnx.

Data, not logic: :mod:`bridge.migration.convert` looks stages up here first so the report says
*why* in the user's terms, and still runs every check for layers not listed.
"""

from __future__ import annotations

from typing import Any

# Keras layer class name -> reason (each found by converting that layer with tf2onnx).
LAYER_REASONS: dict[str, str] = {
    "StringLookup": "StringLookup maps strings through a lookup table: strings cannot enter "
                    "Torch (it converts to ONNX CategoryMapper only via from_keras, and Torch "
                    "has no string tensors)",
    "IntegerLookup": "IntegerLookup uses an int64->int64 hash table; tf2onnx converts only "
                     "string<->int64 tables",
    "Hashing": "Hashing becomes StringToHashBucketFast / fingerprint ops whose ONNX "
               "implementations hash differently from TF (wrong buckets)",
    "TextVectorization": "TextVectorization splits and looks up strings: strings cannot enter "
                         "Torch",
    "Discretization": "Discretization uses tf.searchsorted (LowerBound/Bucketize), which has no "
                      "ONNX mapping",
}

# TF / ONNX op type -> extra explanation appended to the generic reason.
OP_REASONS: dict[str, str] = {
    "Erfc": " (exact gelu, approximate=False, uses Erfc: use approximate=True or a Torch twin)",
    "LowerBound": " (tf.searchsorted)",
    "UpperBound": " (tf.searchsorted side='right')",
    "ParseExample": " (tf.io.parse_example: parsing stays in TF)",
    "ParseExampleV2": " (tf.io.parse_example: parsing stays in TF)",
    "LookupTableFindV2": " (a TF lookup table)",
    "HashTableV2": " (a TF lookup table)",
    "StringToHashBucketFast": " (TF string hashing; ONNX runtimes hash differently)",
    "CategoryMapper": " (a string lookup table)",
}


def known_layer_reason(layer: Any) -> str:
    """The known reason for ``layer``'s class, or an empty string."""
    return LAYER_REASONS.get(type(layer).__name__, "")


def known_op_reason(op_type: str) -> str:
    return OP_REASONS.get(op_type, "")
