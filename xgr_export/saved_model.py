"""One SavedModel for the whole pipeline: TF feature graph -> TorchCall(engine) -> TF rules.

``export_pipeline(out_dir, feature_graph, package)`` saves a SavedModel whose
``serving_default`` takes the feature graph's six request features by name and returns
``item_ids`` int64 [B, top_n], ``scores`` float32 [B, top_n] and ``num_items`` int32 [B];
with ``PipelineConfig.max_request_exclusions``, ``serving_with_controls`` takes the same plus
each request's own ``exclude_items`` (ragged by ``exclude_splits``), which the engine never
returns, like the history, and its own ``top_k`` (at most the export's). The
TF halves (feature signature, engine feeds, business rules) are ``tf_frontend.pipeline_spec``'s,
the same the in-process ``bridge.pipeline.RecommendPipeline`` runs: the engine gets the cleaned
history as ``exclude_items`` and never returns it; blocked and over-cap items are dropped after
it. The engine package (``xgr_export.engine_package``) travels as an asset; loading needs only
TensorFlow and ``custom_ops`` (which links libtorch), never ``torch_engine`` or Python torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from custom_ops.torch_call import torch_call
from tf_frontend.pipeline_spec import (USER_KEY, WIDTH_CONTROL, PipelineConfig,
                                       apply_controls, controls_of, controls_signature,
                                       engine_inputs_of, engine_lists, post_processor,
                                       seen_items, serving_signature, user_keys,
                                       with_beam_slots)
from tf_frontend.rules import engine_feeds
from xgr_common.errors import ExportError, require
from xgr_common.serving_names import CONTROLS_SIGNATURE, SERVING_SIGNATURE, SERVING_SPEC_FILE
from xgr_export.torch_package import Package
from xgr_export.warmup_requests import split_requests, write_warmup_requests


class Pipeline(tf.Module):
    """What the SavedModel holds: the feature graph, the engine asset, the rules and ``serve``."""

    def __init__(self, feature_graph, package: Package,
                 config: PipelineConfig = PipelineConfig(),
                 engine_inputs: tuple[str, ...] | None = None, catalog=None, tables=None):
        super().__init__(name="xgr_pipeline")
        engine_inputs = engine_inputs_of(config) if engine_inputs is None else engine_inputs
        inputs = package.caller_inputs
        require(len(engine_inputs) == len(inputs), ExportError,
                f"the package takes {len(inputs)} inputs, engine_inputs names "
                f"{len(engine_inputs)}: {engine_inputs}")
        require(bool(package.tables) == (tables is not None), ExportError,
                f"the package reads {len(package.tables)} tables; a tables file must be given "
                f"exactly when it reads some (got {tables})")
        require([s.dtype for s in package.outputs] == ["int64", "float32"], ExportError,
                f"the engine package must return (item_ids int64, scores float32), got "
                f"{[s.dtype for s in package.outputs]}")
        self.graph = feature_graph
        self.engine = tf.saved_model.Asset(str(package.path))
        # The catalog's tables, for a package exported with a catalog capacity: TorchCall
        # loads them once onto the engine's device.
        self.tables = None if tables is None else tf.saved_model.Asset(str(tables))
        self.post_process = post_processor(config, catalog)
        self._input_dtypes = [tf.as_dtype(s.dtype) for s in inputs]
        self._output_shapes = [s.static_shape() for s in package.outputs]
        self._engine_inputs, self._config = tuple(engine_inputs), config
        require(config.prompt_cache == (package.cache_runtime is not None), ExportError,
                f"PipelineConfig.prompt_cache is {config.prompt_cache} but the package "
                f"{'keeps' if package.cache_runtime is not None else 'keeps no'} prompt cache")
        self.serve = tf.function(self._serve, input_signature=[serving_signature(config)])
        if config.max_request_exclusions:
            require("exclude_items" in self._engine_inputs, ExportError,
                    "per-request exclusions need an engine that takes exclude_items")
            self.serve_with_controls = tf.function(self._serve_with_controls,
                                                   input_signature=[controls_signature(config)])

    def _serve_with_controls(self, inputs):
        controls = controls_of(self._config)
        features = {name: value for name, value in inputs.items() if name not in controls}
        return self._serve(features, {name: inputs[name] for name in controls})

    def _serve(self, features, controls=None):
        features = dict(features)              # tf.function's own arguments stay as given
        keys = features.pop(USER_KEY, None)
        feeds = engine_feeds(self.graph(features), self._config.rules)
        if self._config.prompt_cache:
            feeds = {**feeds, "user_keys": user_keys(keys)}
        if controls is not None:
            feeds = apply_controls(feeds, controls, self._config)
        feeds = with_beam_slots(feeds, controls, self._config)
        args = [tf.cast(feeds[name], dtype) for name, dtype in zip(self._engine_inputs,
                                                                    self._input_dtypes)]
        item_ids, scores = torch_call(self.engine, args, [tf.int64, tf.float32],
                                      output_shapes=self._output_shapes,
                                      intra_op_threads=self._config.intra_op_threads,
                                      concurrency=self._config.concurrency, name="engine",
                                      tables=self.tables)
        item_ids, scores = engine_lists(item_ids, scores, controls)
        return self.post_process(item_ids, scores, seen_items(feeds, self._engine_inputs))


def require_empty_folder(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` as a Path, refused when it exists with files in it (a SavedModel is never
    written over another)."""
    out_dir = Path(out_dir)
    require(not out_dir.exists() or not any(out_dir.iterdir()), ExportError,
            f"{out_dir} exists and is not empty; choose a new folder")
    return out_dir


