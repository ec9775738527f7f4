"""A partly migrated model as one SavedModel: its Torch stages inside, each as ``TorchCall``.

``export_migrated(MigratedExportConfig(plan=..., out=..., data=...))`` builds the plan's model,
exports each Torch stage's module on its own with ``torch.export`` (the stage's inputs on the
first batch of ``data`` are the example; every dimension the Keras model leaves open stays
dynamic) and compiles it with AOTInductor for the stage's device; then it saves a SavedModel
whose ``serving_default`` takes the model's inputs by name and walks the model in a
``tf.function``: TF stages as the original layers, each Torch stage as a ``TorchCall`` on its
package (an asset; :mod:`bridge.migration.served_stage`). Keras masks cross as bool tensors;
ragged inputs come as values + row splits (``ragged``: splits input -> the value inputs).

Every step of a migration can be deployed this way: the SavedModel loads with TensorFlow and
``custom_ops`` alone, carries warm-up requests (a version whose packages do not load never
serves), and ``xgr_boundaries`` gives every stage's outputs, which ``xgr parity
--saved_model`` compares with the TF model. A stage that cannot be exported (a Python-only
module) is refused with the stage's name and the reason.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from bridge.migration.functional import input_sources
from bridge.migration.plan import load_plan
from bridge.migration.runner import PlanRunner
from bridge.migration.served_outputs import (BOUNDARIES_SIGNATURE, MIGRATION_FILE,
                                             boundary_outputs, signature_outputs)
from bridge.migration.served_stage import (ServedStage, model_input_checks,
                                           ragged_input_checks, served_replacement)
from bridge.migration.stage_program import (StageProgram, describe_boundary, export_stage,
                                            flat_example, id_bounds, open_dims)
from bridge.parity.compare import compare
from bridge.parity.data import load_batches
from xgr_common.errors import ConfigError, ExportError, MigrationError, XgrError, require
from xgr_common.serving_names import SERVING_SIGNATURE, SERVING_SPEC_FILE
from xgr_export.saved_model import require_empty_folder
from xgr_export.torch_package import Package, package_aoti
from xgr_export.verify import FORBIDDEN_PACKAGES, run_fresh
from xgr_export.warmup_requests import split_requests, write_warmup_requests

_DEVICE = re.compile(r"^(cpu|cuda:\d+)$")


@dataclass(frozen=True)
class MigratedExportConfig:
    """plan: the plan file; out: a new folder; data: batches (npz / TFRecord) whose first is
    the stages' example and the check's input; devices: stage -> ``cpu`` / ``cuda:N`` (others
    on ``device``); ragged: splits input -> the value inputs it partitions; cache_dir:
    compiled packages reused across exports (a stage unchanged since the last step)."""

    plan: str | Path
    out: str | Path
    data: str | Path
    device: str = "cpu"
    devices: Mapping[str, str] = field(default_factory=dict)
    ragged: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cache_dir: str | Path | None = None
    batch_size: int = 32
    verify: bool = True
    intra_op_threads: int = 1

    def __post_init__(self) -> None:
        for stage, device in {"(default)": self.device, **self.devices}.items():
            require(isinstance(device, str) and bool(_DEVICE.match(device)), ConfigError,
                    f"device of stage {stage!r} must be 'cpu' or 'cuda:N', got {device!r}")
        for splits, values in self.ragged.items():
            require(isinstance(values, tuple) and len(values) >= 1 and splits not in values,
                    ConfigError, f"ragged {splits!r} must name a tuple of other inputs (its "
                                 f"values), got {values!r}")
        require(self.batch_size >= 1, ConfigError,
                f"batch_size must be >= 1, got {self.batch_size}")
        require(self.intra_op_threads >= 1, ConfigError,
                f"intra_op_threads must be >= 1, got {self.intra_op_threads}")

    def device_of(self, stage: str) -> str:
        return self.devices.get(stage, self.device)


@dataclass(frozen=True)
class StageExport:
    """One Torch stage as packaged: its device, contract and compile time (seconds)."""

    name: str
    device: str
    package: str          # the file name in the SavedModel's assets
    signature: str
    seconds: float


@dataclass(frozen=True)
class MigratedExportReport:
    """What was saved and, with ``verify``, how the reloaded SavedModel (TF + custom_ops, in
    a fresh process) compared with the TF model on the first batch."""

    saved_model: Path
    model: str
    torch_stages: tuple[StageExport, ...]
    tf_stages: tuple[str, ...]
    verified: tuple[dict, ...] = ()       # per output: name, max abs err, passed
    forbidden_modules: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.forbidden_modules and all(row["passed"] for row in self.verified)

    def to_json(self) -> dict:
        return {"saved_model": str(self.saved_model), "model": self.model, "ok": self.ok,
                "torch_stages": [vars(s) for s in self.torch_stages],
                "tf_stages": list(self.tf_stages), "verified": list(self.verified),
                "forbidden_modules": list(self.forbidden_modules)}


class _Walk:
    """The model and its replacements, held outside TF's tracking (a tracked Keras model
    would be saved as Keras objects; the SavedModel keeps only the traced graph).
    ``readers``: model input -> the first stage that reads it (or, for a ragged splits
    input, its values), named when a request's input is refused."""

    def __init__(self, staged, signature, ragged, readers):
        self.staged, self.replacements = staged, {}
        self.signature, self.ragged, self.readers = signature, ragged, readers

    def run(self, inputs: dict):
        # Every input's rank and fixed sizes first: a signature takes any shape of its dtype,
        # and nothing downstream (a Torch stage's checks included) runs before these pass.
        checks = [c for name, spec in self.signature.items()
                  for c in model_input_checks(name, inputs[name], spec, self.readers[name])]
        with tf.control_dependencies(checks):
            inputs = {name: tf.identity(value) for name, value in inputs.items()}
        checks = [c for splits, values in self.ragged.items()
                  for c in ragged_input_checks(splits, inputs[splits],
                                               {v: inputs[v] for v in values},
                                               self.readers[splits])]
        with tf.control_dependencies(checks):
            inputs = {name: tf.identity(value) for name, value in inputs.items()}
        return self.staged.run(inputs, self.replacements)


