"""The embedded default model: fit the ``tiny`` decoder on the synthetic world, or load the fit.

Training prompts come from the same TF ``FeatureGraph`` that serves (no train/serve skew): each
training user yields ``cuts_per_user`` requests, "the history up to event k, asked at event k's
time, should produce event k", for its latest events. The graph's token ids, segment ids and
hashed profile ids cross the DLPack bridge; ``xgr_world.train`` fits the decoder and a Torch
twin of the profile tower; the learned sparse table and tower then go back into the TF graph,
where they run at inference.

A fit is cached under ``<cache_dir>/demo-<key>``, ``key`` hashing the settings and the source
of the code that shapes the weights, so a later run loads instead of fitting and a code
change refits. The held-out users (the last ``holdout_users`` of the world) never reach the
trainer. The folder holds what a team would export (``DefaultModel.export_files``): the
checkpoint ``model/`` with its ``xgr_model.json``, the catalog file and the trained feature
graph's weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

# Fitting imports triton lazily (torch's optimisers, through torch._dynamo); the package
# (xgr_world/__init__.py) loads it before TF, see xgr_common/import_order.py.
import numpy as np
import tensorflow as tf
import torch
from safetensors.numpy import load_file, save_file
from safetensors.torch import load_file as load_torch_file

from bridge import to_torch
from tf_frontend.feature_graph import FeatureGraph
from tf_frontend.feature_graph_v2 import FeatureGraphV2
from torch_engine.config import ModelConfig
from torch_engine.model import Model
from xgr_checkpoint.catalog_file import write_catalog
from xgr_common.errors import ConfigError, OpLibraryError, require
from xgr_common.import_order import triton_importable
from xgr_common.layout import MaskMode
from xgr_common.model_card import ModelCard
from xgr_common.prompt_spec import PromptSpec
from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout
from xgr_world.synthetic import World, WorldConfig, make_world
from xgr_world.train import FitResult, ProfileTower, TrainConfig, TrainingExamples, fit

# Source files whose change alters the fitted weights: part of the cache key.
_KEYED_SOURCES = ("xgr_world/default_model.py", "xgr_world/train.py", "torch_engine/model.py",
                  "torch_engine/layers.py", "torch_engine/attention.py",
                  "xgr_world/synthetic.py", "tf_frontend/feature_graph.py",
                  "tf_frontend/feature_graph_v2.py", "tf_frontend/layers.py")
_ROOT = Path(__file__).resolve().parent.parent
TOWER_FILE = "feature_graph.safetensors"
CATALOG_FILE = "catalog.parquet"
MODEL_DIR = "model"
REPORT_FILE = "fit.json"


def _default_training() -> TrainConfig:
    # Causal mask, every code of every history item a target: ~30 targets per prompt instead
    # of one, which is what lets a short fit beat popularity.
    return TrainConfig(steps=700, batch_size=32, objective="all_codes", mask_mode=MaskMode.CAUSAL)


# The demo's prompt version 2: weeks as blocks (the world's events come every few days), the
# whole synthetic history kept (long-term part and open week), no text (no text vocabulary).
DEMO_PROMPT_V2 = PromptV2Layout(HistorySplit(block_seconds=7 * 86400, long_term_blocks=52,
                                             long_term_items=40, recent_items=10))


@dataclass(frozen=True)
class DefaultModelSettings:
    """What the default model is fitted on and how.

    The model is served with the mask it was trained with (``train.mask_mode``): the
    pipeline passes the graph's segment ids to the engine only for the item-causal mask.
    The prompt is version 2 (``DEMO_PROMPT_V2``) under the causal mask: the item-causal rule
    with its next-item objective stays below popularity in this budget.
    """

    world: WorldConfig = field(default_factory=lambda: WorldConfig(num_users=5000))
    spec: PromptSpec = field(default_factory=lambda: PromptSpec(prompt_v2=DEMO_PROMPT_V2))
    train: TrainConfig = field(default_factory=_default_training)
    preset: str = "tiny"
    holdout_users: int = 1000         # the world's last users: evaluation only
    cuts_per_user: int = 1            # training requests per training user (latest events)

    def __post_init__(self) -> None:
        require(0 < self.holdout_users < self.world.num_users, ConfigError,
                f"holdout_users must be in (0, num_users={self.world.num_users}), "
                f"got {self.holdout_users}")
        require(1 <= self.cuts_per_user <= self.world.history_events, ConfigError,
                f"cuts_per_user must be in [1, history_events={self.world.history_events}], "
                f"got {self.cuts_per_user}")

    @property
    def train_users(self) -> np.ndarray:
        return np.arange(self.world.num_users - self.holdout_users)

    @property
    def eval_users(self) -> np.ndarray:
        return np.arange(self.world.num_users - self.holdout_users, self.world.num_users)

    def cache_key(self) -> str:
        """Hash of these settings and of the keyed sources (12 hex digits)."""
        digest = hashlib.sha256(repr(asdict(self)).encode())
        for name in _KEYED_SOURCES:
            path = _ROOT / name
            digest.update(path.read_bytes() if path.exists() else name.encode())
        return digest.hexdigest()[:12]


def with_prompt_version(settings: DefaultModelSettings, version: int) -> DefaultModelSettings:
    """``settings`` with the demo's prompt of ``version`` (1, or 2: ``DEMO_PROMPT_V2``)."""
    require(version in (1, 2), ConfigError, f"prompt version must be 1 or 2, got {version!r}")
    return replace(settings, spec=replace(settings.spec,
                                          prompt_v2=DEMO_PROMPT_V2 if version == 2 else None))


