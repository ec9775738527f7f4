"""The feature graph a SavedModel embeds: the team's trained graph, checked against the
prompt contract before anything compiles.

``load_feature_graph(source, spec, item_ids, item_codes)`` takes

- a ``.safetensors`` file: the reference graph (``tf_frontend.feature_graph.FeatureGraph``)
  over the catalog with the team's trained sparse table and profile tower (keys ``table``
  [embedding_buckets, embedding_dim], ``tower_kernel``, ``tower_bias``,
  ``projection_kernel``, ``projection_bias`` in Keras layout, as training writes them);
- a SavedModel folder: any TF or Keras graph (Keras: ``model.export(folder)``) whose
  ``serving_default`` signature takes the six request features (``feature_graph.INPUTS``)
  and returns the contract's outputs (``CONTRACT``); custom ops of ``custom_ops`` may be in it;
- None: the reference graph with Keras' random initialisation from ``seed`` (an untrained
  tower: for the synthetic world only).

``check_contract`` runs the graph once on probe requests and refuses outputs that break the
contract, naming the output and the rule.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tensorflow as tf

import custom_ops  # noqa: F401  (a saved feature graph may use the feature ops)
from tf_frontend.feature_graph import INPUTS, FeatureGraph
from tf_frontend.feature_graph_v2 import FeatureGraphV2
from tf_frontend.pipeline_spec import feature_signature
from xgr_common.errors import ConfigError, require
from xgr_common.prompt_spec import PromptSpec

WEIGHT_KEYS = ("table", "tower_kernel", "tower_bias", "projection_kernel", "projection_bias")
# The outputs every feature graph emits: name -> (dtype, rank). history_values / splits are
# the cleaned history of catalog items (the engine excludes it).
CONTRACT = {"token_ids": (tf.int32, 2), "lengths": (tf.int32, 1), "segment_ids": (tf.int32, 2),
            "profile_embeds": (tf.float32, 3), "history_values": (tf.int64, 1),
            "history_splits": (tf.int64, 1)}
# What a version 2 prompt's graph emits besides (``tf_frontend.feature_graph_v2``).
CONTRACT_V2 = {"frozen_lengths": (tf.int32, 1)}
SIGNATURE = "serving_default"


class SavedFeatureGraph(tf.Module):
    """A feature graph loaded from a SavedModel folder, called like ``FeatureGraph``:
    ``graph(features) -> dict`` of its signature's outputs."""

    def __init__(self, folder: str | os.PathLike):
        super().__init__(name="saved_feature_graph")
        folder = Path(folder)
        try:
            self.loaded = tf.saved_model.load(str(folder))
        except (OSError, ValueError, tf.errors.OpError) as error:
            raise ConfigError(f"feature graph {folder} is not a loadable SavedModel: "
                              f"{str(error).splitlines()[0]}") from None
        signatures = dict(self.loaded.signatures)
        require(SIGNATURE in signatures, ConfigError,
                f"feature graph {folder} has no {SIGNATURE!r} signature (it has "
                f"{sorted(signatures)}); export it with one taking {sorted(INPUTS)}")
        self._function = signatures[SIGNATURE]
        _, takes = self._function.structured_input_signature
        require(set(takes) == set(INPUTS), ConfigError,
                f"feature graph {folder} signature {SIGNATURE!r} takes {sorted(takes)}; the "
                f"served pipeline feeds exactly {sorted(INPUTS)}")
        for name, spec in takes.items():
            require(spec.dtype == INPUTS[name], ConfigError,
                    f"feature graph {folder} input {name!r} is {spec.dtype.name}, the request "
                    f"feature is {INPUTS[name].name}")
        self.folder = folder

    def __call__(self, features: dict) -> dict:
        return self._function(**{name: features[name] for name in INPUTS})

    def reloaded(self) -> "SavedFeatureGraph":
        """A fresh load of the same folder. Saving a module that tracks this one releases the
        loaded custom resources (the semantic-ID table) in this process, so whatever runs the
        graph after such a save (the in-process check) needs its own copy."""
        return SavedFeatureGraph(self.folder)


def save_feature_graph(graph, folder: str | os.PathLike, call=None) -> Path:
    """Saves ``graph`` (a ``FeatureGraph`` or any Keras model taking the request features) as
    the SavedModel folder ``load_feature_graph`` reads: ``serving_default`` over the request
    features (``pipeline_spec.feature_signature``). ``call``: a function of the features to
    serve instead of ``graph(features)`` (``graph`` is still saved with it, so its tables and
    weights travel). Returns the folder."""
    module = tf.Module()
    module.graph = graph   # tracked: its catalog table and weights are saved with it
    function = call or graph
    module.serve = tf.function(lambda features: dict(function(features)),
                               input_signature=[feature_signature()])
    tf.saved_model.save(module, str(folder),
                        signatures={SIGNATURE: module.serve.get_concrete_function()})
    return Path(folder)


