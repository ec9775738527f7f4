"""The reference feature graph: a team's existing TF graph, built from the project's C++ ops and
standard Keras pieces, that turns a request into the engine's prompt.

Every stage is its own named layer (``STAGES``, in call order); ``FeatureGraph.call`` looks
each one up by name at call time, so ``replace_stage`` can swap one for a layer with the same
call signature (the migration toolkit swaps in Torch stages this way).

Inputs (dense tensors, TF-Serving friendly; ragged histories as values + row_splits)::

    user_id int64 [B]          country string [B]         request_time int64 [B]
    history_items int64 [E]    history_times int64 [E]    history_splits int64 [B+1]

Outputs::

    token_ids int32 [B, L]     lengths int32 [B]          segment_ids int32 [B, L]
    profile_embeds float32 [B, S, model_hidden]           profile_ids int64 [B, 2]
    history_values int64 [E'], history_splits int64 [B+1]  (cleaned history, known items only)
    unknown_items int64 [B]    (cleaned history items missing from the catalog)

with L = ``spec.max_prompt_tokens`` and S = ``spec.profile_tokens``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

import custom_ops
from tf_frontend.layers import HashProfileIds, XgrAssemblePrompt, XgrCleanSequence, \
    XgrSemanticIdLookup
from xgr_common.errors import ConfigError, InvalidInputError, require
from xgr_common.prompt_spec import PromptSpec

STAGES = ("clean_history", "semantic_ids", "context_lookup", "hash_ids", "sparse_embedding",
          "profile_tower", "profile_projection", "assemble_prompt")

# name -> dtype of each input feature; all are 1-D.
INPUTS = {"user_id": tf.int64, "country": tf.string, "history_items": tf.int64,
          "history_times": tf.int64, "history_splits": tf.int64, "request_time": tf.int64}
OUTPUTS = ("token_ids", "lengths", "segment_ids", "profile_embeds", "profile_ids",
           "history_values", "history_splits", "unknown_items")


class FeatureGraph(keras.Model):
    """Request features -> prompt tokens, soft-prompt vectors and the seen-item history.

    Args:
      spec: the graph <-> engine contract (windows, vocabularies, tower sizes, token layout).
      item_ids: int64 [N], the catalog's item ids (unique).
      item_codes: int [N, levels], each item's semantic-ID code path.
      embedding_table: float32 [embedding_buckets, embedding_dim] to start the sparse table
        from; None draws it from ``seed``.
      tower_weights: ``{"profile_tower": [kernel, bias], "profile_projection": [kernel, bias]}``
        in Keras layout; None draws them from ``seed``.
      seed: seeds every initializer that is not given explicitly.
    """

    def __init__(self, spec: PromptSpec, item_ids: np.ndarray, item_codes: np.ndarray,
                 embedding_table: np.ndarray | None = None, tower_weights: dict | None = None,
                 seed=0):
        super().__init__(name="feature_graph")
        # Each graph assembles one prompt version; a model of the other is refused by name.
        spec.require_version(self.prompt_version,
                             f"{type(self).__name__} (the version {self.prompt_version} "
                             f"feature graph)")
        require(spec.profile_tokens >= 1, ConfigError,
                f"FeatureGraph needs spec.profile_tokens >= 1, got {spec.profile_tokens}")
        self.spec = spec
        layout = spec.layout
        # The catalog file backs the table; the SavedModel copies it into its assets/ folder.
        self._catalog_dir = tempfile.TemporaryDirectory(prefix="xgr_catalog_")
        table = custom_ops.SemanticIdTable.from_arrays(
            Path(self._catalog_dir.name) / "catalog.xgrsid", np.asarray(item_ids, np.int64),
            np.asarray(item_codes), layout.codebook_size)
        require(table.levels == layout.levels, ConfigError,
                f"item_codes have {table.levels} levels, spec.layout.levels is {layout.levels}")

        self._build_history_stage(spec)
        self.semantic_ids = XgrSemanticIdLookup(table, layout.code_base, name="semantic_ids")
        self.context_lookup = keras.layers.StringLookup(
            vocabulary=list(spec.context_vocab), num_oov_indices=1, mask_token=None,
            output_mode="int", name="context_lookup")
        self.hash_ids = HashProfileIds(spec.embedding_buckets, name="hash_ids")
        self.sparse_embedding = keras.layers.Embedding(
            spec.embedding_buckets, spec.embedding_dim, name="sparse_embedding",
            embeddings_initializer=_initializer(embedding_table, seed,
                                                (spec.embedding_buckets, spec.embedding_dim)))
        self.profile_tower = keras.layers.Dense(
            spec.tower_hidden, activation="silu", name="profile_tower",
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 1))
        self.profile_projection = keras.layers.Dense(
            spec.profile_tokens * spec.model_hidden, name="profile_projection",
            kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2))
        self._build_assembly_stage(spec)
        self.sparse_embedding.build((None, 2))
        self.profile_tower.build((None, 2 * spec.embedding_dim))
        self.profile_projection.build((None, spec.tower_hidden))
        if tower_weights is not None:
            _set_tower_weights(self, tower_weights)

    prompt_version = 1
    stages = STAGES
    feature_outputs = OUTPUTS

    def _build_history_stage(self, spec: PromptSpec) -> None:
        self.clean_history = XgrCleanSequence(spec.window_seconds, spec.keep_last,
                                              name="clean_history")

    def _build_assembly_stage(self, spec: PromptSpec) -> None:
        self.assemble_prompt = XgrAssemblePrompt(spec.layout, spec.max_prompt_tokens,
                                                 name="assemble_prompt")

    @property
    def _default_save_signature(self):
        # Keras would trace call() for SavedModel export with float32 stand-ins for every
        # input; tf_frontend.saved_model declares the real signature instead.
        return None

    def stage(self, name: str) -> keras.layers.Layer:
        """The layer of stage ``name`` (one of ``STAGES``)."""
        require(name in self.stages, InvalidInputError,
                f"unknown stage {name!r}; stages: {self.stages}")
        return getattr(self, name)

    def replace_stage(self, name: str, layer) -> None:
        """Swaps stage ``name`` for ``layer`` (any callable with the stage's call signature)."""
        self.stage(name)
        setattr(self, name, layer)

    def call(self, features: dict) -> dict:
        """Features (see the module docstring) -> the output dict."""
        missing = sorted(set(INPUTS) - set(features))
        require(not missing, InvalidInputError,
                f"features lack {missing}; {type(self).__name__} needs {sorted(INPUTS)}")
        spec = self.spec
        # StringLookup: 0 = out of vocabulary, k = context_vocab[k-1]; the context token is
        # spec.context_token(k - 1), i.e. profile_base + k.
        context_index = tf.cast(self.stage("context_lookup")(features["country"]), tf.int64)
        context_tokens = (context_index + spec.context_token(-1))[:, tf.newaxis]
        profile_ids = self.stage("hash_ids")(features["user_id"], features["country"])
        embedded = self.stage("sparse_embedding")(profile_ids)            # [B, 2, dim]
        flat = tf.reshape(embedded, [-1, 2 * spec.embedding_dim])         # [user | country]
        hidden = self.stage("profile_tower")(flat)
        profile = tf.reshape(self.stage("profile_projection")(hidden),
                             [-1, spec.profile_tokens, spec.model_hidden])
        return {**self._prompt(features, context_tokens),
                "profile_embeds": tf.cast(profile, tf.float32), "profile_ids": profile_ids}

    def _prompt(self, features: dict, context_tokens) -> dict:
        """The prompt and the history outputs of the version 1 prompt."""
        values, _, splits = self.stage("clean_history")(
            features["history_items"], features["history_times"], features["history_splits"],
            features["request_time"])
        code_tokens, code_splits, unknown, known_values = self._codes(values, splits)
        token_ids, lengths, segment_ids = self.stage("assemble_prompt")(
            context_tokens, code_tokens, code_splits)
        return {"token_ids": token_ids, "lengths": lengths, "segment_ids": segment_ids,
                "history_values": known_values, "history_splits": code_splits,
                "unknown_items": unknown}

    def _codes(self, values, splits):
        """(code tokens, their row splits, unknown count per row, the known items) of ragged
        items ``values`` / ``splits``."""
        code_tokens, code_splits, unknown = self.stage("semantic_ids")(values, splits)
        # The same lookup, one item per row: its unknown count marks each unknown item, so the
        # seen-item history keeps exactly the items whose codes reach the prompt (whose row
        # splits are therefore ``code_splits``).
        one_per_row = tf.range(tf.size(values, out_type=tf.int64) + 1)
        _, _, unknown_each = self.stage("semantic_ids")(values, one_per_row)
        known_values = tf.boolean_mask(values, tf.equal(unknown_each, 0))
        return code_tokens, code_splits, unknown, known_values


def _initializer(table: np.ndarray | None, seed: int, shape: tuple[int, int]):
    if table is None:
        return keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
    table = np.asarray(table, np.float32)
    require(table.shape == shape, InvalidInputError,
            f"embedding_table must have shape {shape} (embedding_buckets, embedding_dim), "
            f"got {table.shape}")
    return keras.initializers.Constant(table)


def _set_tower_weights(graph: FeatureGraph, weights: dict) -> None:
    for name in ("profile_tower", "profile_projection"):
        require(name in weights, InvalidInputError,
                f"tower_weights lacks {name!r}; expected keys profile_tower, profile_projection")
        layer = graph.stage(name)
        expected = [tuple(w.shape) for w in layer.get_weights()]
        got = [tuple(np.shape(w)) for w in weights[name]]
        require(got == expected, InvalidInputError,
                f"tower_weights[{name!r}] must be [kernel, bias] of shapes {expected}, got {got}")
        layer.set_weights([np.asarray(w, np.float32) for w in weights[name]])


def features_from_world(world, rows: Sequence[int] | np.ndarray | slice) -> dict[str, tf.Tensor]:
    """The input dict for users ``rows`` of a ``xgr_world.synthetic.World``.

    Returns dense tensors as listed in ``INPUTS``; histories keep their chronological order and
    ``history_splits`` starts at 0.
    """
    index = np.arange(len(world.user_ids))[rows]
    index = np.atleast_1d(index)
    starts, ends = world.history_splits[index], world.history_splits[index + 1]
    take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(index) \
        else np.zeros(0, np.int64)
    splits = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)
    return {
        "user_id": tf.constant(world.user_ids[index], tf.int64),
        "country": tf.constant(np.asarray(world.user_context[index], dtype=object), tf.string),
        "history_items": tf.constant(world.history_items[take], tf.int64),
        "history_times": tf.constant(world.history_times[take], tf.int64),
        "history_splits": tf.constant(splits, tf.int64),
        "request_time": tf.constant(world.request_time[index], tf.int64),
    }
