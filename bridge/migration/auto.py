"""``xgr migrate auto``: convert stages, store the converted ones beside the plan, update it.

Converted stages land in ``<plan folder>/converted/<stage>/`` (``graph.json`` +
``tensors.safetensors``) and switch to ``runtime: torch``. Stages that cannot convert keep
their current runtime; their reasons come back together. Conversion is all-or-nothing per
stage: a stage is never partly moved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from bridge.migration.convert import StageConversion, convert_stages
from bridge.migration.plan import MigrationPlan, StagePlan
from bridge.onnx_torch.graph import save_graph

CONVERTED_DIR = "converted"


def stage_folder(name: str) -> str:
    """Folder of a converted stage, relative to the plan (``#`` of shared layers made safe)."""
    return f"{CONVERTED_DIR}/{name.replace('#', '_call')}"


def auto_migrate(plan: MigrationPlan, plan_dir: str | Path, model: Any,
                 names: list[str], batch: Mapping[str, Any] | None = None,
                 progress: bool = False) -> tuple[MigrationPlan, list[StageConversion]]:
    """Convert ``names``; returns the updated plan (not yet saved) and every stage's outcome."""
    results = convert_stages(model, names, batch, progress)
    for result in results:
        if result.ok:
            folder = stage_folder(result.name)
            save_graph(Path(plan_dir) / folder, result.spec, dict(result.constants))
            plan = plan.with_stage(StagePlan(result.name, "torch", converted=folder))
    return plan, results
