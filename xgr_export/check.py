"""The saved pipeline against the in-process one, on the same synthetic requests.

``check_against_python`` sends the same requests through ``bridge.pipeline.
RecommendPipeline`` (feature graph -> DLPack -> ``Engine.recommend`` on the engine's device, in
the package's dtype -> the rules) in this process, and through the SavedModel in a fresh
process with TensorFlow and ``custom_ops`` alone (``xgr_export.verify``). The items must be
equal (at 16 bits: equal but inside score ties, ``xgr_common.tolerances.RANKED_LIST_RULE``,
and where two 16-bit programs break that rule against each other, the SavedModel no further
from a float32 search than the in-process engine, ``PRECISION_RULE``); the result also times
both.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from bridge.pipeline import RecommendPipeline
from torch_engine.engine import Engine
from tf_frontend.pipeline_spec import USER_KEY, WIDTH_CONTROL, PipelineConfig
from xgr_common.errors import CapacityError
from xgr_common.layout import MaskMode
from xgr_export.verify import VerifyReport, verify_saved_model

REFERENCE_REPEATS = 3   # timed in-process calls after the first
SAVED_REPEATS = 10      # timed fresh-process calls after the first
# The wider reference of a 16-bit check keeps this many times the beams (at most the engine's
# largest width), so that the prefixes a near tie cut from the reference's beam survive.
WIDER_BEAM_FACTOR = 4


@dataclass(frozen=True)
class PipelineCheck:
    """The fresh-process comparison (``report``) plus what the requests were and how long each
    side took (seconds; the in-process side on ``device``)."""

    report: VerifyReport
    device: str
    reference: str
    prompt_tokens_min: int
    prompt_tokens_max: int
    python_first_call_seconds: float
    python_call_seconds: float
    items_per_request: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_json(self) -> dict:
        return {**self.report.to_json(), "reference": self.reference,
                "prompt_tokens_min": self.prompt_tokens_min,
                "prompt_tokens_max": self.prompt_tokens_max,
                "python_first_call_seconds": self.python_first_call_seconds,
                "python_call_seconds": self.python_call_seconds,
                "items_per_request": list(self.items_per_request)}

    def summary(self) -> str:
        """What ``xgr export --verify_requests`` prints: the verdict, timings, first mismatches."""
        report = self.report
        verdict = "equal" if report.ok else "DIFFERENT"
        if report.ok and report.mismatched_rows:    # passed by PRECISION_RULE
            verdict = ("as close to a float32 search as the in-process engine's, not equal "
                       "to them")
        ties = (f", {report.rows_within_ties} differing only inside score ties"
                if report.rows_within_ties else "")
        ties += f", a {report.wider_beam}-beam reference consulted" if report.wider_beam else ""
        lines = [
            f"verify: {report.requests} requests (prompts {self.prompt_tokens_min}-"
            f"{self.prompt_tokens_max} tokens): fresh-process SavedModel vs {self.reference} "
            f"on {self.device}: items {verdict} ({report.rows_exact}/{report.requests} rows "
            f"exact{ties}, num_items {'equal' if report.num_items_exact else 'different'}, max "
            f"score error {report.max_score_error:.2e}, tolerance {report.score_atol:.2e}); "
            f"modules {'clean' if not report.forbidden_modules else report.forbidden_modules}",
            f"  rule ({report.dtype}): {report.rule}",
            f"  batch of {report.requests}: SavedModel {report.call_seconds * 1e3:.1f} ms per "
            f"call (load {report.load_seconds:.1f} s, first call "
            f"{report.first_call_seconds:.1f} s); Python pipeline "
            f"{self.python_call_seconds * 1e3:.1f} ms"]
        if report.saved_drift is not None:
            lines.append(f"  against a float32 search of the same weights: SavedModel score "
                         f"error {report.saved_drift:.2e}, in-process engine "
                         f"{report.engine_drift:.2e} (the larger drifts further from the exact "
                         f"answer); SavedModel rows breaking the rule against it with ties "
                         f"widened by the engine's error: {report.precise_rows_broken}")
        lines += [f"  row {row['row']} differs first at {row['position']}: got {row['got']} "
                  f"({row['got_score']:.6f}), want {row['want']} ({row['want_score']:.6f})"
                  for row in report.mismatched_rows[:5]]
        return "\n".join(lines)


def _timed(call) -> tuple[object, float]:
    started = time.perf_counter()
    value = call()
    return value, time.perf_counter() - started


def _in_process(graph, engine, beam_width: int, top_k: int, config: PipelineConfig,
                prefill_mask: MaskMode) -> RecommendPipeline:
    """The in-process pipeline the SavedModel is compared with: ``engine`` searching with
    ``beam_width``, ``top_k`` and ``prefill_mask``, without a prompt cache (every row
    computed, the reference for hits and misses alike)."""
    return RecommendPipeline.for_engine(graph, engine, beam_width, top_k,
                                        replace(config, prompt_cache=False),
                                        prefill_mask=prefill_mask)


def _wider_reference(graph, engine, config: PipelineConfig, features: dict, beam_width: int,
                     top_k: int, prefill_mask: MaskMode):
    """(width, the in-process pipeline at ``WIDER_BEAM_FACTOR`` x ``beam_width`` beams on
    ``features``), the evidence ``RANKED_LIST_RULE`` takes for an item the reference's beam
    dropped; None where no wider beam exists (the engine's largest width, or requests that
    name their own width). Its lists are as many times longer: the wider search finds items
    the narrow one missed above the dropped item, which would push it off a list of
    ``top_k``."""
    wide = min(WIDER_BEAM_FACTOR * beam_width, engine.config.max_beam_width)
    if wide <= beam_width or WIDTH_CONTROL in features:
        return None
    longer = min(top_k * wide // beam_width, engine.catalog.reachable_items(wide))

    def run() -> dict:    # built only when a row needs the evidence
        return _in_process(graph, engine, wide, longer, replace(config, top_n=longer),
                           prefill_mask)(features)
    return wide, run


def _float32_reference(graph, engine, config: PipelineConfig, features: dict, beam_width: int,
                       top_k: int, prefill_mask: MaskMode):
    """The in-process pipeline on ``features`` with a float32 copy of a 16-bit ``engine`` (the
    same weights, computed without 16-bit rounding), as a callable run only when a 16-bit
    check fails: it says whether the SavedModel or the in-process engine drifts from the
    exact answer. None for an engine that computes in 32 bits or more already."""
    if engine.dtype.itemsize > 2:
        return None

    def run() -> dict:    # a second copy of the weights, held only for this call
        return _in_process(graph, float32_copy(engine), beam_width, top_k, config,
                           prefill_mask)(features)
    return run


def float32_copy(engine: Engine) -> Engine:
    """``engine`` with a float32 copy of its weights over the same catalog (no CUDA graphs):
    the search without 16-bit rounding that ``PRECISION_RULE`` compares with. Raises
    ``CapacityError`` where the copy does not fit the device."""
    try:
        return Engine(copy.deepcopy(engine.model), engine.catalog,
                      replace(engine.config, dtype="float32", cuda_graphs=False))
    except torch.OutOfMemoryError as e:   # the search itself reports its own
        raise CapacityError(f"no memory for a float32 copy of the model: {e}") from e


def check_against_python(saved_model, graph, engine, config: PipelineConfig, features: dict,
                         beam_width: int, top_k: int,
                         prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL) -> PipelineCheck:
    """Compares ``features`` (a request batch) through both pipelines (the engine searching
    with ``beam_width``, ``top_k`` and ``prefill_mask``, the lists cut by ``config``). With a
    prompt cache (``config.prompt_cache``) the SavedModel's requests carry a user key per row,
    so its first call fills the cache and its repeated calls (also compared) read it; the
    in-process reference runs without one."""
    python = _in_process(graph, engine, beam_width, top_k, config, prefill_mask)
    want, first = _timed(lambda: python(features))
    again = [_timed(lambda: python(features))[1] for _ in range(REFERENCE_REPEATS)]
    dtype = str(engine.dtype).removeprefix("torch.")
    saved_features = features
    if config.prompt_cache:
        rows = len(np.asarray(features["history_splits"])) - 1
        saved_features = {**features, USER_KEY: np.array(
            [f"verify-{row}".encode() for row in range(rows)], dtype=object)}
    report = verify_saved_model(saved_model, saved_features, want, repeats=SAVED_REPEATS,
                                dtype=dtype, wider=_wider_reference(
                                    graph, engine, config, features, beam_width, top_k,
                                    prefill_mask),
                                precise=_float32_reference(
                                    graph, engine, config, features, beam_width, top_k,
                                    prefill_mask))
    prompt = want["prompt_lengths"].numpy()
    return PipelineCheck(report=report, device=str(engine.device),
                         reference=f"the Python pipeline (Engine.recommend in {dtype})",
                         prompt_tokens_min=int(prompt.min()), prompt_tokens_max=int(prompt.max()),
                         python_first_call_seconds=first,
                         python_call_seconds=statistics.median(again),
                         items_per_request=tuple(int(n) for n in want["num_items"].numpy()))
