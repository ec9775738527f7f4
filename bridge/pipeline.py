"""The in-process pipeline: TF feature graph -> DLPack -> Torch engine -> DLPack -> TF rules.

This is the reference the exported SavedModel and the server are compared with, so every step
is deterministic: the same features give the same items and scores, bit for bit.

Stages, each timed (``StageTimings``, milliseconds):

    feature_graph  the team's TF graph: prompt tokens, soft profile vectors, cleaned history
    bridge_in      TF -> Torch hand-off (zero-copy on the CPU; one copy onto a GPU)
    engine         ``Engine.recommend``: input checks, prefill (shared prompt KV), constrained
                   beam search over the code levels, item expansion (CUDA graphs on a GPU)
    bridge_out     Torch -> TF hand-off of the items and scores
    post_process   business rules in TF (``tf_frontend.rules``)

The rules are the ones the exported SavedModel applies (``tf_frontend.rules``): the engine never
returns an item of the request's cleaned history (``exclude_items``, a recommender should not
offer what the user just took); blocked and over-cap items are dropped after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np
import torch

from bridge import to_tf, to_torch
from tf_frontend.rules import BusinessRules, PostProcessor, engine_feeds
from torch_engine.engine import Engine
from xgr_common.errors import ConfigError, InvalidInputError, require
from xgr_common.layout import MaskMode

__all__ = ["BusinessRules", "PostProcessor", "RecommendPipeline", "StageTimings"]


@dataclass(frozen=True)
class StageTimings:
    """Wall time of each stage of one ``recommend`` call, in milliseconds."""

    feature_graph: float
    bridge_in: float
    engine: float
    bridge_out: float
    post_process: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def rows(self) -> list[tuple[str, float]]:
        """(stage, ms) rows in pipeline order, then the total."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)] + [("total", self.total)]


class RecommendPipeline:
    """Features in, recommended items out, in one process.

    feature_graph: a ``tf_frontend.feature_graph.FeatureGraph`` (or any Keras model with its
    inputs and outputs); engine: a ``torch_engine.Engine`` over the same catalog; rules: the
    TF post-processing; item_ids/item_codes: the catalog (for the rules' category lookup);
    prefill_mask: the mask the model was trained with. ``ITEM_CAUSAL`` hands the graph's
    segment ids to the engine (hybrid-mask prefill); ``CAUSAL`` leaves them out.
    """

    def __init__(self, feature_graph, engine: Engine, item_ids: np.ndarray,
                 item_codes: np.ndarray, rules: BusinessRules = BusinessRules(),
                 prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL):
        require(MaskMode(prefill_mask) in (MaskMode.ITEM_CAUSAL, MaskMode.CAUSAL), ConfigError,
                f"prefill_mask must be item_causal or causal (the engine's two prompt masks), "
                f"got {prefill_mask!r}")
        self.feature_graph = feature_graph
        self.engine = engine
        self.rules = rules
        self.prefill_mask = MaskMode(prefill_mask)
        self.post_process = PostProcessor(rules, None, item_ids, item_codes)

    def _sync(self) -> None:
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)

    def recommend(self, features: dict, beam_width: int = 256, top_k: int = 300) -> dict:
        """Top items for each request of ``features`` (``FeatureGraph``'s input dict, B rows).

        Returns ``item_ids`` int64 ``[B, top_k]`` and ``scores`` float32 ``[B, top_k]`` (TF
        tensors; best first, -1 / -inf after the last kept item), ``num_items`` int32 ``[B]``,
        ``prompt_lengths`` int32 ``[B]``, the cleaned history the engine excluded
        (``history_values`` int64 ``[E']``, ``history_splits`` int64 ``[B+1]``) and ``timings``
        (a ``StageTimings``).
        """
        require(isinstance(features, dict), InvalidInputError,
                f"features must be a dict of tensors, got {type(features).__name__}")
        clock = [time.perf_counter()]

        def lap() -> float:
            clock.append(time.perf_counter())
            return (clock[-1] - clock[-2]) * 1e3

        graph = engine_feeds(self.feature_graph(features), self.rules)
        t_graph = lap()

        device = self.engine.device
        token_ids = to_torch(graph["token_ids"], device)
        lengths = to_torch(graph["lengths"], device)
        segment_ids = to_torch(graph["segment_ids"], device)
        profile = to_torch(graph["profile_embeds"], device).to(self.engine.dtype)
        excluded = to_torch(graph["exclude_items"], device)
        self._sync()
        t_in = lap()

        if self.prefill_mask is MaskMode.CAUSAL:
            segment_ids = None
        items, scores = self.engine.recommend(token_ids, lengths, segment_ids, beam_width,
                                              top_k, prefix_embeds=profile,
                                              exclude_items=excluded)
        self._sync()
        t_engine = lap()

        items_tf, scores_tf = to_tf(items.contiguous()), to_tf(scores.float().contiguous())
        t_out = lap()
        out = self.post_process(items_tf, scores_tf)
        t_post = lap()
        return {**out, "prompt_lengths": graph["lengths"],
                "history_values": graph["history_values"],
                "history_splits": graph["history_splits"],
                "timings": StageTimings(t_graph, t_in, t_engine, t_out, t_post)}
