"""The in-process pipeline: TF feature graph -> DLPack -> a Torch engine -> DLPack -> TF rules.

The one pipeline that runs in a Python process: the development path, the demo's, and the
reference an exported SavedModel (``xgr_export``) must match item for item. So it runs the
SavedModel's TF halves (``tf_frontend.pipeline_spec``): the feature graph traced the same way,
the same engine feeds, the same rules (``tf_frontend.rules``: the engine never returns an item
of the request's cleaned history; blocked and over-cap items are dropped after it).

Stages, each timed (``StageTimings``, milliseconds):

    feature_graph  the team's TF graph: prompt tokens, soft profile vectors, cleaned history
    bridge_in      TF -> Torch hand-off (zero-copy on the CPU; one copy onto a GPU)
    engine         the engine call, e.g. ``Engine.recommend`` (``EngineSearch``): input
                   checks, prefill, constrained beam search over the code levels, item expansion
    bridge_out     Torch -> TF hand-off of the items and scores
    post_process   business rules in TF
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Callable

import torch

from bridge import to_tf, to_torch
from tf_frontend.feature_graph import INPUTS
from tf_frontend.pipeline_spec import (PipelineConfig, apply_controls, controls_of,
                                       engine_inputs_of, engine_lists, post_processor,
                                       seen_items, traced_feeds, with_beam_slots)
from xgr_common.errors import ConfigError, InvalidInputError, require
from xgr_common.layout import MaskMode
from xgr_common.model_card import served_mask

if TYPE_CHECKING:
    from torch_engine.engine import Engine

__all__ = ["EngineSearch", "RecommendPipeline", "StageTimings"]


@dataclass(frozen=True)
class StageTimings:
    """Wall time of each stage of one pipeline call, in milliseconds."""

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


@dataclass(frozen=True)
class EngineSearch:
    """``Engine.recommend`` with fixed ``beam_width`` and ``top_k``, called with the pipeline's
    engine inputs (token_ids int32 [B, L], lengths int32 [B], segment_ids int32 [B, L],
    profile_embeds float32 [B, S, hidden], exclude_items int64 [B, X], and where the pipeline
    serves several widths beam_slots [W], whose length is the call's width); returns item_ids
    int64 [B, top_k] and scores [B, top_k].

    prefill_mask: the mask the model was trained with. ``ITEM_CAUSAL`` hands the graph's
    segment ids to the engine (hybrid-mask prefill); ``CAUSAL`` leaves them out.
    """

    engine: "Engine"
    beam_width: int
    top_k: int
    prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_mask", served_mask(self.prefill_mask))

    def __call__(self, token_ids, lengths, segment_ids, profile_embeds, exclude_items,
                 beam_slots=None):
        engine = self.engine
        if self.prefill_mask is MaskMode.CAUSAL:
            segment_ids = None
        width = self.beam_width if beam_slots is None else int(beam_slots.shape[0])
        with torch.no_grad():
            return engine.recommend(token_ids, lengths, segment_ids, width, self.top_k,
                                    prefix_embeds=profile_embeds.to(engine.dtype),
                                    exclude_items=exclude_items)


class RecommendPipeline:
    """Features in, recommended items out, in one process.

    feature_graph: a ``tf_frontend.feature_graph.FeatureGraph`` (or any Keras model with its
    inputs and outputs); recommend: the engine, called with torch tensors named by
    ``engine_inputs`` on ``device`` and returning (item_ids, scores) (an ``EngineSearch``, a
    packaged torch module, ...); config: ``top_n`` and the business rules; catalog:
    ``(item_ids, item_codes)``, needed only for ``rules.max_per_category``.
    """

    def __init__(self, feature_graph, recommend: Callable,
                 config: PipelineConfig = PipelineConfig(),
                 engine_inputs: tuple[str, ...] | None = None, catalog=None,
                 device: str | torch.device = "cpu"):
        require(isinstance(config, PipelineConfig), ConfigError,
                f"config must be a PipelineConfig, got {type(config).__name__}")
        self.feature_graph, self.recommend, self.config = feature_graph, recommend, config
        self.engine_inputs = tuple(engine_inputs_of(config) if engine_inputs is None
                                   else engine_inputs)
        self.device = torch.device(device)
        self.post_process = post_processor(config, catalog)
        self._feeds = traced_feeds(feature_graph, config.rules)

    @classmethod
    def for_engine(cls, feature_graph, engine: "Engine", beam_width: int, top_k: int,
                   config: PipelineConfig | None = None, catalog=None,
                   prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL) -> "RecommendPipeline":
        """The pipeline over ``Engine.recommend`` on the engine's device; ``config`` defaults
        to lists of ``top_k`` items under the default rules."""
        return cls(feature_graph, EngineSearch(engine, beam_width, top_k, prefill_mask),
                   config or PipelineConfig(top_n=top_k), catalog=catalog, device=engine.device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, features: dict) -> dict:
        """Top items for each request of ``features`` (``FeatureGraph``'s input dict, B rows).

        With ``exclude_items``, ``exclude_splits`` and ``top_k`` among ``features``
        (``controls_of(config)``, and ``beam_width`` where the config names widths), each
        request's own exclusions join its history's and its list is cut to its own top_k, and
        the call runs at the requests' width, as in ``serving_with_controls``.

        Returns ``item_ids`` int64 ``[B, top_n]`` and ``scores`` float32 ``[B, top_n]`` (TF
        tensors; best first, -1 / -inf after the last kept item), ``num_items`` int32 ``[B]``,
        ``prompt_lengths`` int32 ``[B]``, the cleaned history the engine excluded
        (``history_values`` int64 ``[E']``, ``history_splits`` int64 ``[B+1]``) and ``timings``
        (a ``StageTimings``).
        """
        require(isinstance(features, dict), InvalidInputError,
                f"features must be a dict of tensors, got {type(features).__name__}")
        missing = sorted(set(INPUTS) - set(features))
        require(not missing, InvalidInputError,
                f"features lack {missing}; the feature graph needs {sorted(INPUTS)}")
        clock = [time.perf_counter()]

        def lap() -> float:
            clock.append(time.perf_counter())
            return (clock[-1] - clock[-2]) * 1e3

        feeds = self._feeds({name: features[name] for name in INPUTS})
        names = controls_of(self.config)
        given = [name for name in names if name in features]
        controls = None
        if given:   # a request's own controls, as serving_with_controls takes them
            require(len(given) == len(names), InvalidInputError,
                    f"features hold {given} without {sorted(set(names) - set(given))}: "
                    f"per-request controls need all of {sorted(names)}")
            controls = {name: features[name] for name in names}
            feeds = apply_controls(feeds, controls, self.config)
        feeds = with_beam_slots(feeds, controls, self.config)
        t_graph = lap()
        args = [to_torch(feeds[name], self.device) for name in self.engine_inputs]
        self._sync()
        t_in = lap()
        item_ids, scores = self.recommend(*args)
        self._sync()
        t_engine = lap()
        items_tf = to_tf(item_ids.cpu().contiguous())
        scores_tf = to_tf(scores.float().cpu().contiguous())
        t_out = lap()
        items_tf, scores_tf = engine_lists(items_tf, scores_tf, controls)
        out = self.post_process(items_tf, scores_tf, seen_items(feeds, self.engine_inputs))
        t_post = lap()
        return {**out, "prompt_lengths": feeds["lengths"],
                "history_values": feeds["history_values"],
                "history_splits": feeds["history_splits"],
                "timings": StageTimings(t_graph, t_in, t_engine, t_out, t_post)}
