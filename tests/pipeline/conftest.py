"""The pipeline tests' fixtures and helpers: ``xgr`` in a fresh process, team-file exports, the
in-process pipeline over the quick fit (``quick_model``, in ``tests/conftest.py``: the
evaluation tests share it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


def run_xgr(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``xgr ARGS`` in a fresh interpreter at the repository root."""
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "xgr_cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


TORCH_CALL_CACHE = ROOT / "build" / "torch_call_cache"


def export_team_files(xgr, out: Path, files: dict, beam_width: int, top_k: int, top_n: int,
                      *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``xgr export`` of a team's ``files`` (model, catalog, feature graph) into ``out``: the
    finished process and its JSON report (None when it failed)."""
    report = out.parent / f"{out.name}.json"
    done = xgr("export", f"--model={files['model']}", f"--catalog={files['catalog']}",
               f"--feature_graph={files['feature_graph']}", f"--out={out}",
               f"--beam_width={beam_width}", f"--top_k={top_k}", f"--top_n={top_n}",
               f"--cache_dir={TORCH_CALL_CACHE}", f"--report_json={report}", *extra,
               timeout=1200)
    return done, (json.loads(report.read_text()) if done.returncode == 0 else None)


@pytest.fixture(scope="session")
def xgr():
    """``run_xgr``, for tests that start their own ``xgr`` process."""
    return run_xgr


@pytest.fixture(scope="session")
def make_pipeline(quick_model):
    """Builds a ``RecommendPipeline`` over the quick model's engine: beam width and top_k of
    the search, the rules, the prefill mask (default: item-causal, not the model's own)."""
    from bridge.pipeline import RecommendPipeline
    from tf_frontend.pipeline_spec import PipelineConfig
    from tf_frontend.rules import BusinessRules
    from torch_engine.catalog import Catalog
    from torch_engine.engine import Engine
    from xgr_common.layout import MaskMode

    world = quick_model.world
    catalog = Catalog.from_arrays(world.item_ids, world.item_codes,
                                  quick_model.settings.spec.layout)
    engine = Engine(quick_model.model, catalog)
    graph = quick_model.feature_graph()

    def build(beam_width: int, top_k: int, rules: BusinessRules = BusinessRules(),
              prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL) -> RecommendPipeline:
        return RecommendPipeline.for_engine(graph, engine, beam_width, top_k,
                                            PipelineConfig(top_n=top_k, rules=rules),
                                            catalog=(world.item_ids, world.item_codes),
                                            prefill_mask=prefill_mask)

    return build
