"""Compare one output of two implementations against the tolerance table.

Floating point passes when the relative Frobenius error is within the dtype's ``rel_norm`` and
every element is within ``atol + rtol * |ref|``; integer, boolean and string outputs (ids,
tokens, masks) must be equal. Dtype and shape must match first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xgr_common.tolerances import Tolerance, dtype_name, tolerance_for


@dataclass(frozen=True)
class Comparison:
    """The agreement of one output on one batch. Errors are 0 for exact matches."""

    stage: str
    output: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    rel_norm: float
    mismatched: int          # elements outside the tolerance (exact: unequal elements)
    passed: bool
    problem: str = ""        # dtype/shape mismatch or non-finite values, in words
    abs_errors: np.ndarray | None = None   # float outputs only, for the histograms


def to_numpy(value) -> np.ndarray:
    """A dense TF / torch / numpy value as numpy (ragged values go through ``ragged_parts``)."""
    if hasattr(value, "flat_values"):
        raise TypeError("ragged values are compared through ragged_parts()")
    if hasattr(value, "numpy"):
        value = value.detach().cpu() if hasattr(value, "detach") else value
        return np.asarray(value.numpy())
    return np.asarray(value)


def ragged_parts(value) -> list[tuple[str, object]]:
    """``[("", value)]`` for dense values; a ragged tensor gives its values and row splits."""
    if hasattr(value, "flat_values"):
        parts = [(".values", value.flat_values)]
        parts += [(f".row_splits{i}", s) for i, s in enumerate(value.nested_row_splits)]
        return parts
    return [("", value)]


def compare(stage: str, output: str, got, expected, tolerance: Tolerance | None = None
            ) -> Comparison:
    """Compare ``got`` (the migrated side) against ``expected`` (the TF reference)."""
    a, b = to_numpy(got), to_numpy(expected)
    dtype = dtype_name(b.dtype) if b.dtype.kind not in "OSU" else "string"
    base = dict(stage=stage, output=output, dtype=dtype, shape=tuple(b.shape))
    got_dtype = dtype_name(a.dtype) if a.dtype.kind not in "OSU" else "string"
    if got_dtype != dtype or a.shape != b.shape:
        return Comparison(**base, max_abs=float("inf"), max_rel=float("inf"),
                          rel_norm=float("inf"), mismatched=int(b.size), passed=False,
                          problem=f"expected {dtype}{list(b.shape)}, got {got_dtype}{list(a.shape)}")
    tol = tolerance or tolerance_for(dtype)
    if tol.exact or dtype == "string":
        unequal = int(np.count_nonzero(a != b))
        err = 0.0 if unequal == 0 or dtype == "string" else \
            float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        return Comparison(**base, max_abs=err if unequal else 0.0, max_rel=err if unequal else 0.0,
                          rel_norm=float(unequal > 0), mismatched=unequal, passed=unequal == 0,
                          problem=f"{unequal} of {b.size} elements differ" if unequal else "")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    abs_err = np.abs(a64 - b64)
    finite = bool(np.isfinite(a64).all()) or bool((np.isnan(a64) == np.isnan(b64)).all())
    ref_norm = float(np.linalg.norm(b64))
    rel_norm = float(np.linalg.norm(a64 - b64)) / ref_norm if ref_norm > 0 else \
        float(np.linalg.norm(a64 - b64))
    outside = int(np.count_nonzero(~np.isclose(a64, b64, atol=tol.atol, rtol=tol.rtol,
                                               equal_nan=True)))
    max_abs = float(np.nanmax(abs_err)) if abs_err.size else 0.0
    max_rel = float(np.nanmax(abs_err / np.maximum(np.abs(b64), tol.atol))) if abs_err.size else 0.0
    passed = finite and rel_norm <= tol.rel_norm and outside == 0
    problem = "" if passed else ("non-finite values" if not finite else
                                 f"{outside} of {b.size} elements outside atol={tol.atol:g} "
                                 f"rtol={tol.rtol:g}; rel_norm {rel_norm:.3g} vs {tol.rel_norm:g}")
    return Comparison(**base, max_abs=max_abs, max_rel=max_rel, rel_norm=rel_norm,
                      mismatched=outside, passed=passed, problem=problem,
                      abs_errors=abs_err.ravel().astype(np.float32))
