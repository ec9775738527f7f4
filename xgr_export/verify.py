"""Check an exported SavedModel against the in-process pipeline, in a fresh process.

``verify_saved_model(saved_model, features, reference)`` runs the SavedModel with TensorFlow
and ``custom_ops`` alone (``python -m xgr_export.run_saved_model`` in a child process: no Python
torch, no engine code) on ``features`` and compares its outputs with ``reference`` (what
``bridge.pipeline.RecommendPipeline`` returned for the same features, its engine in the
package's dtype): at float32 item ids and counts exactly and scores within the float32
tolerance of ``xgr_common.tolerances``; at 16 bits by its ``RANKED_LIST_RULE`` (items exact
except inside score ties).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from xgr_common.errors import CapacityError, ExportError, require
from xgr_common.tolerances import PRECISION_RULE, RANKED_LIST_RULE, TIE_DTYPES, dtype_name, \
    scores_tied, tolerance_for

ROOT = Path(__file__).resolve().parent.parent
# AOTInductor fuses and reorders float work: its scores may differ from eager torch's by a few
# float32 roundings per layer, so the table's float32 atol is scaled for a whole model.
SCORE_ATOL_SCALE = 10.0
# Top-level packages whose presence in the child would mean the SavedModel needed Python
# torch, engine code or our TF-side Python (the feature graph lives in the SavedModel).
FORBIDDEN_PACKAGES = ("torch", "torch_engine", "tf_frontend", "bridge", "xgr_world")


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of one comparison. ``mismatched_rows`` lists, per differing request row, the
    first differing position and both item ids and reference scores there."""

    requests: int
    rows_exact: int
    num_items_exact: bool
    max_score_error: float
    score_atol: float
    forbidden_modules: tuple[str, ...]
    mismatched_rows: tuple[dict, ...]
    load_seconds: float
    first_call_seconds: float
    call_seconds: float
    dtype: str = "float32"
    rule: str = "items and counts exact; scores within the float32 tolerance"
    rows_within_ties: int = 0   # 16-bit: rows that differ only inside score ties
    wider_beam: int = 0         # 16-bit: the wider reference's beam, 0 if not consulted
    # 16-bit, the rule broken: each side's largest score error against a float32 search of
    # the same requests and weights (``drift``), the SavedModel's and the in-process
    # engine's; None where not consulted. Which side drifts from the exact answer.
    saved_drift: float | None = None
    engine_drift: float | None = None
    # 16-bit, the rule broken: the SavedModel's rows that break ``PRECISION_RULE`` against
    # the float32 search (None where not consulted); 0 passes the check.
    precise_rows_broken: int | None = None

    @property
    def ok(self) -> bool:
        if self.forbidden_modules:
            return False
        if self.dtype in TIE_DTYPES:
            return not self.mismatched_rows or self.precise_rows_broken == 0
        return (self.rows_exact == self.requests and self.num_items_exact
                and self.max_score_error <= self.score_atol)

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _features_npz(features: dict, path: Path) -> None:
    arrays = {}
    for name, value in features.items():
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        arrays[name] = array.astype("S") if array.dtype == object else array  # no pickle
    np.savez(path, **arrays)