def export_pipeline(out_dir: str | os.PathLike, feature_graph, package: Package,
                    config: PipelineConfig = PipelineConfig(),
                    engine_inputs: tuple[str, ...] | None = None, catalog=None,
                    warmup_features=None, tables=None) -> Path:
    """Saves feature graph + engine package + business rules as one SavedModel in ``out_dir``;
    returns it. The package file is copied into the SavedModel's assets. ``catalog``
    (``(item_ids, item_codes)``) is needed only for ``rules.max_per_category``.

    ``warmup_features`` (a batch of request features, e.g. the export's probe requests) are
    written as the SavedModel's warm-up requests, a few rows per request
    (``xgr_export.warmup_requests``): a server replays them before the version goes live, so a
    version whose engine package does not load is never served. ``tables``: the tables file
    of a package that reads its catalog as inputs (``engine_package.write_tables``), copied
    into the assets beside it."""
    out_dir = require_empty_folder(out_dir)
    module = Pipeline(feature_graph, package, config, engine_inputs, catalog, tables)
    top_k = package.outputs[0].dims[1]
    signatures = {SERVING_SIGNATURE: module.serve.get_concrete_function()}
    if config.max_request_exclusions:
        signatures[CONTROLS_SIGNATURE] = module.serve_with_controls.get_concrete_function()
    tf.saved_model.save(module, str(out_dir), signatures=signatures)
    _write_serving_spec(out_dir, config, _largest_batch(package), top_k)
    if warmup_features is not None:
        if config.prompt_cache:
            # Keyed, so the warm-up also runs (and on a GPU captures) the cached search.
            warmup_features = {**warmup_features, USER_KEY: warmup_keys(warmup_features)}
        requests = split_requests(warmup_features)
        # Each other named width once too, so its graph is captured before the first client.
        others = [(CONTROLS_SIGNATURE, width_request(requests[0], width, top_k))
                  for width in config.beam_widths if width != config.beam_width]
        write_warmup_requests(out_dir, requests, more=others)
    return out_dir


def warmup_keys(features: dict) -> np.ndarray:
    """One user key per warm-up row (``warmup-<row>``)."""
    rows = len(np.asarray(features["history_splits"])) - 1
    return np.array([f"warmup-{row}".encode() for row in range(rows)], dtype=object)


def width_request(request: dict, width: int, top_k) -> dict:
    """``request`` (features) for ``serving_with_controls`` at beam ``width``: no
    exclusions of its own, the export's ``top_k``."""
    rows = len(request["history_splits"]) - 1
    return {**request, "exclude_items": np.zeros(0, np.int64),
            "exclude_splits": np.zeros(rows + 1, np.int64),
            "top_k": np.full(rows, int(top_k), np.int32),
            WIDTH_CONTROL: np.full(rows, width, np.int32)}


def _largest_batch(package: Package) -> int | None:
    """The most rows the package accepts: the range of its first input's leading dimension."""
    first = package.inputs[0].dims[0] if package.inputs and package.inputs[0].dims else None
    if isinstance(first, int):
        return first
    return next((hi for name, _, hi in package.ranges if name == first), None)


def _write_serving_spec(out_dir: Path, config: PipelineConfig, max_rows: int | None,
                        top_k) -> None:
    """Tells ``xgr serve`` which inputs are ragged, the history limit, the most rows a
    request may carry and the controls a request may leave out (no exclusions, the export's
    ``top_k``; see ``tf_frontend/serving/signature.py``), so serving needs no extra flags."""
    spec = {"ragged": {"history_splits": ["history_items", "history_times"],
                       "exclude_splits": ["exclude_items"]},
            "max_history_events": config.max_history_events}
    if config.max_request_exclusions and isinstance(top_k, int):
        spec["defaults"] = {"exclude_items": [], "top_k": top_k}
    if config.beam_widths:   # one width per model call: the batcher merges equal widths only
        spec.setdefault("defaults", {})[WIDTH_CONTROL] = config.beam_width
        spec["per_call"] = [WIDTH_CONTROL]
    if config.prompt_cache:  # a request without a key is served, uncached
        spec.setdefault("defaults", {})[USER_KEY] = ""
    if max_rows is not None:
        spec["max_rows"] = int(max_rows)
    path = out_dir / SERVING_SPEC_FILE
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(spec, indent=2) + "\n")