class MigratedModel(tf.Module):
    """What the SavedModel holds: one package asset per Torch stage and the two signatures.
    ``stages``: Torch stage -> (its ServedStage, its package file, its TF layer)."""

    def __init__(self, walk: _Walk, stages: Mapping[str, tuple], signature: dict,
                 intra_op_threads: int = 1):
        super().__init__(name="xgr_migrated_model")
        self.packages = {name: tf.saved_model.Asset(str(path))
                         for name, (_, path, _) in stages.items()}
        # Each TorchCall reads its package through the tracked asset, so the file travels
        # with the SavedModel and the graph reads its copy in assets/.
        walk.replacements = {name: served_replacement(served, self.packages[name], layer,
                                                      intra_op_threads)
                             for name, (served, _, layer) in stages.items()}
        self._walk = walk
        self.serve = tf.function(self._serve, input_signature=[signature])
        self.boundaries = tf.function(self._boundaries, input_signature=[signature])

    def _serve(self, inputs):
        return signature_outputs(self._walk.run(inputs)[0])

    def _boundaries(self, inputs):
        return boundary_outputs(self._walk.run(inputs)[1])


def _signature(model) -> dict[str, tf.TensorSpec]:
    """The model's inputs by name, dtypes and shapes as the Keras model declares them."""
    specs = {}
    for ref in model.inputs:
        require(not getattr(ref, "ragged", False) and not getattr(ref, "sparse", False),
                ExportError, f"model input {ref.name!r} is ragged or sparse: a served model "
                             "takes it as a values input and a row-splits input (two Keras "
                             "inputs; see migration_guide section 14)")
        specs[ref.name] = tf.TensorSpec(tuple(ref.shape), tf.as_dtype(ref.dtype), name=ref.name)
    return specs


