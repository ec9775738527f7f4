"""The names a served migrated model gives its outputs, shared by the export and the parity
check that reads them back.

``serving_default`` returns the model's outputs by the names the parity report uses
(``functional.output_names``: ``ctr``, ``score#1``); a ragged output becomes ``NAME.values``
and ``NAME.row_splits0``. The ``xgr_boundaries`` signature returns every stage call's outputs
as ``STAGE/output`` (``STAGE/output_1`` for a layer's second output), each Keras mask as
``.../output.mask``: the boundaries ``xgr parity --saved_model`` compares with TF.
"""

from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from bridge.migration.keras_flavours import keras_mask

BOUNDARIES_SIGNATURE = "xgr_boundaries"
# What a served migrated model holds (its plan's factory and Keras, where each stage runs),
# relative to the SavedModel: the parity check builds the TF model from it.
MIGRATION_FILE = "assets.extra/xgr_migration.json"
MASK_SUFFIX = ".mask"


def ragged_parts(value: Any) -> list[tuple[str, Any]]:
    """``[("", value)]`` for a dense tensor; a ragged one gives values and row splits."""
    if isinstance(value, tf.RaggedTensor):
        return [(".values", value.flat_values)] + [
            (f".row_splits{i}", s) for i, s in enumerate(value.nested_row_splits)]
    return [("", value)]


def output_label(index: int, count: int) -> str:
    """The label of a stage's output ``index`` of ``count`` (as the parity report writes)."""
    return "output" if count == 1 else f"output_{index}"


def signature_outputs(outputs: list[tuple[str, Any]]) -> dict[str, tf.Tensor]:
    """The model's named outputs as a signature's dict of dense tensors."""
    return {name + suffix: part for name, value in outputs for suffix, part in ragged_parts(value)}


def boundary_key(stage: str, label: str) -> str:
    return f"{stage}/{label}"


def boundary_outputs(boundaries: Mapping[str, list]) -> dict[str, tf.Tensor]:
    """Every stage call's flat outputs (and their Keras masks) as dense tensors."""
    found: dict[str, tf.Tensor] = {}
    for stage, values in boundaries.items():
        for i, value in enumerate(values):
            label = output_label(i, len(values))
            for suffix, part in ragged_parts(value):
                found[boundary_key(stage, label + suffix)] = part
            mask = keras_mask(value)
            if tf.is_tensor(mask):
                found[boundary_key(stage, label + MASK_SUFFIX)] = mask
    return found
