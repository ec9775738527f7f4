"""One package of a tiny version 2 model with the prompt-KV cache, shared by the tests that
need a cached package but not a particular one: the TorchCall runtime's cache tests and the
large-pool test's CPU case. Compiling it is the costliest step of either, so the suite builds
it once (the ``tiny_cached_package`` session fixture) and each test reads it. Imports no
TensorFlow: the large-pool test's GPU case exports its own where TensorFlow is absent."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from tests.export.v2_spec import small_v2_spec
from tests.torch_engine.engine_worlds import small_world
from torch_engine.catalog import Catalog
from torch_engine.config import engine_config_for
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.prompt_spec import PromptSpec
from xgr_export.cached_package import export_cached_engine
from xgr_export.config import EngineExportConfig

BEAMS, TOP_K, MAX_BATCH = 8, 6, 8


class TinyCached(NamedTuple):
    """The package, the engine it was exported from (the reference), its card's spec and
    the catalog's ids and codes."""

    package: Path
    engine: Engine
    spec: PromptSpec
    ids: np.ndarray
    codes: np.ndarray


def export_tiny_cached(folder: Path, device: str) -> TinyCached:
    """Exports the tiny model (seed 1) over ``small_world``'s catalog with the cache for
    ``device`` into ``folder / "engine.pt2"``."""
    ids, codes = small_world()
    model = Model.from_preset("tiny", seed=1).to(device)
    spec = small_v2_spec(model.config.hidden_size)
    engine = Engine(model, Catalog.from_arrays(ids, codes).to(device),
                    engine_config_for(spec, selection_backend="torch"))
    path = folder / "engine.pt2"
    export_cached_engine(engine, spec, path,
                         EngineExportConfig(BEAMS, TOP_K, max_batch=MAX_BATCH, device=device))
    return TinyCached(path, engine, spec, ids, codes)