def _readers(staged, ragged: Mapping[str, tuple[str, ...]], names: list[str]) -> dict[str, str]:
    """For each model input, the first stage that reads it; for each ragged splits input,
    the first that reads it or its values."""
    def first(wanted: set[str]) -> str:
        return next((s for s in staged.names if wanted & set(staged.sources(s))), "(no stage)")

    readers = {name: first({name}) for name in names}
    for splits, values in ragged.items():
        wanted = {splits, *values}
        unknown = sorted(wanted - set(names))
        require(not unknown, ConfigError, f"ragged {splits!r} -> {list(values)} names inputs "
                                          f"the model lacks: {unknown}; its inputs: {names}")
        readers[splits] = first(wanted)
    return readers


def _package_stage(runner: PlanRunner, name: str, batch: dict, device: str, folder: Path,
                   cache_dir) -> tuple[ServedStage, Package, float]:
    """Export and compile one Torch stage; refusals name the stage."""
    staged, module = runner.staged, runner.modules[name]
    call, layer = staged.call(name), staged.layer(name)
    args, kwargs, _ = staged.capture(batch, name)
    tensors = [x for x in tf.nest.flatten((args, kwargs)) if tf.is_tensor(x)]
    boundary = describe_boundary(name, module, layer, tensors, len(call.outputs))
    started = time.perf_counter()
    program = export_stage(StageProgram(module, boundary), flat_example(boundary, tensors),
                           open_dims(tensors, call.inputs, boundary), device)
    slot = "".join(c if c.isalnum() else "_" for c in name)
    try:
        package = package_aoti(program, folder / f"stage_{slot}.pt2", device, cache_dir)
    except ExportError as error:
        raise ExportError(f"stage {name!r} cannot be packaged for {device}: "
                          f"{_first_lines(error)}") from None
    served = ServedStage(
        boundary, tuple((s.dtype, s.dims) for s in package.inputs),
        {symbol: (lo, hi) for symbol, lo, hi in package.ranges},
        tuple((s.dtype, tuple(s.static_shape())) for s in package.outputs),
        id_bounds(module, layer), tuple(input_sources(call)))
    return served, package, time.perf_counter() - started


