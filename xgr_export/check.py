"""``xgr export --verify_requests N``: the saved pipeline against the in-process one.

The same synthetic requests go through ``xgr_export.saved_model.PythonPipeline`` (feature graph ->
DLPack -> ``Engine.recommend`` on the engine's device -> the rules) in this process and through
the SavedModel in a fresh process with TensorFlow and ``custom_ops`` alone
(``xgr_export.verify``). The items must be equal; the report also times both.
"""

from __future__ import annotations

import statistics
import time

import torch

from xgr_export.saved_model import PythonPipeline
from tf_frontend.feature_graph import features_from_world
from xgr_export.verify import verify_saved_model

REFERENCE_REPEATS = 3   # timed in-process calls after the first
SAVED_REPEATS = 10      # timed fresh-process calls after the first


def _python_recommend(engine, beam_width: int, top_k: int):
    def recommend(token_ids, lengths, segment_ids, profile_embeds, exclude_items):
        with torch.no_grad():
            return engine.recommend(token_ids, lengths, segment_ids, beam_width=beam_width,
                                    top_k=top_k, prefix_embeds=profile_embeds.to(engine.dtype),
                                    exclude_items=exclude_items)
    return recommend


def _timed(call) -> tuple[object, float]:
    started = time.perf_counter()
    value = call()
    return value, time.perf_counter() - started


def verify_against_python(saved_model, graph, engine, config, world, requests: int,
                          beam_width: int, top_k: int) -> dict:
    """Compares ``requests`` synthetic users (the world's first) through both pipelines;
    returns the ``VerifyReport`` as JSON plus timings, and prints a summary."""
    features = features_from_world(world, slice(0, requests))
    python = PythonPipeline(graph, _python_recommend(engine, beam_width, top_k), config,
                            device=str(engine.device))
    want, first = _timed(lambda: python(features))
    again = [_timed(lambda: python(features))[1] for _ in range(REFERENCE_REPEATS)]
    report = verify_saved_model(saved_model, features, want, repeats=SAVED_REPEATS)
    prompt = graph(features)["lengths"].numpy()
    result = {**report.to_json(), "prompt_tokens_min": int(prompt.min()),
              "prompt_tokens_max": int(prompt.max()),
              "python_first_call_seconds": first,
              "python_call_seconds": statistics.median(again),
              "items_per_request": [int(n) for n in want["num_items"].numpy()]}
    verdict = "equal" if report.ok else "DIFFERENT"
    print(f"verify: {requests} requests (prompts {result['prompt_tokens_min']}-"
          f"{result['prompt_tokens_max']} tokens): fresh-process SavedModel vs Python pipeline "
          f"on {engine.device}: items {verdict} ({report.rows_exact}/{report.requests} rows "
          f"exact, num_items {'equal' if report.num_items_exact else 'DIFFERENT'}, max score "
          f"error {report.max_score_error:.2e} <= {report.score_atol:.2e}); modules "
          f"{'clean' if not report.forbidden_modules else report.forbidden_modules}\n"
          f"  batch of {requests}: SavedModel {report.call_seconds * 1e3:.1f} ms per call "
          f"(load {report.load_seconds:.1f} s, first call {report.first_call_seconds:.1f} s); "
          f"Python pipeline {result['python_call_seconds'] * 1e3:.1f} ms", flush=True)
    for row in report.mismatched_rows[:5]:
        print(f"  row {row['row']} differs first at {row['position']}: got {row['got']} "
              f"({row['got_score']:.6f}), want {row['want']} ({row['want_score']:.6f})")
    return result