def load_weights(path: str | os.PathLike, spec: PromptSpec) -> dict[str, np.ndarray]:
    """The reference graph's trained weights from ``path``, shapes checked against ``spec``."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    require(path.is_file(), ConfigError, f"feature graph weights {path} do not exist")
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise ConfigError(f"feature graph weights {path} are not a safetensors file: "
                          f"{error}") from None
    missing = [key for key in WEIGHT_KEYS if key not in weights]
    require(not missing, ConfigError,
            f"feature graph weights {path} lack {missing} (found {sorted(weights)}; the "
            f"reference graph needs {list(WEIGHT_KEYS)})")
    shapes = {"table": (spec.embedding_buckets, spec.embedding_dim),
              "tower_kernel": (2 * spec.embedding_dim, spec.tower_hidden),
              "tower_bias": (spec.tower_hidden,),
              "projection_kernel": (spec.tower_hidden, spec.profile_tokens * spec.model_hidden),
              "projection_bias": (spec.profile_tokens * spec.model_hidden,)}
    for key, shape in shapes.items():
        require(weights[key].shape == shape, ConfigError,
                f"feature graph weights {path} {key} has shape {weights[key].shape}; the "
                f"model card's prompt spec needs {shape}")
        require(np.issubdtype(weights[key].dtype, np.floating) and
                bool(np.isfinite(weights[key]).all()), ConfigError,
                f"feature graph weights {path} {key} must be finite floats")
    return weights


def load_feature_graph(source: str | os.PathLike | None, spec: PromptSpec,
                       item_ids: np.ndarray, item_codes: np.ndarray, seed: int = 0):
    """The feature graph of ``source`` (see the module docstring) over the catalog: the
    reference graph of the card's prompt version (``FeatureGraphV2`` for version 2)."""
    graph_class = FeatureGraphV2 if spec.version == 2 else FeatureGraph
    if source is None:
        return graph_class(spec, item_ids, item_codes, seed=seed)
    path = Path(source)
    if path.is_dir():
        return SavedFeatureGraph(path)
    require(path.suffix == ".safetensors", ConfigError,
            f"feature graph {path} must be a .safetensors file of the reference graph's "
            f"weights or a SavedModel folder")
    weights = load_weights(path, spec)
    return graph_class(spec, item_ids, item_codes, embedding_table=weights["table"],
                       tower_weights={
                            "profile_tower": [weights["tower_kernel"], weights["tower_bias"]],
                            "profile_projection": [weights["projection_kernel"],
                                                   weights["projection_bias"]]})


def check_contract(graph, features: dict, spec: PromptSpec, vocab_size: int,
                   name: str = "the feature graph") -> None:
    """Runs ``graph`` on ``features`` (probe requests) and refuses outputs that break the
    prompt contract: missing outputs, dtypes, ranks, the soft-prompt shape ``[B, S, hidden]``
    of ``spec``, token ids outside the vocabulary, lengths beyond the prompt width."""
    out = graph(features)
    contract = {**CONTRACT, **(CONTRACT_V2 if spec.version == 2 else {})}
    missing = [key for key in contract if key not in out]
    require(not missing, ConfigError,
            f"{name} lacks the outputs {missing} (it emits {sorted(out)}); the contract of "
            f"prompt version {spec.version}: {sorted(contract)}")
    batch = int(tf.shape(features["user_id"])[0])
    for key, (dtype, rank) in contract.items():
        value = out[key]
        require(value.dtype == dtype and value.shape.rank == rank, ConfigError,
                f"{name} output {key!r} is {value.dtype.name} of rank {value.shape.rank}; the "
                f"contract needs {dtype.name} of rank {rank}")
    embeds = out["profile_embeds"].shape
    want = (batch, spec.profile_tokens, spec.model_hidden)
    require(tuple(embeds) == want, ConfigError,
            f"{name} output 'profile_embeds' has shape {tuple(embeds)}; the model card needs "
            f"[batch, profile_tokens, hidden] = {list(want)}")
    tokens, lengths = out["token_ids"].numpy(), out["lengths"].numpy()
    require(tokens.shape[0] == batch and out["segment_ids"].shape == tokens.shape, ConfigError,
            f"{name}: token_ids {tokens.shape} and segment_ids {tuple(out['segment_ids'].shape)}"
            f" must both be [batch={batch}, L]")
    require(bool(((tokens >= 0) & (tokens < vocab_size)).all()), ConfigError,
            f"{name} emits token ids outside the model's vocabulary [0, {vocab_size})")
    require(bool(((lengths >= 1) & (lengths <= tokens.shape[1])).all()), ConfigError,
            f"{name} emits lengths outside [1, {tokens.shape[1]}] (the prompt width)")
    require(int(out["history_splits"].shape[0]) == batch + 1, ConfigError,
            f"{name} output 'history_splits' must have batch + 1 = {batch + 1} entries")
    if spec.version == 2:
        # The engine puts the S profile vectors at the S SOFT markers of each row.
        markers = (tokens == spec.layout.soft_id).sum(axis=1)
        require(bool((markers == spec.profile_tokens).all()), ConfigError,
                f"{name} emits rows with {sorted(set(markers.tolist()))} SOFT markers (token "
                f"{spec.layout.soft_id}); prompt version 2 needs profile_tokens = "
                f"{spec.profile_tokens} in every row")
        frozen = out["frozen_lengths"].numpy()
        require(bool(((frozen >= 1) & (frozen <= lengths)).all()), ConfigError,
                f"{name} emits frozen_lengths outside [1, lengths]")