# A small world and a short fit, for a first look and for CI (2 cores). Prompt version 1: in a
# fit this short version 2 falls below popularity at recall@10 (docs/notes/prompt_v2.md).
QUICK = DefaultModelSettings(
    world=WorldConfig(num_items=1000, num_users=1500, history_events=20), spec=PromptSpec(),
    train=replace(_default_training(), steps=400, warmup_steps=40), holdout_users=300)


@dataclass
class DefaultModel:
    """A fitted (or loaded) default model and the world it belongs to.

    ``tower`` holds the learned sparse table and profile tower in Keras layout; ``fit`` is the
    training report (losses, seconds); ``loaded`` tells whether it came from the cache.
    """

    settings: DefaultModelSettings
    world: World
    model: Model
    tower: dict[str, np.ndarray]
    fit: FitResult
    loaded: bool
    directory: Path

    def feature_graph(self) -> FeatureGraph:
        """The serving TF graph with the learned sparse table and tower weights."""
        return feature_graph_for(self.settings.spec, self.world, self.tower)

    def export_files(self) -> dict[str, Path]:
        """What ``xgr export`` takes: ``model`` (the checkpoint with its ``xgr_model.json``),
        ``catalog`` (the catalog file) and ``feature_graph`` (the trained graph's weights)."""
        return {"model": self.directory / MODEL_DIR, "catalog": self.directory / CATALOG_FILE,
                "feature_graph": self.directory / TOWER_FILE}


def model_card(settings: DefaultModelSettings, model: Model) -> ModelCard:
    """What the fit was trained with, as export reads it beside the checkpoint."""
    config = model.config
    return ModelCard(spec=settings.spec, prefill_mask=settings.train.mask_mode,
                     architecture=config.to_hf_dict()["model_type"],
                     vocab_size=config.vocab_size, hidden_size=config.hidden_size)


def feature_graph_for(spec: PromptSpec, world: World, tower: dict[str, np.ndarray] | None,
                      seed: int = 0) -> FeatureGraph:
    """The feature graph of ``spec``'s prompt version (``FeatureGraphV2`` for version 2) over
    ``world``'s catalog; ``tower`` from ``ProfileTower.keras_weights`` (None: Keras' random
    initialisation from ``seed``)."""
    return catalog_feature_graph(spec, world.item_ids, world.item_codes, tower, seed)


def catalog_feature_graph(spec: PromptSpec, item_ids: np.ndarray, item_codes: np.ndarray,
                          tower: dict[str, np.ndarray] | None, seed: int = 0) -> FeatureGraph:
    """``feature_graph_for`` over a catalog's ``item_ids`` and ``item_codes``."""
    graph_class = FeatureGraphV2 if spec.version == 2 else FeatureGraph
    if tower is None:
        return graph_class(spec, item_ids, item_codes, seed=seed)
    return graph_class(spec, item_ids, item_codes, embedding_table=tower["table"],
                       tower_weights={
                           "profile_tower": [tower["tower_kernel"], tower["tower_bias"]],
                           "profile_projection": [tower["projection_kernel"],
                                                  tower["projection_bias"]]})


def cut_features(world: World, users: np.ndarray, cuts_per_user: int
                 ) -> tuple[dict[str, tf.Tensor], np.ndarray]:
    """Training requests: for each user, its last ``cuts_per_user`` events, each asked for with
    the events before it as history and that event's time as the request time.

    Returns the feature dict (``FeatureGraph``'s inputs, one row per request) and the target
    item of each row ``[R]`` int64. The world's held-out target counts as the last event.
    """
    ids, countries, items, times, lengths, request, targets = [], [], [], [], [], [], []
    for user in users:
        start, end = world.history_splits[user], world.history_splits[user + 1]
        events = np.r_[world.history_items[start:end], world.target_items[user]]
        stamps = np.r_[world.history_times[start:end], world.request_time[user]]
        for k in range(len(events) - cuts_per_user, len(events)):
            ids.append(world.user_ids[user])
            countries.append(world.user_context[user])
            items.append(events[:k])
            times.append(stamps[:k])
            lengths.append(k)
            request.append(stamps[k])
            targets.append(events[k])
    splits = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    features = {
        "user_id": tf.constant(np.asarray(ids, np.int64)),
        "country": tf.constant(np.asarray(countries, dtype=object), tf.string),
        "history_items": tf.constant(np.concatenate(items).astype(np.int64)),
        "history_times": tf.constant(np.concatenate(times).astype(np.int64)),
        "history_splits": tf.constant(splits),
        "request_time": tf.constant(np.asarray(request, np.int64)),
    }
    return features, np.asarray(targets, np.int64)


