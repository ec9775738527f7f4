"""The TF halves of the recommend pipeline, shared by the SavedModel and the in-process pipeline.

Both run: request features (``INPUTS``, 1-D, batch dynamic) -> the feature graph, traced with
``feature_signature()`` -> ``engine_feeds`` (its outputs plus ``exclude_items``) -> the engine,
fed the feeds named by ``engine_inputs`` (``ENGINE_INPUTS``) -> ``post_processor`` (the rules of
``tf_frontend.rules``) -> ``OUTPUTS``. ``xgr_export.saved_model`` puts the engine behind
``TorchCall``; ``bridge.pipeline`` calls it from Python over DLPack. Written once here, the two
cannot apply different rules or see different feature values.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from tf_frontend.feature_graph import INPUTS
from tf_frontend.rules import (BusinessRules, PostProcessor, cut_to_request_top_k,
                               engine_feeds, with_request_exclusions)
from xgr_common.errors import ConfigError, require
from xgr_common.serving_names import USER_KEY

# The engine's inputs, in order: what the feature graph emits plus the history to exclude.
ENGINE_INPUTS = ("token_ids", "lengths", "segment_ids", "profile_embeds", "exclude_items")
OUTPUTS = ("item_ids", "scores", "num_items")
# A request's own controls (CONTROLS_SIGNATURE): items it must not get back, ragged like the
# history (``exclude_splits`` [B+1] partitions ``exclude_items``), and its own top_k [B] (at
# most the export's).
CONTROLS = {"exclude_items": tf.int64, "exclude_splits": tf.int64, "top_k": tf.int32}
# A request's beam width [B] (one value for all its rows), where the engine serves several
# (PipelineConfig.beam_widths); the engine reads it as the length of BEAM_SLOTS.
WIDTH_CONTROL = "beam_width"
BEAM_SLOTS = "beam_slots"
# With a prompt cache (PipelineConfig.prompt_cache): a request's user key (a string, e.g. the
# user id; empty: not cached), and what the engine gets besides its inputs: the version 2
# feature graph's frozen_lengths and the keys as uint8 [B, 8] fingerprints (all zero: none).
CACHE_FEEDS = ("frozen_lengths", "user_keys")
# Longest user key that is used (bytes); a longer or empty one is no key.
MAX_USER_KEY_BYTES = 256


@dataclass(frozen=True)
class PipelineConfig:
    """TF-side settings: ``top_n`` items returned per request after the business rules
    (``rules``, ``tf_frontend.rules``); torch threads per calling TF thread; AOTInductor model
    instances that may run at once."""

    top_n: int = 10
    intra_op_threads: int = 1
    concurrency: int = 1
    # Longest raw history row a server accepts (before cleaning keeps the last N): a guard
    # against oversized requests, written to assets.extra/xgr_serving.json for `xgr serve`.
    max_history_events: int = 4096
    rules: BusinessRules = BusinessRules()
    # The most items one request may exclude through CONTROLS_SIGNATURE (0: no such
    # signature); the engine package must accept that many exclusion columns beside the
    # history.
    max_request_exclusions: int = 0
    # The beam widths a request may ask for through CONTROLS_SIGNATURE's beam_width (empty:
    # the engine's one width), and the width of a request that names none.
    beam_widths: tuple[int, ...] = ()
    beam_width: int | None = None
    # The engine keeps a prompt-KV cache of the version 2 prompt's frozen part
    # (xgr_export.cached_package): the signature takes each request's user key.
    prompt_cache: bool = False

    def __post_init__(self) -> None:
        for name in ("top_n", "intra_op_threads", "concurrency", "max_history_events"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"PipelineConfig.{name} must be a positive int, got {value!r}")
        value = self.max_request_exclusions
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                ConfigError, f"PipelineConfig.max_request_exclusions must be an int >= 0, "
                f"got {value!r}")
        require(isinstance(self.beam_widths, tuple) and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in self.beam_widths),
            ConfigError, f"PipelineConfig.beam_widths must be a tuple of positive ints, got "
            f"{self.beam_widths!r}")
        require(not self.beam_widths or (self.beam_width in self.beam_widths
                                         and self.max_request_exclusions > 0), ConfigError,
                f"PipelineConfig.beam_widths {self.beam_widths} need beam_width, the default, "
                f"among them (got {self.beam_width!r}) and the controls signature "
                f"(max_request_exclusions > 0, got {self.max_request_exclusions})")
        require(isinstance(self.rules, BusinessRules), ConfigError,
                f"PipelineConfig.rules must be a BusinessRules, got {type(self.rules).__name__}")


def feature_signature() -> dict[str, tf.TensorSpec]:
    """The request features as the SavedModel's signature takes them: 1-D, any length."""
    return {name: tf.TensorSpec([None], dtype, name=name) for name, dtype in INPUTS.items()}


def engine_inputs_of(config: PipelineConfig) -> tuple[str, ...]:
    """The engine's inputs: ``ENGINE_INPUTS``, then ``beam_slots`` where it serves several
    widths, then ``CACHE_FEEDS`` where it keeps a prompt cache."""
    return (ENGINE_INPUTS + ((BEAM_SLOTS,) if config.beam_widths else ())
            + (CACHE_FEEDS if config.prompt_cache else ()))


def serving_signature(config: PipelineConfig) -> dict[str, tf.TensorSpec]:
    """What ``serving_default`` takes: the request features, and each request's user key
    where the engine keeps a prompt cache."""
    extra = {USER_KEY: tf.TensorSpec([None], tf.string, name=USER_KEY)} \
        if config.prompt_cache else {}
    return {**feature_signature(), **extra}


