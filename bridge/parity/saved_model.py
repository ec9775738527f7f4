"""Parity of a served migrated model: the SavedModel of ``xgr migrate export`` against the TF
model it was exported from, on the same batches, in the report ``xgr parity --plan`` writes.

The SavedModel names its plan's model factory (``assets.extra/xgr_migration.json``), so the
TF model is built from it. Each batch runs through the all-TF model and through the
SavedModel's two signatures: ``xgr_boundaries`` gives every stage's outputs and masks (the
rows, in execution order), ``serving_default`` the model's outputs (the last rows). A batch
the SavedModel refuses or fails on gives a ``(migrated run)`` row with TF's message, which
names the stage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import tensorflow as tf

import custom_ops  # noqa: F401  (registers TorchCall, which the SavedModel calls)
from bridge.migration.keras_flavours import keras_mask
from bridge.migration.served_outputs import (BOUNDARIES_SIGNATURE, MASK_SUFFIX, MIGRATION_FILE,
                                             boundary_key, output_label, ragged_parts,
                                             signature_outputs)
from bridge.migration.stages import StagedModel
from bridge.parity.compare import Comparison, compare
from bridge.parity.harness import MODEL_OUTPUT, RUN_FAILED, ParityResult, _merge
from xgr_common.errors import InvalidInputError, MigrationError
from xgr_common.serving_names import SERVING_SIGNATURE


def read_record(saved_model: str | Path) -> dict:
    """What a served migrated model holds: its plan's ``model`` and ``keras``, and per stage
    its runtime (and device and package for Torch stages)."""
    path = Path(saved_model) / MIGRATION_FILE
    if not path.is_file():
        raise MigrationError(f"{saved_model} is not a SavedModel of `xgr migrate export` (it "
                             f"has no {MIGRATION_FILE})")
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise MigrationError(f"{path} is not valid JSON: {error}") from None


def _missing(stage: str, output: str, what: str) -> Comparison:
    return Comparison(stage, output, "-", (), float("inf"), float("inf"), float("inf"), 1,
                      False, what)


def _stage_rows(ref_stages: Mapping[str, list], got: Mapping[str, Any]) -> list[Comparison]:
    rows = []
    for stage, values in ref_stages.items():
        for i, value in enumerate(values):
            label = output_label(i, len(values))
            for suffix, part in ragged_parts(value):
                key = boundary_key(stage, label + suffix)
                rows.append(compare(stage, label + suffix, got[key], part) if key in got else
                            _missing(stage, label + suffix, "the SavedModel gives no such "
                                                            "boundary"))
            mask, key = keras_mask(value), boundary_key(stage, label + MASK_SUFFIX)
            if tf.is_tensor(mask) or key in got:
                rows.append(compare(stage, label + MASK_SUFFIX, got[key], mask)
                            if tf.is_tensor(mask) and key in got else
                            _missing(stage, label + MASK_SUFFIX, "one side gives this output "
                                                                 "a Keras mask, the other none"))
    return rows


_STAGE_IN_MESSAGE = re.compile(r"stage (\S+?):")


def _failed(error: tf.errors.OpError) -> Comparison:
    message = error.message.strip().splitlines()[0] if error.message else str(error)
    found = _STAGE_IN_MESSAGE.search(message)
    return Comparison(found.group(1) if found else "(saved model)", RUN_FAILED, "-", (),
                      float("inf"), float("inf"), float("inf"), 0, False,
                      f"{type(error).__name__}: {message}")


def saved_model_parity(saved_model: str | Path, batches: Iterable[Mapping[str, Any]],
                       model: Any | None = None) -> ParityResult:
    """Compare the SavedModel with the TF model (``model``, else built from the record)."""
    from bridge.migration.stages import build_model

    record = read_record(saved_model)
    model = model if model is not None else build_model(record["model"], record["keras"])
    staged = StagedModel(model)
    loaded = tf.saved_model.load(str(saved_model))
    serve, boundaries = loaded.signatures[SERVING_SIGNATURE], loaded.signatures[
        BOUNDARIES_SIGNATURE]
    merged: dict[tuple[str, str], Comparison] = {}
    shapes: dict[str, list[str]] = {}
    count = 0
    for index, batch in enumerate(batches):
        batch_shapes: dict[str, list] = {}
        try:
            ref_out, ref_stages = staged.run(batch, input_shapes=batch_shapes)
        except Exception as error:  # TF's own errors for wrong dtypes or shapes
            raise InvalidInputError(f"batch {index} does not run through the TF model: "
                                    f"{type(error).__name__}: {error}") from None
        inputs = {name: tf.convert_to_tensor(value) for name, value in batch.items()}
        try:
            rows = _stage_rows(ref_stages, boundaries(**inputs))
            got = serve(**inputs)
            for name, expected in signature_outputs(ref_out).items():
                rows.append(compare(MODEL_OUTPUT, name, got[name], expected) if name in got
                            else _missing(MODEL_OUTPUT, name, "the SavedModel gives no such "
                                                              "output"))
        except tf.errors.OpError as error:
            rows = [_failed(error)]
        for row in rows:
            merged[(row.stage, row.output)] = _merge(merged.get((row.stage, row.output)), row)
        for stage, found in batch_shapes.items():
            text = ", ".join("x".join(map(str, s)) or "scalar" for s in found)
            if text not in shapes.setdefault(stage, []):
                shapes[stage].append(text)
        count += 1
    stages = record.get("stages", {})
    return ParityResult(tuple(merged.values()), count,
                        tuple(n for n, s in stages.items() if s.get("runtime") == "torch"),
                        {n: s.get("runtime", "tf") for n, s in stages.items()},
                        {stage: tuple(found) for stage, found in shapes.items()},
                        {stage: ", ".join(staged.sources(stage)) for stage in shapes})
