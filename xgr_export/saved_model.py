"""One SavedModel for the whole pipeline: TF feature graph -> TorchCall(engine) -> TF rules.

``export_pipeline(out_dir, feature_graph, package)`` saves a SavedModel whose
``serving_default`` takes the feature graph's six request features by name and returns
``item_ids`` int64 [B, top_n], ``scores`` float32 [B, top_n] and ``num_items`` int32 [B]. The
business rules are ``tf_frontend.rules``: the engine gets the cleaned history as
``exclude_items`` and never returns it; blocked and over-cap items are dropped after it. The
engine package (``xgr_export.engine_package``) travels as an asset; loading needs only
TensorFlow and ``custom_ops`` (which links libtorch), never ``torch_engine`` or Python torch.

``PythonPipeline`` is the same pipeline in process, with the engine called from Python through
``bridge.dlpack``: the reference a reloaded SavedModel must match item for item.

Import this module before tensorflow when the same process also exports torch programs
(``xgr_export.torch_package`` explains why).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from xgr_export import torch_package

import tensorflow as tf  # noqa: E402

from custom_ops.torch_call import torch_call  # noqa: E402
from tf_frontend.feature_graph import INPUTS  # noqa: E402
from tf_frontend.rules import BusinessRules, PostProcessor, engine_feeds  # noqa: E402
from xgr_common.errors import ConfigError, ExportError, require  # noqa: E402

SIGNATURE = "serving_default"
ENGINE_INPUTS = ("token_ids", "lengths", "segment_ids", "profile_embeds", "exclude_items")
OUTPUTS = ("item_ids", "scores", "num_items")


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

    def __post_init__(self) -> None:
        for name in ("top_n", "intra_op_threads", "concurrency", "max_history_events"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"PipelineConfig.{name} must be a positive int, got {value!r}")
        require(isinstance(self.rules, BusinessRules), ConfigError,
                f"PipelineConfig.rules must be a BusinessRules, got {type(self.rules).__name__}")


def _feature_specs() -> dict[str, tf.TensorSpec]:
    return {name: tf.TensorSpec([None], dtype, name=name) for name, dtype in INPUTS.items()}


def _post_processor(config: PipelineConfig, catalog) -> PostProcessor:
    item_ids, item_codes = catalog if catalog is not None else (None, None)
    return PostProcessor(config.rules, config.top_n, item_ids, item_codes)


class Pipeline(tf.Module):
    """What the SavedModel holds: the feature graph, the engine asset, the rules and ``serve``."""

    def __init__(self, feature_graph, package: torch_package.Package,
                 config: PipelineConfig = PipelineConfig(),
                 engine_inputs: tuple[str, ...] = ENGINE_INPUTS, catalog=None):
        super().__init__(name="xgr_pipeline")
        require(len(engine_inputs) == len(package.inputs), ExportError,
                f"the package takes {len(package.inputs)} inputs, engine_inputs names "
                f"{len(engine_inputs)}: {engine_inputs}")
        require([s.dtype for s in package.outputs] == ["int64", "float32"], ExportError,
                f"the engine package must return (item_ids int64, scores float32), got "
                f"{[s.dtype for s in package.outputs]}")
        self.graph = feature_graph
        self.engine = tf.saved_model.Asset(str(package.path))
        self.post_process = _post_processor(config, catalog)
        self._input_dtypes = [tf.as_dtype(s.dtype) for s in package.inputs]
        self._output_shapes = [s.static_shape() for s in package.outputs]
        self._engine_inputs, self._config = tuple(engine_inputs), config
        self.serve = tf.function(self._serve, input_signature=[_feature_specs()])

    def _serve(self, features):
        feeds = engine_feeds(self.graph(features), self._config.rules)
        args = [tf.cast(feeds[name], dtype) for name, dtype in zip(self._engine_inputs,
                                                                    self._input_dtypes)]
        item_ids, scores = torch_call(self.engine, args, [tf.int64, tf.float32],
                                      output_shapes=self._output_shapes,
                                      intra_op_threads=self._config.intra_op_threads,
                                      concurrency=self._config.concurrency, name="engine")
        # An engine that did not exclude the history itself: the rule runs after it instead.
        seen = None if "exclude_items" in self._engine_inputs else feeds["exclude_items"]
        return self.post_process(item_ids, scores, seen)


def export_pipeline(out_dir: str | os.PathLike, feature_graph, package: torch_package.Package,
                    config: PipelineConfig = PipelineConfig(),
                    engine_inputs: tuple[str, ...] = ENGINE_INPUTS, catalog=None) -> Path:
    """Saves feature graph + engine package + business rules as one SavedModel in ``out_dir``;
    returns it. The package file is copied into the SavedModel's assets. ``catalog``
    (``(item_ids, item_codes)``) is needed only for ``rules.max_per_category``."""
    out_dir = Path(out_dir)
    require(not out_dir.exists() or not any(out_dir.iterdir()), ExportError,
            f"{out_dir} exists and is not empty; choose a new folder")
    module = Pipeline(feature_graph, package, config, engine_inputs, catalog)
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

    ``recommend(*engine inputs)`` takes torch tensors named by ``engine_inputs`` (the feature
    outputs, and ``exclude_items``, handed over by ``bridge.dlpack``) and returns
    (item_ids, scores). ``device`` is where those tensors go (the engine's device).
    """

    def __init__(self, feature_graph, recommend: Callable,
                 config: PipelineConfig = PipelineConfig(),
                 engine_inputs: tuple[str, ...] = ENGINE_INPUTS, catalog=None,
                 device: str = "cpu"):
        from bridge.dlpack import to_tf, to_torch

        self._to_tf, self._to_torch = to_tf, to_torch
        self._recommend, self._config, self._device = recommend, config, device
        self._engine_inputs = tuple(engine_inputs)
        self._post = _post_processor(config, catalog)
        # Traced like the SavedModel's, so both see the same (graph-mode) feature values.
        self._features = tf.function(lambda f: engine_feeds(feature_graph(f), config.rules),
                                     input_signature=[_feature_specs()])

    def __call__(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        feeds = self._features(features)
        item_ids, scores = self._recommend(*(self._to_torch(feeds[n], self._device)
                                             for n in self._engine_inputs))
        seen = None if "exclude_items" in self._engine_inputs else feeds["exclude_items"]
        return self._post(self._to_tf(item_ids.cpu().contiguous()),
                          self._to_tf(scores.float().cpu().contiguous()), seen)
