"""One SavedModel for the whole pipeline: TF feature graph -> TorchCall(engine) -> TF rules.

``export_pipeline(out_dir, feature_graph, package)`` saves a SavedModel whose
``serving_default`` takes the feature graph's six request features by name and returns
``item_ids`` int64 [B, top_n], ``scores`` float32 [B, top_n] and ``num_items`` int32 [B]. The
engine package (``tf_frontend.engine_package``) travels as an asset; loading needs only
TensorFlow and ``custom_ops`` (which links libtorch), never ``torch_engine`` or Python torch.

``PythonPipeline`` is the same pipeline in process, with the engine called from Python through
``bridge.dlpack``: the reference a reloaded SavedModel must match item for item.

Import this module before tensorflow when the same process also exports torch programs
(``tf_frontend.torch_package`` explains why).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tf_frontend import torch_package

import tensorflow as tf  # noqa: E402

from custom_ops.torch_call import torch_call  # noqa: E402
from tf_frontend.feature_graph import INPUTS  # noqa: E402
from torch_engine.errors import ConfigError, ExportError, require  # noqa: E402

SIGNATURE = "serving_default"
ENGINE_INPUTS = ("token_ids", "lengths", "segment_ids", "profile_embeds")
OUTPUTS = ("item_ids", "scores", "num_items")


@dataclass(frozen=True)
class PipelineConfig:
    """TF-side settings: ``top_n`` items returned per request after the business rule
    (drop padding and items the user already saw); torch threads per calling TF thread;
    AOTInductor model instances that may run at once."""

    top_n: int = 10
    intra_op_threads: int = 1
    concurrency: int = 1
    # Longest raw history row a server accepts (before cleaning keeps the last N): a guard
    # against oversized requests, written to assets.extra/xgr_serving.json for `xgr serve`.
    max_history_events: int = 4096

    def __post_init__(self) -> None:
        for name in ("top_n", "intra_op_threads", "concurrency", "max_history_events"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"PipelineConfig.{name} must be a positive int, got {value!r}")


def post_process(item_ids: tf.Tensor, scores: tf.Tensor, history_values: tf.Tensor,
                 history_splits: tf.Tensor, top_n: int) -> dict[str, tf.Tensor]:
    """The business rule: drop padding (-1) and items already in the user's history, keep the
    best ``top_n``.

    item_ids int64 [B, K], scores float32 [B, K] (best first); history as values int64 [E] +
    row splits int64 [B+1]. Returns item_ids int64 [B, top_n] (-1 padded), scores float32
    [B, top_n] (-inf padded), num_items int32 [B].
    """
    seen = tf.RaggedTensor.from_row_splits(history_values, history_splits).to_tensor(-2)
    already = tf.reduce_any(item_ids[:, :, None] == seen[:, None, :], axis=-1)   # [B, K]
    keep = tf.logical_and(item_ids >= 0, tf.logical_not(already))
    kept_ids = tf.ragged.boolean_mask(item_ids, keep)[:, :top_n]
    kept_scores = tf.ragged.boolean_mask(scores, keep)[:, :top_n]
    return {"item_ids": kept_ids.to_tensor(-1, shape=[None, top_n]),
            "scores": kept_scores.to_tensor(float("-inf"), shape=[None, top_n]),
            "num_items": tf.cast(kept_ids.row_lengths(), tf.int32)}


def _feature_specs() -> dict[str, tf.TensorSpec]:
    return {name: tf.TensorSpec([None], dtype, name=name) for name, dtype in INPUTS.items()}


class Pipeline(tf.Module):
    """What the SavedModel holds: the feature graph, the engine asset and ``serve``."""

    def __init__(self, feature_graph, package: torch_package.Package,
                 config: PipelineConfig = PipelineConfig(),
                 engine_inputs: tuple[str, ...] = ENGINE_INPUTS):
        super().__init__(name="xgr_pipeline")
        require(len(engine_inputs) == len(package.inputs), ExportError,
                f"the package takes {len(package.inputs)} inputs, engine_inputs names "
                f"{len(engine_inputs)}: {engine_inputs}")
        require([s.dtype for s in package.outputs] == ["int64", "float32"], ExportError,
                f"the engine package must return (item_ids int64, scores float32), got "
                f"{[s.dtype for s in package.outputs]}")
        self.graph = feature_graph
        self.engine = tf.saved_model.Asset(str(package.path))
        self._input_dtypes = [tf.as_dtype(s.dtype) for s in package.inputs]
        self._output_shapes = [s.static_shape() for s in package.outputs]
        self._engine_inputs, self._config = tuple(engine_inputs), config
        self.serve = tf.function(self._serve, input_signature=[_feature_specs()])

    def _serve(self, features):
        out = self.graph(features)
        args = [tf.cast(out[name], dtype) for name, dtype in zip(self._engine_inputs,
                                                                  self._input_dtypes)]
        item_ids, scores = torch_call(self.engine, args, [tf.int64, tf.float32],
                                      output_shapes=self._output_shapes,
                                      intra_op_threads=self._config.intra_op_threads,
                                      concurrency=self._config.concurrency, name="engine")
        return post_process(item_ids, scores, out["history_values"], out["history_splits"],
                            self._config.top_n)


def export_pipeline(out_dir: str | os.PathLike, feature_graph, package: torch_package.Package,
                    config: PipelineConfig = PipelineConfig(),
                    engine_inputs: tuple[str, ...] = ENGINE_INPUTS) -> Path:
    """Saves feature graph + engine package + post-processing as one SavedModel in
    ``out_dir``; returns it. The package file is copied into the SavedModel's assets."""
    out_dir = Path(out_dir)
    require(not out_dir.exists() or not any(out_dir.iterdir()), ExportError,
            f"{out_dir} exists and is not empty; choose a new folder")
    module = Pipeline(feature_graph, package, config, engine_inputs)
    concrete = module.serve.get_concrete_function()
    tf.saved_model.save(module, str(out_dir), signatures={SIGNATURE: concrete})
    _write_serving_spec(out_dir, config)
    return out_dir


