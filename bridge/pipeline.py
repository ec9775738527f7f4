"""The in-process pipeline: TF feature graph -> DLPack -> Torch engine -> DLPack -> TF rules.

This is the reference the exported SavedModel and the server are compared with, so every step
is deterministic: the same features give the same items and scores, bit for bit.

Stages, each timed (``StageTimings``, milliseconds):

    feature_graph  the team's TF graph: prompt tokens, soft profile vectors, cleaned history
    bridge_in      TF -> Torch hand-off (zero-copy on the CPU; one copy onto a GPU)
    engine         ``Engine.recommend``: input checks, prefill (shared prompt KV), constrained
                   beam search over the code levels, item expansion (CUDA graphs on a GPU)
    bridge_out     Torch -> TF hand-off of the items and scores
    post_process   business rules in TF (``BusinessRules``)

The engine never returns an item of the request's cleaned history (``exclude_items``): a
recommender should not offer what the user just took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np
import tensorflow as tf
import torch

from bridge.dlpack import to_tf, to_torch
from torch_engine.engine import Engine
from torch_engine.errors import ConfigError, InvalidInputError, require
from torch_engine.layout import MaskMode


@dataclass(frozen=True)
class BusinessRules:
    """Rules applied after the engine, in TF, the way the ranking team's graph applies them.

    blocked_items: item ids that must never be shown (withdrawn, out of stock, policy). The
        model was trained before they were blocked, so the engine may still produce them.
    max_per_category: at most this many items per level-0 code (the catalog's top category)
        in one list, keeping the best-scored ones; None = no cap. Keeps a list from being all
        one category when one dominates a user's history.
    """

    blocked_items: tuple[int, ...] = ()
    max_per_category: int | None = None

    def __post_init__(self) -> None:
        require(self.max_per_category is None or self.max_per_category >= 1, ConfigError,
                f"max_per_category must be None or >= 1, got {self.max_per_category}")


class PostProcessor(tf.Module):
    """TF post-processing: drop padding, blocked items and over-cap items, then compact.

    ``__call__(item_ids int64 [B, K], scores float32 [B, K])`` -> dict of ``item_ids [B, K]``
    (kept items first in engine order, then -1), ``scores [B, K]`` (-inf after the kept ones)
    and ``num_items int32 [B]``.
    """

    def __init__(self, item_ids: np.ndarray, item_codes: np.ndarray, rules: BusinessRules):
        super().__init__(name="post_process")
        self.rules = rules
        item_ids = np.asarray(item_ids, np.int64)
        self._category = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(item_ids), tf.constant(np.asarray(item_codes)[:, 0].astype(np.int64))),
            default_value=-1)
        blocked = np.asarray(rules.blocked_items, np.int64)
        self._blocked = None
        if blocked.size:
            self._blocked = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(blocked), tf.ones(blocked.shape, tf.int64)), default_value=0)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64),
                                  tf.TensorSpec([None, None], tf.float32)])
    def __call__(self, item_ids, scores):
        keep = item_ids >= 0
        if self._blocked is not None:
            keep &= tf.equal(self._blocked.lookup(item_ids), 0)
        if self.rules.max_per_category is not None:
            category = self._category.lookup(item_ids)                               # [B, K]
            width = tf.shape(item_ids)[1]
            earlier = tf.linalg.band_part(tf.ones([width, width], tf.bool), -1, 0) & \
                ~tf.eye(width, dtype=tf.bool)                                      # j < i
            same = tf.equal(category[:, :, None], category[:, None, :]) & keep[:, None, :]
            rank = tf.reduce_sum(tf.cast(same & earlier[None], tf.int32), axis=2)
            keep &= rank < self.rules.max_per_category
        # Stable sort on "dropped": kept items move to the front in engine order.
        order = tf.argsort(tf.cast(~keep, tf.int32), axis=1, stable=True)
        kept = tf.gather(keep, order, batch_dims=1)
        return {"item_ids": tf.where(kept, tf.gather(item_ids, order, batch_dims=1),
                                     tf.constant(-1, tf.int64)),
                "scores": tf.where(kept, tf.gather(scores, order, batch_dims=1),
                                   tf.constant(-np.inf, tf.float32)),
                "num_items": tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)}


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
        self.post_process = PostProcessor(item_ids, item_codes, rules)

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

        graph = self.feature_graph(features)
        history = tf.RaggedTensor.from_row_splits(graph["history_values"],
                                                  graph["history_splits"])
        # At least one column: -1 pads rows (and whole batches) without a history.
        exclude = tf.concat([history.to_tensor(default_value=-1),
                             tf.fill([tf.shape(graph["lengths"])[0], 1],
                                     tf.constant(-1, tf.int64))], axis=1)
        t_graph = lap()

        device = self.engine.device
        token_ids = to_torch(graph["token_ids"], device)
        lengths = to_torch(graph["lengths"], device)
        segment_ids = to_torch(graph["segment_ids"], device)
        profile = to_torch(graph["profile_embeds"], device).to(self.engine.dtype)
        excluded = to_torch(exclude, device)
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