def item_codes_of(world: World, items: np.ndarray) -> np.ndarray:
    """Code paths ``[R, levels]`` int64 of catalog items ``items [R]``."""
    order = np.argsort(world.item_ids)
    rows = order[np.searchsorted(world.item_ids, items, sorter=order)]
    require(bool(np.all(world.item_ids[rows] == items)), ConfigError,
            "target items must belong to the world's catalog")
    return world.item_codes[rows].astype(np.int64)


def training_examples(graph: FeatureGraph, features: dict[str, tf.Tensor],
                      target_codes: np.ndarray) -> TrainingExamples:
    """Run the TF graph over the training requests and hand its prompts to Torch."""
    out = graph(features)
    return TrainingExamples(
        token_ids=to_torch(out["token_ids"]).long(),
        lengths=to_torch(out["lengths"]).long(),
        segment_ids=to_torch(out["segment_ids"]),
        profile_ids=to_torch(out["profile_ids"]),
        target_codes=torch.from_numpy(target_codes))


def default_cache_dir() -> Path:
    """``$XGR_CACHE_DIR``, else ``~/.cache/xgr-bridge``."""
    return Path(os.environ.get("XGR_CACHE_DIR") or Path.home() / ".cache" / "xgr-bridge")


def fit_or_load(settings: DefaultModelSettings = DefaultModelSettings(),
                cache_dir: str | Path | None = None, refit: bool = False,
                progress: bool = True) -> DefaultModel:
    """The cached fit for ``settings``, or a fresh fit (then cached) when absent or ``refit``."""
    world = make_world(settings.world)
    directory = Path(cache_dir or default_cache_dir()) / f"demo-{settings.cache_key()}"
    if not refit and (directory / REPORT_FILE).exists():
        report = json.loads((directory / REPORT_FILE).read_text())
        fit_result = FitResult(losses=tuple(report["losses"]), seconds=report["seconds"])
        return DefaultModel(settings, world, load_model(directory / MODEL_DIR),
                            load_file(str(directory / TOWER_FILE)), fit_result, True, directory)

    require(triton_importable(), OpLibraryError,
            "cannot fit in this process: tensorflow was imported before triton "
            "and torch's optimiser would import triton now, which aborts the process (both "
            "bundle LLVM). Import xgr_world.default_model before tensorflow, or fit in a fresh "
            "process (`xgr demo` does)")
    torch.manual_seed(settings.train.seed)
    features, targets = cut_features(world, settings.train_users, settings.cuts_per_user)
    examples = training_examples(feature_graph_for(settings.spec, world, None), features,
                                 item_codes_of(world, targets))
    model = Model.from_preset(settings.preset, seed=settings.train.seed)
    require(model.config.hidden_size == settings.spec.model_hidden, ConfigError,
            f"preset {settings.preset!r} has hidden {model.config.hidden_size}, the profile "
            f"tower emits {settings.spec.model_hidden}")
    tower = ProfileTower(settings.spec, seed=settings.train.seed)
    result = fit(model, tower, examples, settings.spec.layout, settings.train, progress=progress)
    weights = tower.keras_weights()
    _save(directory, settings, world, model, weights, result)
    return DefaultModel(settings, world, model.eval(), weights, result, False, directory)


def load_model(directory: Path) -> Model:
    """A model saved by ``save_pretrained``, built on the CPU and filled by a strict state-dict
    load. (``Model.from_pretrained`` builds on the meta device, which makes torch import Triton:
    fatal in a process that imported TF first, as a serving or test process may have.)"""
    config = ModelConfig.from_hf_dict(json.loads((directory / "config.json").read_text()))
    model = Model(config)
    state = load_torch_file(str(directory / "model.safetensors"))
    if config.tie_word_embeddings:   # one tensor under both names, stored once
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    return model.eval()


def _save(directory: Path, settings: DefaultModelSettings, world: World, model: Model,
          tower: dict[str, np.ndarray], result: FitResult) -> None:
    """Write into a temporary sibling, then rename: a reader never sees a half-written fit."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        model.save_pretrained(staging / MODEL_DIR)
        model_card(settings, model).write(staging / MODEL_DIR)
        save_file(tower, str(staging / TOWER_FILE))
        write_catalog(staging / CATALOG_FILE, world.item_ids, world.item_codes)
        (staging / REPORT_FILE).write_text(json.dumps(
            {"losses": list(result.losses), "seconds": result.seconds}))
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
