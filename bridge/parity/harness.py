"""Run the original TF model and the migrated plan side by side and compare every boundary.

For each batch both sides run the whole model; every stage's outputs and the model's final
outputs are compared with :func:`bridge.parity.compare.compare`. Results are aggregated per
(stage, output) over batches (worst error wins, any failing batch fails the row) and kept in
execution order, so the first failing row names the stage where the migrated side diverged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
from tqdm import tqdm

from bridge.migration.keras_flavours import keras_mask
from bridge.migration.runner import PlanRunner
from bridge.migration.stages import StageError
from bridge.parity.compare import Comparison, compare, ragged_parts
from xgr_common.errors import InvalidInputError, XgrError

MODEL_OUTPUT = "(model output)"
RUN_FAILED = "(migrated run)"   # the output label of a row for a stage that raised
HISTOGRAM_SAMPLES = 200_000   # per row; keeps reports small on big batches


@dataclass(frozen=True)
class ParityResult:
    """Aggregated comparisons in execution order (final outputs last)."""

    rows: tuple[Comparison, ...]
    batches: int
    torch_stages: tuple[str, ...]
    runtimes: Mapping[str, str] = field(default_factory=dict)        # stage -> "tf" / "torch"
    input_shapes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # distinct shapes
    sources: Mapping[str, str] = field(default_factory=dict)   # stage -> the layers it reads

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def first_failure(self) -> Comparison | None:
        return next((row for row in self.rows if not row.passed), None)

    def summary(self) -> str:
        """One paragraph for terminals and assertion messages."""
        failure = self.first_failure
        head = (f"parity {'PASSED' if failure is None else 'FAILED'}: {len(self.rows)} outputs "
                f"over {self.batches} batches; Torch stages: {list(self.torch_stages) or 'none'}")
        if failure is None:
            return head
        if failure.output == RUN_FAILED:
            return f"{head}\nfirst failing stage {failure.stage!r} raised in the migrated run: " \
                   f"{failure.problem}"
        return (f"{head}\nfirst failing stage {failure.stage!r}, output {failure.output!r}, "
                f"dtype {failure.dtype}, shape {list(failure.shape)}: max abs err "
                f"{failure.max_abs:.3g}, max rel err {failure.max_rel:.3g} ({failure.problem})")


def _merge(old: Comparison | None, new: Comparison) -> Comparison:
    if old is None:
        return new
    errors = [e for e in (old.abs_errors, new.abs_errors) if e is not None]
    merged = np.concatenate(errors)[:HISTOGRAM_SAMPLES] if errors else None
    worst = old if (not old.passed and new.passed) else new
    return Comparison(stage=old.stage, output=old.output, dtype=old.dtype, shape=old.shape,
                      max_abs=max(old.max_abs, new.max_abs), max_rel=max(old.max_rel, new.max_rel),
                      rel_norm=max(old.rel_norm, new.rel_norm),
                      mismatched=old.mismatched + new.mismatched,
                      passed=old.passed and new.passed, problem=worst.problem or old.problem,
                      abs_errors=merged)


def _failed_run(error: StageError) -> Comparison:
    return Comparison(error.stage, RUN_FAILED, "-", (), float("inf"), float("inf"), float("inf"),
                      0, False, str(error))


def _compare_batch(runner: PlanRunner, batch: Mapping[str, Any], shapes: dict
                   ) -> list[Comparison]:
    try:
        ref_out, ref_stages = runner.run_reference(batch, shapes)
    except XgrError:
        raise
    except Exception as error:  # TF's own errors for wrong dtypes or shapes
        raise InvalidInputError(f"the batch does not run through the TF model: "
                                f"{type(error).__name__}: {error}") from None
    try:
        got_out, got_stages = runner.run(batch)
    except StageError as error:
        # The stages before the failing one still compare; the failure is its own row.
        done = {s: ref_stages[s] for s in error.boundaries if s in ref_stages}
        return _compare_stages(done, error.boundaries) + [_failed_run(error)]
    rows = _compare_stages(ref_stages, got_stages)
    for (name, e), (_, g) in zip(ref_out, got_out):
        for suffix, e_part in ragged_parts(e):
            rows.append(compare(MODEL_OUTPUT, name + suffix, dict(ragged_parts(g)).get(suffix, g),
                                e_part))
    return rows


def _compare_stages(ref_stages: Mapping[str, list], got_stages: Mapping[str, list]
                    ) -> list[Comparison]:
    rows = []
    for stage, expected in ref_stages.items():
        got = got_stages.get(stage, [])
        if len(got) != len(expected):
            rows.append(Comparison(stage, "outputs", "-", (), float("inf"), float("inf"),
                                   float("inf"), len(expected), False,
                                   f"TF gives {len(expected)} outputs, migrated {len(got)}"))
            continue
        for i, (e, g) in enumerate(zip(expected, got)):
            label = "output" if len(expected) == 1 else f"output_{i}"
            for suffix, e_part in ragged_parts(e):
                g_part = dict(ragged_parts(g)).get(suffix, g)
                rows.append(compare(stage, label + suffix, g_part, e_part))
            rows.extend(_compare_masks(stage, label, g, e))
    return rows


def _compare_masks(stage: str, label: str, got: Any, expected: Any) -> list[Comparison]:
    """A row for the Keras mask of an output when either side has one."""
    e_mask, g_mask = keras_mask(expected), keras_mask(got)
    if e_mask is None and g_mask is None:
        return []
    if e_mask is None or g_mask is None:
        which = "TF" if g_mask is None else "the migrated stage"
        other = "the migrated stage" if g_mask is None else "TF"
        return [Comparison(stage, f"{label}.mask", "bool", (), float("inf"), float("inf"),
                           float("inf"), 1, False,
                           f"{which} gives this output a Keras mask, {other} gives none")]
    return [compare(stage, f"{label}.mask", g_mask, e_mask)]


def run_parity(runner: PlanRunner, batches: Iterable[Mapping[str, Any]],
               progress: bool = True) -> ParityResult:
    """Compare the plan against the all-TF model on every batch."""
    merged: dict[tuple[str, str], Comparison] = {}
    shapes: dict[str, list[str]] = {}
    count = 0
    for index, batch in enumerate(tqdm(batches, desc="parity batches", unit="batch",
                                       disable=not progress)):
        batch_shapes: dict[str, list] = {}
        try:
            batch_rows = _compare_batch(runner, batch, batch_shapes)
        except InvalidInputError as error:
            raise InvalidInputError(f"batch {index}: {error}") from None
        for row in batch_rows:
            key = (row.stage, row.output)
            merged[key] = _merge(merged.get(key), row)
        for stage, inputs in batch_shapes.items():
            text = ", ".join("x".join(map(str, s)) or "scalar" for s in inputs)
            if text not in shapes.setdefault(stage, []):
                shapes[stage].append(text)
        count += 1
    rows = tuple(merged.values())
    return ParityResult(rows, count, tuple(s.name for s in runner.plan.torch_stages()),
                        {row.stage: runner.runtime(row.stage) for row in rows
                         if row.stage != MODEL_OUTPUT},
                        {stage: tuple(found) for stage, found in shapes.items()},
                        {stage: ", ".join(runner.staged.sources(stage)) for stage in shapes
                         if runner.staged.functional})
