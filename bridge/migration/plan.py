"""The migration plan: which stages of a Keras model run in TF and which in Torch.

A plan is a small JSON file that teams commit beside their model::

    {
      "version": 1,
      "model": "my_team.model:build_model",
      "keras": "tf_keras",
      "stages": {
        "profile_tower": {"runtime": "torch", "module": "my_team.torch_tower:Tower"},
        "profile_projection": {"runtime": "torch", "converted": "converted/profile_projection"}
      }
    }

``model`` names a factory (``pkg.mod:function``) returning the Keras model; ``keras`` says
which Keras it is written in (``keras3``, the default, or ``tf_keras``: Keras 2, run with
``TF_USE_LEGACY_KERAS=1``; see :mod:`bridge.migration.keras_flavours`). Stages not listed run
in TF. A Torch stage is either a hand-written ``nn.Module`` class (``module``,
built with ``Class.from_keras_layer(layer)`` when the class defines it, else ``Class(**kwargs)``)
or a stage converted by ``xgr migrate auto`` (``converted``: a folder relative to the plan file
holding ``graph.json`` + ``tensors.safetensors``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from bridge.migration.keras_flavours import KERAS3, check_flavour
from xgr_common.errors import MigrationError

PLAN_VERSION = 1
RUNTIMES = ("tf", "torch")
_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def check_import_spec(spec: str, what: str) -> str:
    """``spec`` must read ``pkg.mod:Name``; returns it or raises MigrationError naming ``what``."""
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise MigrationError(f"{what} must be 'package.module:Name', got {spec!r}")
    return spec


@dataclass(frozen=True)
class StagePlan:
    """Where one stage runs. ``module`` / ``converted`` / ``kwargs`` only for ``torch``."""

    name: str
    runtime: str = "tf"
    module: str | None = None
    converted: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"stage {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise MigrationError(f"stage names must be non-empty strings, got {self.name!r}")
        if self.runtime not in RUNTIMES:
            raise MigrationError(f"{where}: runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        if self.runtime == "tf":
            if self.module or self.converted or self.kwargs:
                raise MigrationError(f"{where}: runtime 'tf' takes no module, converted or kwargs")
            return
        if (self.module is None) == (self.converted is None):
            raise MigrationError(f"{where}: runtime 'torch' needs exactly one of 'module' "
                                 f"(pkg.mod:Class) or 'converted' (a folder), got "
                                 f"module={self.module!r}, converted={self.converted!r}")
        if self.module is not None:
            check_import_spec(self.module, f"{where}: module")
        if self.converted is not None:
            path = Path(self.converted)
            if path.is_absolute() or ".." in path.parts:
                raise MigrationError(f"{where}: converted must be a folder inside the plan's "
                                     f"folder (relative, no '..'), got {self.converted!r}")
        if not isinstance(self.kwargs, Mapping):
            raise MigrationError(f"{where}: kwargs must be a mapping, got {type(self.kwargs)}")
        if self.converted is not None and self.kwargs:
            raise MigrationError(f"{where}: kwargs apply to 'module' stages only")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runtime": self.runtime}
        for key in ("module", "converted"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.kwargs:
            out["kwargs"] = dict(self.kwargs)
        return out


@dataclass(frozen=True)
class MigrationPlan:
    """A model factory and the stages that do not run in TF (listed TF stages are allowed)."""

    model: str
    stages: tuple[StagePlan, ...] = ()
    version: int = PLAN_VERSION
    keras: str = KERAS3

    def __post_init__(self) -> None:
        check_import_spec(self.model, "plan 'model' (the model factory)")
        check_flavour(self.keras, "plan 'keras'")
        if self.version != PLAN_VERSION:
            raise MigrationError(f"plan version {self.version} is not supported "
                                 f"(this xgr-bridge reads version {PLAN_VERSION})")
        names = [s.name for s in self.stages]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise MigrationError(f"plan lists stages more than once: {duplicates}")

    def stage(self, name: str) -> StagePlan:
        """The plan for ``name`` (a TF stage when the plan does not list it)."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        return StagePlan(name)

    def with_stage(self, stage: StagePlan) -> "MigrationPlan":
        """A new plan with ``stage`` replacing the entry of the same name (TF entries dropped)."""
        kept = tuple(s for s in self.stages if s.name != stage.name)
        added = () if stage.runtime == "tf" else (stage,)
        return replace(self, stages=kept + added)

    def torch_stages(self) -> tuple[StagePlan, ...]:
        return tuple(s for s in self.stages if s.runtime == "torch")

    def check_stages_exist(self, stage_names: list[str]) -> None:
        """Raise when the plan names stages the model does not have (typos, renamed layers)."""
        unknown = [s.name for s in self.stages if s.name not in stage_names]
        if unknown:
            raise MigrationError(f"plan names stages the model lacks: {unknown}; "
                                 f"the model's stages are {stage_names}")

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "model": self.model, "keras": self.keras,
                "stages": {s.name: s.to_json() for s in self.stages}}

    @classmethod
    def from_json(cls, payload: Any, source: str = "plan") -> "MigrationPlan":
        if not isinstance(payload, dict):
            raise MigrationError(f"{source}: expected a JSON object, got {type(payload).__name__}")
        unknown = set(payload) - {"version", "model", "keras", "stages"}
        if unknown:
            raise MigrationError(f"{source}: unknown keys {sorted(unknown)}; "
                                 "allowed: version, model, keras, stages")
        if "model" not in payload:
            raise MigrationError(f"{source}: missing 'model' (the factory, pkg.mod:function)")
        stages = payload.get("stages", {})
        if not isinstance(stages, dict):
            raise MigrationError(f"{source}: 'stages' must map stage names to entries")
        parsed = []
        for name, entry in stages.items():
            if not isinstance(entry, dict):
                raise MigrationError(f"{source}: stage {name!r} must be an object")
            extra = set(entry) - {"runtime", "module", "converted", "kwargs"}
            if extra:
                raise MigrationError(f"{source}: stage {name!r} has unknown keys {sorted(extra)}")
            parsed.append(StagePlan(name=name, **entry))
        return cls(model=payload["model"], stages=tuple(parsed),
                   version=payload.get("version", PLAN_VERSION),
                   keras=payload.get("keras", KERAS3))


def load_plan(path: str | Path) -> MigrationPlan:
    """Read and validate a plan file."""
    path = Path(path)
    if not path.is_file():
        raise MigrationError(f"plan file {path} does not exist; create one with "
                             "`xgr migrate init --plan PATH --model pkg.mod:function`")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise MigrationError(f"plan file {path} is not valid JSON: {error}") from None
    return MigrationPlan.from_json(payload, source=str(path))


def save_plan(plan: MigrationPlan, path: str | Path) -> None:
    """Write ``plan`` as indented JSON (stable key order, so diffs stay small); creates the
    plan's folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_json(), indent=2) + "\n")