def user_keys(keys: tf.Tensor) -> tf.Tensor:
    """uint8 ``[B, 8]`` fingerprints of the user keys (string ``[B]``) the engine's prompt
    cache selects entries by; all zero (no key: not cached) for an empty key or one over
    ``MAX_USER_KEY_BYTES``. A fingerprint only selects: the cached content decides."""
    keys = tf.convert_to_tensor(keys, tf.string)
    size = tf.strings.length(keys)
    usable = (size >= 1) & (size <= MAX_USER_KEY_BYTES)
    prints = tf.fingerprint(keys)
    return tf.where(usable[:, None], prints, tf.zeros_like(prints))


def controls_of(config: PipelineConfig) -> dict[str, tf.DType]:
    """The controls a request may send: ``CONTROLS``, and ``beam_width`` where the engine
    serves several widths."""
    return {**CONTROLS, **({WIDTH_CONTROL: tf.int32} if config.beam_widths else {})}


def controls_signature(config: PipelineConfig = PipelineConfig()) -> dict[str, tf.TensorSpec]:
    """The features (and user key, ``serving_signature``) plus each request's own controls
    (``controls_of``), as ``serving_with_controls`` takes them."""
    return {**serving_signature(config), **{name: tf.TensorSpec([None], dtype, name=name)
                                            for name, dtype in controls_of(config).items()}}


def with_beam_slots(feeds: dict[str, tf.Tensor], controls: dict[str, tf.Tensor] | None,
                    config: PipelineConfig) -> dict[str, tf.Tensor]:
    """``feeds`` plus ``beam_slots`` (int8 ``[W]``: the engine's width is its length) where
    the engine serves several widths: the width every row of the call asks for
    (``controls["beam_width"]``), or the default. Refused with ``InvalidArgument`` naming
    ``beam_width`` when the rows disagree (one width per call) or the width is not one of
    ``config.beam_widths``."""
    if not config.beam_widths:
        return feeds
    rows = tf.shape(feeds["lengths"])[0]
    asked = (tf.cast(controls[WIDTH_CONTROL], tf.int32)
             if controls is not None and WIDTH_CONTROL in controls
             else tf.fill([rows], tf.constant(config.beam_width, tf.int32)))
    width = tf.reduce_max(asked)
    checks = [
        tf.debugging.assert_equal(
            tf.shape(asked)[0], rows,
            message=f"{WIDTH_CONTROL} must give one width per request"),
        tf.debugging.assert_equal(
            tf.reduce_min(asked), width,
            message=f"{WIDTH_CONTROL} must be the same for every request of one call (the "
                    f"engine runs one width per call)"),
        tf.debugging.assert_equal(
            tf.reduce_any(tf.equal(width, tf.constant(config.beam_widths, tf.int32))), True,
            message=f"{WIDTH_CONTROL} must be one of {list(config.beam_widths)}"),
    ]
    with tf.control_dependencies(checks):
        slots = tf.zeros(tf.reshape(width, [1]), tf.int8)
    return {**feeds, BEAM_SLOTS: slots}


def apply_controls(feeds: dict[str, tf.Tensor], controls: dict[str, tf.Tensor],
                   config: PipelineConfig) -> dict[str, tf.Tensor]:
    """``feeds`` with a request's own exclusions joined to its history's (on the device);
    its ``top_k`` applies to the engine's lists (``cut_to_request_top_k``)."""
    require(config.max_request_exclusions > 0, ConfigError,
            "this pipeline takes no per-request exclusions (PipelineConfig."
            "max_request_exclusions is 0)")
    exclude = with_request_exclusions(feeds["exclude_items"], controls["exclude_items"],
                                      controls["exclude_splits"], config.max_request_exclusions)
    return {**feeds, "exclude_items": exclude}


def post_processor(config: PipelineConfig, catalog=None) -> PostProcessor:
    """The rules of ``config`` cutting lists to ``config.top_n``; ``catalog``
    (``(item_ids, item_codes)``) is needed only for ``rules.max_per_category``."""
    item_ids, item_codes = catalog if catalog is not None else (None, None)
    return PostProcessor(config.rules, config.top_n, item_ids, item_codes)


def traced_feeds(feature_graph, rules: BusinessRules) -> tf.types.experimental.PolymorphicFunction:
    """features -> engine feeds, traced as the SavedModel's ``serve`` traces them: graph mode
    may fuse kernels and round floats unlike eager ``feature_graph(features)``, so an
    in-process reference must run the graph this way to match the SavedModel exactly."""
    return tf.function(lambda features: engine_feeds(feature_graph(features), rules),
                       input_signature=[feature_signature()])


def engine_lists(item_ids: tf.Tensor, scores: tf.Tensor,
                 controls: dict[str, tf.Tensor] | None) -> tuple[tf.Tensor, tf.Tensor]:
    """The engine's lists as the rules see them: cut to each request's ``top_k`` when the
    request sent controls."""
    if controls is None:
        return item_ids, scores
    return cut_to_request_top_k(item_ids, scores, controls["top_k"])


def seen_items(feeds: dict[str, tf.Tensor], engine_inputs: tuple[str, ...]) -> tf.Tensor | None:
    """The history the post-processor must drop: none when the engine took ``exclude_items``
    (it never returns them), else the history itself."""
    return None if "exclude_items" in engine_inputs else feeds["exclude_items"]
