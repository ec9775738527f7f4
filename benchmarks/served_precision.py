"""Settles served answers that break the ranked-list rule against each other.

Two 16-bit programs (the plain and the cached SavedModel) each round apart from the exact
answer, so correct programs can differ by the sum of their errors, past one tie
(``xgr_common.tolerances``). Where a served answer breaks ``RANKED_LIST_RULE`` against the
other server's, ``PRECISION_RULE`` decides: a float32 search of the same weights and request
in this process, each tie widened by the in-process 16-bit engine's own largest score error
against it. The other server's answers for the same users are checked the same way, so a
reader sees whether one side drifts or both do.

Runs after the servers stop (the float32 copy of the weights needs the memory they held).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.session_load import ExportSettings


@dataclass(frozen=True)
class Reference:
    """One user's request through the in-process pipeline: the 16-bit engine's list and the
    float32 search's (each a pipeline output with one row)."""

    engine: dict
    precise: dict


def in_process_references(files: dict, settings: ExportSettings, requests: list[dict],
                          users: list[int]) -> dict[int, Reference]:
    """Each of ``users``' request (``requests[user]``, the features the servers got) through
    the in-process pipeline of the team ``files``, uncached: the engine the exports were
    made with (``settings``; its ``dtype`` the one they resolved) and its float32 copy.
    Raises ``CapacityError`` where the copy does not fit."""
    from xgr_export.check import float32_copy
    from xgr_export.config import EngineExportConfig, ExportConfig
    from xgr_export.export import (build_engine, pipeline_config_for, resolve_attention,
                                   resolve_selection, team_sources)
    from xgr_export.verify import ranked_lists
    from bridge.pipeline import RecommendPipeline

    config = ExportConfig(out=str(Path(files["model"]).parent / "precision"),
                          model=str(files["model"]), catalog=str(files["catalog"]),
                          feature_graph=str(files["feature_graph"]),
                          engine=EngineExportConfig(settings.beam_width, settings.top_k,
                                                    settings.max_batch, settings.device),
                          top_n=settings.top_k, dtype=settings.dtype)
    sources = team_sources(config)
    engine = build_engine(config, sources, resolve_attention("auto", settings.device),
                          resolve_selection(settings.device))
    lists = pipeline_config_for(config, sources.spec, prompt_cache=False)

    def pipeline(of):
        return RecommendPipeline.for_engine(sources.graph, of, settings.beam_width,
                                            settings.top_k, lists,
                                            prefill_mask=sources.prefill_mask)

    sixteen, precise = pipeline(engine), pipeline(float32_copy(engine))
    references = {}
    for user in tqdm(users, desc="float32 searches", unit="user"):
        references[user] = Reference(ranked_lists(sixteen(requests[user])),
                                     ranked_lists(precise(requests[user])))
    return references


def precision_verdict(broken: list[tuple[int, object]], others: dict[int, object],
                      references: dict[int, Reference], dtype: str) -> dict:
    """How many of the ``broken`` answers ((user, answer with ``items`` and ``scores``), one
    server's answers that broke the ranked-list rule against the other's) and of the other
    server's answers for the same users (``others``: user -> answer) break ``PRECISION_RULE``
    against ``references`` (``in_process_references`` of those users)."""
    from xgr_export.verify import first_break, item_score_error

    users = sorted({user for user, _ in broken})
    drift = max((item_score_error(references[u].engine, references[u].precise, None)
                 for u in users), default=0.0)

    def breaks(user: int, answer) -> bool:
        want = references[user].precise
        return first_break(np.asarray(answer.items), np.asarray(answer.scores),
                           want["item_ids"][0], want["scores"][0], dtype,
                           slack=drift) is not None

    return {"users": len(users), "answers": len(broken), "engine_drift": drift,
            "answers_broken": sum(breaks(user, answer) for user, answer in broken),
            "others_checked": sum(user in others for user in users),
            "others_broken": sum(breaks(user, others[user]) for user in users
                                 if user in others)}


def settle(files: dict, settings: ExportSettings, dtype: str, requests: list[dict],
           broken: list, reference: dict, enabled: bool = True) -> dict | None:
    """``PRECISION_RULE`` for the cached answers in ``broken`` (and the plain server's
    ``reference`` answers for the same users), printed; None where nothing needs it (no
    answer broke the rule, a 32-bit search, whose answers compare exactly, or not
    ``enabled``). A settling that fails (no memory for the float32 copy, say) is recorded as
    ``not_settled``, never raised: the benchmark writes its sweep's result all the same."""
    from xgr_common.errors import CapacityError
    from xgr_common.tolerances import TIE_DTYPES

    if dtype not in TIE_DTYPES or not broken or not enabled:
        return None
    users = sorted({user for user, _ in broken})
    print(f"settling {len(broken)} answers of {len(users)} users with a float32 search ...",
          flush=True)
    try:
        references = in_process_references(files, replace(settings, dtype=dtype), requests,
                                           users)
        verdict = precision_verdict(broken, reference, references, dtype)
    except Exception as error:  # noqa: BLE001  (the sweep's result is written all the same)
        kind = "no memory" if isinstance(error, CapacityError) else type(error).__name__
        print(f"not settled ({kind}): {error}", flush=True)
        return {"not_settled": f"{kind}: {error}"}
    print(f"against a float32 search (ties widened by the in-process engine's own error, "
          f"{verdict['engine_drift']:.3f}): {verdict['answers_broken']} of the "
          f"{verdict['answers']} cached answers break the rule; the plain server's answers "
          f"for the same users: {verdict['others_broken']} of {verdict['others_checked']}",
          flush=True)
    return verdict