def _write_serving_spec(out_dir: Path, config: PipelineConfig) -> None:
    """Tells ``xgr serve`` which inputs are ragged and the history limit (see
    ``tf_frontend/serving/signature.py``), so serving needs no extra flags."""
    spec = {"ragged": {"history_splits": ["history_items", "history_times"]},
            "max_history_events": config.max_history_events}
    extra = out_dir / "assets.extra"
    extra.mkdir(exist_ok=True)
    (extra / "xgr_serving.json").write_text(json.dumps(spec, indent=2) + "\n")


class PythonPipeline:
    """The same pipeline in this process, the engine called from Python: the development path
    and the reference for a reloaded SavedModel.

    ``recommend(token_ids, lengths, segment_ids, profile_embeds)`` takes torch tensors (the
    feature outputs handed over by ``bridge.dlpack``) and returns (item_ids, scores).
    """

    def __init__(self, feature_graph, recommend: Callable,
                 config: PipelineConfig = PipelineConfig(),
                 engine_inputs: tuple[str, ...] = ENGINE_INPUTS):
        from bridge.dlpack import to_tf, to_torch

        self._to_tf, self._to_torch = to_tf, to_torch
        self._recommend, self._config = recommend, config
        self._engine_inputs = tuple(engine_inputs)
        # Traced like the SavedModel's, so both see the same (graph-mode) feature values.
        self._features = tf.function(feature_graph, input_signature=[_feature_specs()])

    def __call__(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        out = self._features(features)
        item_ids, scores = self._recommend(*(self._to_torch(out[n]) for n in self._engine_inputs))
        return post_process(self._to_tf(item_ids.contiguous()),
                            self._to_tf(scores.float().contiguous()),
                            out["history_values"], out["history_splits"], self._config.top_n)