def run_fresh(saved_model: str | os.PathLike, features: dict, repeats: int = 0,
              timeout: float = 900.0) -> dict[str, np.ndarray]:
    """The SavedModel's outputs on ``features`` from a fresh process (TF + custom_ops only),
    with ``modules`` and ``seconds`` (see ``xgr_export.run_saved_model``)."""
    with tempfile.TemporaryDirectory(prefix="xgr_verify_") as tmp:
        feats, out = Path(tmp) / "features.npz", Path(tmp) / "outputs.npz"
        _features_npz(features, feats)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                   TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run([sys.executable, "-m", "xgr_export.run_saved_model",
                               # resolved: the child runs from the repository root
                               str(Path(saved_model).resolve()), str(feats), str(out),
                               f"--repeats={repeats}"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        require(done.returncode == 0, ExportError,
                f"the SavedModel {saved_model} failed in a fresh process (TF + custom_ops): "
                f"{done.stderr[-3000:]}")
        with np.load(out, allow_pickle=True) as data:
            return {name: data[name] for name in data.files}


def first_break(got_ids: np.ndarray, got_scores: np.ndarray, want_ids: np.ndarray,
                want_scores: np.ndarray, dtype: str,
                wider: dict[int, float] | None = None, slack: float = 0.0) -> int | None:
    """The first position of one ranked row breaking ``RANKED_LIST_RULE``, None if none;
    ``wider``: the row's items and scores from a reference search with a wider beam;
    ``slack``: how much wider each tie is (``PRECISION_RULE``)."""
    tied = functools.partial(scores_tied, dtype=dtype, slack=slack)
    listed = {int(i): float(s) for i, s in zip(want_ids.tolist(), want_scores.tolist()) if i >= 0}
    last = min(listed.values(), default=float("-inf"))
    wide = wider or {}
    breaks, extras, seen = [], [], set()
    for k, (item, want) in enumerate(zip(got_ids.tolist(), want_ids.tolist())):
        if (item < 0) != (want < 0) or item in seen:
            breaks.append(k)
            break
        if item < 0:
            continue
        seen.add(item)
        got = float(got_scores[k])
        # The list's own order: one tie, never widened (it compares the list with itself).
        if k and not (got <= got_scores[k - 1] or scores_tied(got, float(got_scores[k - 1]),
                                                              dtype)):
            breaks.append(k)            # out of order
            break
        if item in listed:
            ok = tied(got, listed[item])
        elif item in wide:              # dropped by the reference's beam at an earlier code
            ok = tied(got, wide[item])
        else:                           # cut from the reference's list by top_k
            ok = got <= last or tied(got, last)
        if not ok:
            breaks.append(k)
            break
        if item not in listed:
            extras.append(got)
    # A reference item left out must be tied with the list's end or trade places with an item
    # the reference left out at a tied score (a tie the SavedModel's beam cut the other way).
    returned = got_scores[got_ids >= 0]
    end = float(returned[-1]) if len(returned) else float("-inf")
    for item, score in sorted(listed.items(), key=lambda pair: -pair[1]):
        if item in seen or score <= end or tied(score, end):
            continue
        partner = next((j for j, e in enumerate(extras) if tied(e, score)), None)
        if partner is not None:
            extras.pop(partner)
            continue
        below = [k for k, g in enumerate(returned.tolist())
                 if g < score and not tied(g, score)]
        breaks.append(below[0] if below else len(returned))
    return min(breaks) if breaks else None


def item_score_error(got: dict, want: dict, wide_rows: list[dict] | None) -> float:
    """The largest gap between a returned item's score and its reference score (the
    reference list's, else the wider beam's), over the items either scored: the 16-bit
    rule's error, item by item as the rule reads the lists."""
    error = 0.0
    own_rows = _row_lists(want)
    for row, (ids, scores) in enumerate(zip(got["item_ids"], got["scores"])):
        own = own_rows[row]
        wide = wide_rows[row] if wide_rows is not None else {}
        for item, score in zip(ids.tolist(), scores.tolist()):
            evidence = own.get(item, wide.get(item))
            if item >= 0 and evidence is not None and np.isfinite(score - evidence):
                error = max(error, abs(score - evidence))
    return error


def ranked_lists(outputs: dict) -> dict[str, np.ndarray]:
    """The ranked part of a pipeline's ``outputs`` (``item_ids``, ``scores``, ``num_items``)
    as NumPy arrays, whether TF tensors, torch tensors or arrays came in."""
    return {name: np.asarray(v.numpy() if hasattr(v, "numpy") else v)
            for name, v in outputs.items() if name in ("item_ids", "scores", "num_items")}


def _row_lists(outputs: dict | None) -> list[dict[int, float]] | None:
    """Each row's items and scores of a pipeline's ``outputs`` (None stays None)."""
    if outputs is None:
        return None
    ranked = ranked_lists(outputs)
    return [{int(i): float(s) for i, s in zip(ids, scores) if i >= 0}
            for ids, scores in zip(ranked["item_ids"], ranked["scores"])]


def compare(got: dict[str, np.ndarray], reference: dict, modules=(),
            seconds=(np.nan, np.nan, np.nan), dtype: object = "float32",
            wider: dict | None = None, wider_beam: int = 0) -> VerifyReport:
    """``got`` (fresh-process outputs) against ``reference`` (the in-process pipeline's, its
    engine in ``dtype``); ``wider``: the same pipeline's outputs at ``wider_beam`` beams,
    evidence for 16-bit items the reference's beam dropped (``RANKED_LIST_RULE``)."""
    dtype = dtype_name(dtype)
    want = ranked_lists(reference)
    wide_rows = _row_lists(wider)
    require(got["item_ids"].shape == want["item_ids"].shape, ExportError,
            f"item_ids shapes differ: SavedModel {got['item_ids'].shape}, reference "
            f"{want['item_ids'].shape}")
    mismatched, differing = [], 0
    for row, (a, b) in enumerate(zip(got["item_ids"], want["item_ids"])):
        differs = not np.array_equal(a, b)
        differing += differs
        if dtype in TIE_DTYPES:
            pos = first_break(a, got["scores"][row], b, want["scores"][row], dtype,
                              wide_rows[row] if wide_rows is not None else None)
        else:
            pos = int(np.flatnonzero(a != b)[0]) if differs else None
        if pos is not None:
            mismatched.append({"row": row, "position": pos, "got": int(a[pos]),
                               "want": int(b[pos]), "got_score": float(got["scores"][row, pos]),
                               "want_score": float(want["scores"][row, pos])})
    finite = np.isfinite(want["scores"]) & np.isfinite(got["scores"])
    same_inf = np.array_equal(np.isfinite(want["scores"]), np.isfinite(got["scores"]))
    tied = dtype in TIE_DTYPES
    error = (item_score_error(got, want, wide_rows) if tied else
             float(np.abs(got["scores"][finite] - want["scores"][finite]).max(initial=0.0)))
    tol = tolerance_for(dtype if tied else np.float32)
    forbidden = tuple(sorted(m for m in modules if m.split(".")[0] in FORBIDDEN_PACKAGES))
    return VerifyReport(
        requests=len(want["item_ids"]), rows_exact=len(want["item_ids"]) - differing,
        num_items_exact=bool(np.array_equal(got["num_items"], want["num_items"])),
        max_score_error=error if same_inf else float("inf"),
        score_atol=tol.atol * (1.0 if tied else SCORE_ATOL_SCALE) + tol.rtol * float(
            np.abs(want["scores"][finite]).max(initial=0.0)),
        forbidden_modules=forbidden, mismatched_rows=tuple(mismatched),
        load_seconds=float(seconds[0]), first_call_seconds=float(seconds[1]),
        call_seconds=float(seconds[2]), dtype=dtype,
        rule=RANKED_LIST_RULE if tied else VerifyReport.rule,
        rows_within_ties=differing - len(mismatched) if tied else 0,
        wider_beam=wider_beam if tied and wider is not None else 0)


def drift(precise: dict, calls: list[dict], reference: dict) -> tuple[float, float]:
    """(the SavedModel's ``calls``, the in-process ``reference``) largest score error against
    ``precise`` (the same search at a higher precision), item by item over the items both
    returned, as ``item_score_error`` reads them."""
    return (max(item_score_error(ranked_lists(c), precise, None) for c in calls),
            item_score_error(ranked_lists(reference), precise, None))


def precise_breaks(calls: list[dict], precise: dict, dtype: object, engine_drift: float) -> int:
    """How many rows of the SavedModel's ``calls`` break ``PRECISION_RULE`` against
    ``precise`` (a float32 search of the same requests), each tie widened by
    ``engine_drift`` (the in-process engine's own largest error against it)."""
    want = ranked_lists(precise)
    return sum(first_break(ids, scores, want["item_ids"][row], want["scores"][row],
                           dtype_name(dtype), slack=engine_drift) is not None
               for got in map(ranked_lists, calls)
               for row, (ids, scores) in enumerate(zip(got["item_ids"], got["scores"])))


def verify_saved_model(saved_model: str | os.PathLike, features: dict, reference: dict,
                       repeats: int = 0, timeout: float = 900.0,
                       dtype: object = "float32",
                       wider: tuple[int, Callable[[], dict]] | None = None,
                       precise: Callable[[], dict] | None = None) -> VerifyReport:
    """Runs ``saved_model`` in a fresh process on ``features`` and compares with ``reference``
    (the in-process pipeline with its engine in ``dtype``); with ``repeats``, the last repeated
    call too (a prompt cache answers it from its entries), its differing rows reported with
    ``"call": "repeat"``. ``wider``: (beam width, the in-process pipeline at that width on
    the same features), called only when a 16-bit comparison breaks the rule without it;
    ``precise``: the in-process pipeline in float32, called only when the rule is still
    broken, to say which side drifts (``VerifyReport.saved_drift``)."""
    got = run_fresh(saved_model, features, repeats, timeout)
    modules, seconds = got.pop("modules").tolist(), got.pop("seconds")
    repeat = {name.removeprefix("repeat_"): got.pop(name) for name in list(got)
              if name.startswith("repeat_")}
    calls = [got] + ([repeat] if repeat else [])
    reports = [compare(c, reference, modules, seconds, dtype) for c in calls]
    if wider is not None and any(r.mismatched_rows for r in reports):
        beam, run = wider
        try:
            outputs = run()
        except CapacityError:   # no memory for the wider beam: the rule without its evidence
            outputs = None
        if outputs is not None:
            reports = [compare(c, reference, modules, seconds, dtype, outputs, beam)
                       for c in calls]
    report = reports[0]
    if precise is not None and any(r.mismatched_rows for r in reports):
        try:
            outputs = precise()
        except CapacityError:   # no memory for a float32 copy: the verdict stands unexplained
            outputs = None
        if outputs is not None:
            saved, engine = drift(outputs, calls, reference)
            report = replace(report, saved_drift=saved, engine_drift=engine,
                             precise_rows_broken=precise_breaks(calls, outputs, dtype, engine),
                             rule=f"{RANKED_LIST_RULE}; where broken, {PRECISION_RULE}")
    if not repeat:
        return report
    again = reports[1]
    return replace(
        report, rows_exact=min(report.rows_exact, again.rows_exact),
        num_items_exact=report.num_items_exact and again.num_items_exact,
        max_score_error=max(report.max_score_error, again.max_score_error),
        mismatched_rows=report.mismatched_rows + tuple(
            {**row, "call": "repeat"} for row in again.mismatched_rows),
        rows_within_ties=max(report.rows_within_ties, again.rows_within_ties))