def _first_lines(error: BaseException) -> str:
    """An error's first line and, for a compiler's output, its first ``error:`` line: a
    refusal a person reads, not a page of generated C++."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    compiler = next((line for line in lines[1:] if "error:" in line), None)
    text = lines[0] if lines else type(error).__name__
    return text + (f" ({compiler[compiler.index('error:'):][:300]})" if compiler else "")


def _check_devices(config: MigratedExportConfig, torch_names: list[str]) -> None:
    """Refuses, before anything is compiled, a device this machine lacks (a package is
    compiled on a machine with the device it runs on), naming the stages placed there."""
    unknown = sorted(set(config.devices) - set(torch_names))
    require(not unknown, ConfigError, f"devices name stages that do not run in Torch: "
                                      f"{unknown}; the Torch stages are {torch_names}")
    placed: dict[str, list[str]] = {}
    for name in torch_names:
        if config.device_of(name).startswith("cuda"):
            placed.setdefault(config.device_of(name), []).append(name)
    if not placed:
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    has = ("no CUDA device" if count == 0 else
           f"{count} CUDA device{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})")
    for device, names in sorted(placed.items()):
        require(int(device.split(":")[1]) < count, ExportError,
                f"stages {names} are placed on {device}, but this machine has {has}: compile "
                "each package on a machine with the device it runs on, or place the stage "
                "on cpu")


def export_migrated(config: MigratedExportConfig,
                    progress: Callable[[str], None] = lambda line: None
                    ) -> MigratedExportReport:
    """Saves the plan's model, its Torch stages as TorchCall packages, in ``config.out``."""
    plan_path = Path(config.plan)
    plan = load_plan(plan_path)
    runner = PlanRunner(plan, plan_path.parent)
    staged = runner.staged
    require(staged.functional, MigrationError,
            "only Functional models export with their Torch stages inside: a subclassed "
            "model's call() is Python that wires its stages")
    signature = _signature(runner.model)
    readers = _readers(staged, config.ragged, list(signature))
    batches = load_batches(config.data, runner.model, config.batch_size)
    # Absolute: the check reloads the SavedModel in a process started in another folder.
    out = require_empty_folder(config.out).resolve()
    torch_names = [n for n in staged.names if runner.runtime(n) == "torch"]
    _check_devices(config, torch_names)
    exports, stages = [], {}
    with tempfile.TemporaryDirectory(prefix="xgr_stages_") as tmp:
        for name in torch_names:
            device = config.device_of(name)
            progress(f"stage {name}: torch.export + AOTInductor for {device}")
            served, package, seconds = _package_stage(runner, name, batches[0], device,
                                                      Path(tmp), config.cache_dir)
            exports.append(StageExport(name, device, package.path.name, package.signature,
                                       round(seconds, 2)))
            stages[name] = (served, package.path, staged.layer(name))
        module = MigratedModel(_Walk(staged, signature, dict(config.ragged), readers), stages,
                               signature, config.intra_op_threads)
        progress(f"saving the SavedModel to {out}")
        try:
            functions = {SERVING_SIGNATURE: module.serve.get_concrete_function(),
                         BOUNDARIES_SIGNATURE: module.boundaries.get_concrete_function()}
        except XgrError:
            raise
        except (TypeError, ValueError) as error:
            raise ExportError(f"the model does not trace in a tf.function with its Torch "
                              f"stages: {type(error).__name__}: {error}") from error
        # Variables the graphs read (Keras layers', a tf.Module's): tracked so they are saved.
        module.variables_read = list({id(v): v for f in functions.values()
                                      for v in f.variables}.values())
        tf.saved_model.save(module, str(out), signatures=functions)
    _write_extras(out, plan, batches[0], config, exports, staged, runner)
    report = MigratedExportReport(out, plan.model, tuple(exports),
                                  tuple(n for n in staged.names if n not in torch_names))
    if not config.verify:
        return report
    progress("reloading it in a fresh process (TensorFlow + custom_ops) to compare with TF")
    return _verify(report, runner, batches[0])


def _arrays(batch: Mapping) -> dict[str, np.ndarray]:
    return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in batch.items()}


def _write_extras(out: Path, plan, batch, config: MigratedExportConfig, exports, staged,
                  runner) -> None:
    """The serving hints, the warm-up requests and what the SavedModel holds (for parity)."""
    spec = {"ragged": {splits: list(values) for splits, values in config.ragged.items()}}
    (out / SERVING_SPEC_FILE).parent.mkdir(exist_ok=True)
    (out / SERVING_SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")
    # Requests of 1, 2 and 4 rows: a version whose packages do not load, or that refuses one
    # row, never goes live.
    write_warmup_requests(out, split_requests(_arrays(batch), ragged=dict(config.ragged)))
    record = {"plan": str(Path(config.plan)), "model": plan.model, "keras": plan.keras,
              "stages": {name: {"runtime": runner.runtime(name)} for name in staged.names},
              "ragged": spec["ragged"]}
    for stage in exports:
        record["stages"][stage.name].update(device=stage.device, package=stage.package)
    (out / MIGRATION_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _verify(report: MigratedExportReport, runner: PlanRunner, batch) -> MigratedExportReport:
    got = run_fresh(report.saved_model, _arrays(batch))
    modules = got.pop("modules").tolist()
    got.pop("seconds")
    reference = signature_outputs(runner.run_reference(batch)[0])
    rows = []
    for name, expected in reference.items():
        require(name in got, ExportError, f"the reloaded SavedModel gives no output {name!r}; "
                                          f"it gives {sorted(got)}")
        row = compare("(model output)", name, got[name], expected)
        rows.append({"output": name, "max_abs_err": row.max_abs, "passed": row.passed,
                     "problem": row.problem})
    forbidden = tuple(sorted(m for m in modules if m.split(".")[0] in FORBIDDEN_PACKAGES))
    return MigratedExportReport(report.saved_model, report.model, report.torch_stages,
                                report.tf_stages, tuple(rows), forbidden)
