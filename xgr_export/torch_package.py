"""Turn a torch module into a package the TorchCall op runs: AOTInductor ``.pt2`` or TorchScript.

Every package carries its calling contract (``custom_ops/cc/torch_call/torch/signature.h``):
input dtypes and dims (literal sizes or named symbols shared across inputs, with ranges), output
dtypes, and the device. The op checks each call against it, because compiled code trusts its
inputs and would read out of bounds on a wrong batch or dtype instead of raising.

AOTInductor takes a long while even for a small model, so ``package_aoti`` keeps compiled
packages in a cache folder keyed by a hash of the exported graph, its weights, the torch
version and the device.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from xgr_common.errors import ExportError, InvalidInputError, require
from xgr_export.inductor_first_pass import cuda_first_pass
from xgr_export.inductor_int_arrays import int_arrays_keyed_by_buffer
from xgr_common.import_order import triton_importable

SIGNATURE_KEY = "xgr_signature"          # AOTInductor metadata key (torch_call packages.cc)
SIGNATURE_FILE = "xgr_signature.txt"     # TorchScript extra file (torch_call packages.cc)
_INT64_MAX = 2**63 - 1
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool")


def _require_traceable() -> None:
    # torch.export and Inductor import triton: see xgr_common/import_order.py.
    require(triton_importable(), ExportError,
            "cannot trace or compile torch code in this process: tensorflow was imported before "
            "triton, and importing triton now would abort the process (both bundle LLVM). "
            "Import xgr_export (or triton) before tensorflow, or build the package in a "
            "separate process")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a package: dtype name and dims (int, or a symbol name)."""

    dtype: str
    dims: tuple[int | str, ...]

    def static_shape(self) -> list[int | None]:
        """Shape for TF shape inference: symbols become ``None``."""
        return [d if isinstance(d, int) else None for d in self.dims]


@dataclass(frozen=True)
class Package:
    """A package file and its contract. ``format`` is ``"aoti"`` or ``"torchscript"``;
    ``rules``: the value rules the program's inputs obey, as contract lines
    (``xgr_common.value_rules.contract_lines``), empty for a program without any; ``replay``:
    how TorchCall runs it (``bucket``, ``pad`` and ``graphs`` lines, see ``Replay``), empty
    to run every call at its own shape; ``tables``: names of the last inputs, fixed-size
    tables that TorchCall loads once from a tables file and passes on every run (callers send
    ``caller_inputs``)."""

    path: Path
    format: str
    device: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ranges: tuple[tuple[str, int, int], ...]
    rules: tuple[str, ...] = ()
    replay: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()

    @property
    def caller_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs a caller sends (the tables held by the runtime excluded; with a prompt
        cache, its four inputs are the runtime's and callers send ``frozen_lengths`` int32
        [B] and ``user_keys`` uint8 [B, 8] in their place)."""
        inputs = self.inputs[:len(self.inputs) - len(self.tables)]
        runtime = self.cache_runtime
        if runtime is None:
            return inputs
        batch = inputs[0].dims[0]
        return inputs[:runtime] + (TensorSpec("int32", (batch,)),
                                   TensorSpec("uint8", (batch, 8)))

    @property
    def cache_runtime(self) -> int | None:
        """The first of the program's prompt-cache inputs (its ``cache`` line), or None."""
        for line in self.extra:
            words = line.split()
            if words and words[0] == "cache":
                return next(int(w.split("=", 1)[1]) for w in words if w.startswith("runtime="))
        return None

    def to_json(self) -> dict:
        """Plain data (for manifests written by a packaging process)."""
        return {"path": str(self.path), "format": self.format, "device": self.device,
                "inputs": [[t.dtype, list(t.dims)] for t in self.inputs],
                "outputs": [[t.dtype, list(t.dims)] for t in self.outputs],
                "ranges": [list(r) for r in self.ranges], "rules": list(self.rules),
                "replay": list(self.replay), "tables": list(self.tables),
                "extra": list(self.extra)}

    @classmethod
    def from_json(cls, data: dict) -> "Package":
        def specs(items):
            return tuple(TensorSpec(dtype, tuple(dims)) for dtype, dims in items)
        return cls(Path(data["path"]), data["format"], data["device"], specs(data["inputs"]),
                   specs(data["outputs"]), tuple(tuple(r) for r in data["ranges"]),
                   tuple(data.get("rules", ())), tuple(data.get("replay", ())),
                   tuple(data.get("tables", ())), tuple(data.get("extra", ())))

    @property
    def signature(self) -> str:
        """The contract as the op reads it (one entry a line)."""
        lines = [f"device {self.device}"]
        lines += [f"in {s.dtype} {' '.join(map(str, s.dims))}".rstrip() for s in self.inputs]
        lines += [f"out {s.dtype} {' '.join(map(str, s.dims))}".rstrip() for s in self.outputs]
        lines += [f"dim {name} {lo} {hi}" for name, lo, hi in self.ranges]
        lines += list(self.rules)
        lines += list(self.replay)
        lines += [f"table {name}" for name in self.tables]
        lines += list(self.extra)
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Bucket:
    """One input dimension that TorchCall rounds up before the package runs: to the next
    power of two (``multiple`` 0), or ``size + offset`` up to a multiple of ``multiple``, minus
    ``offset``; clamped to the dimension's range."""

    input: int
    dim: int
    multiple: int = 0
    offset: int = 0

    def line(self) -> str:
        if self.multiple == 0:
            return f"bucket {self.input} {self.dim} pow2"
        return f"bucket {self.input} {self.dim} multiple {self.multiple} offset {self.offset}"


@dataclass(frozen=True)
class Replay:
    """How TorchCall runs a package (``custom_ops/cc/torch_call/torch/signature.h``): each call
    at its bucketed shape, padded with each input's padding value (``pads``: input -> value,
    0 elsewhere), and on CUDA replayed as one captured graph per bucket (``graphs``: at most
    that many kept; 0: none). Padding must be inputs that break no value rule and whose results
    the program keeps apart from the real ones (the rows and columns are cut off again)."""

    buckets: tuple[Bucket, ...] = ()
    pads: tuple[tuple[int, float], ...] = ()
    graphs: int = 0

    def __post_init__(self) -> None:
        require(isinstance(self.graphs, int) and self.graphs >= 0, InvalidInputError,
                f"Replay.graphs must be an int >= 0, got {self.graphs!r}")
        for b in self.buckets:
            require(b.multiple >= 0 and b.offset >= 0, InvalidInputError,
                    f"Replay bucket {b} needs multiple >= 0 and offset >= 0")

    def lines(self) -> tuple[str, ...]:
        out = [b.line() for b in self.buckets]
        out += [f"pad {i} {value:g}" for i, value in self.pads]
        if self.graphs:
            out.append(f"graphs {self.graphs}")
        return tuple(out)


def _dtype_name(dtype: torch.dtype, what: str) -> str:
    name = str(dtype).removeprefix("torch.")
    require(name in _DTYPES, ExportError,
            f"{what} has dtype {name}; TorchCall carries only {', '.join(_DTYPES)}")
    return name


def _dim(size: Any) -> int | str:
    """A literal size, or a symbolic one as a token without spaces (``s0``, ``2*s0``)."""
    if isinstance(size, torch.SymInt):
        return str(size).replace(" ", "")  # int() would specialise it to the example size
    return int(size)


def _spec(value: Any, what: str) -> TensorSpec:
    require(isinstance(value, torch.Tensor), ExportError,
            f"{what} must be a tensor, got {type(value).__name__}")
    return TensorSpec(_dtype_name(value.dtype, what), tuple(_dim(s) for s in value.shape))


def _bound(value: Any, unbounded: int) -> int:
    """A range end as an int; torch's ``int_oo`` (no bound) becomes ``unbounded``."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return unbounded


def contract_of(program: torch.export.ExportedProgram, device: str) -> Package:
    """The contract of an exported program (``path`` left empty until it is written)."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    # An input given as None (an optional argument left out) is no input of the package.
    inputs = tuple(_spec(placeholders[name].meta["val"], f"input {name!r}")
                   for name in program.graph_signature.user_inputs if name is not None)
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = output_node.args[0]
    outputs = tuple(_spec(v.meta["val"], f"output {i}") for i, v in enumerate(values))
    ranges = []
    for symbol, value_range in program.range_constraints.items():
        ranges.append((str(symbol), _bound(value_range.lower, 0),
                       min(_bound(value_range.upper, _INT64_MAX), _INT64_MAX)))
    return Package(Path(), "aoti", device, inputs, outputs, tuple(sorted(ranges)))


def _cache_key(program: torch.export.ExportedProgram, device: str, signature: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"{torch.__version__}|{device}|{signature}|{program.graph_module.code}|"
                  f"{program.range_constraints}".encode())
    for name, tensor in sorted({**program.state_dict, **program.constants}.items()):
        if isinstance(tensor, torch.Tensor):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]


def export_program(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                   dynamic_shapes: Any = None, device: str = "cpu") -> torch.export.ExportedProgram:
    """``torch.export`` of ``module`` on ``device`` (strict=False: the engine uses Python
    control flow on shapes that torch.export's non-strict tracer handles)."""
    require(len(example_inputs) > 0, InvalidInputError, "example_inputs must not be empty")
    _require_traceable()
    module = module.to(device).eval()
    args = torch.utils._pytree.tree_map(
        lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tuple(example_inputs))
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as err:  # torch raises many types here; the user needs the cause
        raise ExportError(f"torch.export of {type(module).__name__} failed: {err}") from err


_BUILTIN_NAMESPACES = ("aten", "prims", "_operator", "higher_order")


def is_triton_op(name: str) -> bool:
    """Whether custom op ``name`` ("namespace::op") was registered with
    ``torch.library.triton_op``: AOTInductor decomposes it into its Triton kernels and compiles
    them into the package. (``get_triton_kernels_for_op`` is no test: its static scan finds no
    kernel when the op launches them through helper functions.)"""
    from torch._library.triton import triton_ops_to_kernels

    return name in triton_ops_to_kernels


def python_custom_ops(program: torch.export.ExportedProgram) -> list[str]:
    """Custom ops in ``program`` that only Python can run: registered with
    ``torch.library.custom_op`` (opaque to AOTInductor), not ``torch.library.triton_op`` (whose
    Triton kernels AOTInductor compiles into the package)."""
    names = set()
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        name = target._schema.name  # "namespace::op"
        if target.namespace not in _BUILTIN_NAMESPACES and not is_triton_op(name):
            names.add(name)
    return sorted(names)


def _unify_dims(contract: Package, pairs) -> Package:
    """``contract`` with the second dim of each pair named like the first."""
    inputs = [list(spec.dims) for spec in contract.inputs]
    for (i, d), (j, e) in pairs:
        require(i < len(inputs) and d < len(inputs[i]) and j < len(inputs) and
                e < len(inputs[j]), InvalidInputError,
                f"same_dims pair {((i, d), (j, e))} names a dim the program does not have")
        inputs[j][e] = inputs[i][d]
    specs = tuple(TensorSpec(s.dtype, tuple(dims)) for s, dims in zip(contract.inputs, inputs))
    return replace(contract, inputs=specs)


def package_aoti(program: torch.export.ExportedProgram, out_path: str | os.PathLike,
                 device: str = "cpu", cache_dir: str | os.PathLike | None = None,
                 runtime_ops: tuple[str, ...] = (),
                 same_dims: Sequence[tuple[tuple[int, int], tuple[int, int]]] = (),
                 rules: Sequence[str] = (), replay: Replay = Replay(),
                 tables: Sequence[str] = (), extra: Sequence[str] = ()) -> Package:
    """Compile ``program`` with AOTInductor into ``out_path`` (a ``.pt2``) with its contract.

    With ``cache_dir``, a package compiled before from the same graph, weights, torch version
    and device is copied instead of compiled again. ``runtime_ops`` names custom ops that the
    serving process registers itself (C++ libraries linked beside TorchCall); any other op that
    only Python can run is refused, because a TorchCall process has no Python torch.
    ``same_dims`` pairs ``((input, dim), (input, dim))`` that the caller must keep equal
    although the program traced them apart; the op then checks them as one. ``rules``:
    the value rules of the program's inputs, recorded in the contract (``Package.rules``);
    ``replay``: bucketed shapes and CUDA graphs for TorchCall (``Package.replay``);
    ``tables``: names of the program's last inputs that TorchCall holds (``Package.tables``);
    ``extra``: more contract lines (a ``cache`` line, ``xgr_export.cached_package``).
    """
    out_path = Path(out_path)
    require(out_path.suffix == ".pt2", InvalidInputError,
            f"out_path must end in .pt2, got {out_path.name}")
    _require_traceable()
    unservable = [name for name in python_custom_ops(program) if name not in runtime_ops]
    require(not unservable, ExportError,
            f"the program calls custom ops registered from Python ({', '.join(unservable)}): "
            f"a process serving TorchCall has no Python to run them. Register Triton kernels "
            f"with torch.library.triton_op (AOTInductor then embeds them), or export the plain "
            f"torch path (e.g. EngineConfig(attention_backend='torch', "
            f"selection_backend='torch'))")
    contract = replace(_unify_dims(contract_of(program, device), same_dims),
                       rules=tuple(rules), replay=replay.lines(), tables=tuple(tables),
                       extra=tuple(extra))
    for name, spec in zip(contract.tables, contract.inputs[-len(tables):] if tables else ()):
        require(all(isinstance(d, int) for d in spec.dims), ExportError,
                f"table {name!r} has dynamic dims {spec.dims}: tables have fixed sizes")
    for bucket in replay.buckets:
        require(bucket.input < len(contract.inputs) and
                bucket.dim < len(contract.inputs[bucket.input].dims) and
                isinstance(contract.inputs[bucket.input].dims[bucket.dim], str),
                InvalidInputError,
                f"Replay buckets input {bucket.input} dim {bucket.dim}, which is not a dynamic "
                f"dimension of the program")
    key = _cache_key(program, device, contract.signature)
    cached = Path(cache_dir) / f"{key}.pt2" if cache_dir else None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if cached is not None and cached.exists():
        shutil.copyfile(cached, out_path)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / "model.pt2"
            try:
                with int_arrays_keyed_by_buffer(), cuda_first_pass(device) as first_pass:
                    torch._inductor.aoti_compile_and_package(
                        program, package_path=str(built),
                        inductor_configs={**first_pass, "aot_inductor.metadata": {
                            SIGNATURE_KEY: contract.signature}})
            except Exception as err:
                raise ExportError(f"AOTInductor could not compile the program for {device}: "
                                  f"{err}; package_torchscript is the fallback") from err
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp_cached = cached.with_suffix(f".{os.getpid()}.tmp")
                shutil.copyfile(built, tmp_cached)
                os.replace(tmp_cached, cached)  # atomic: concurrent builders never see half
            shutil.copyfile(built, out_path)
    return replace(contract, path=out_path)


def package_torchscript(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                        out_path: str | os.PathLike,
                        dynamic_dims: dict[tuple[int, int], tuple[str, int, int]] | None = None,
                        device: str = "cpu", script: bool = False) -> Package:
    """Trace ``module`` to TorchScript in ``out_path`` (``.pt``), for what AOTInductor cannot
    compile; ``script=True`` compiles it with ``torch.jit.script`` instead, keeping
    data-dependent control flow that tracing would freeze.

    ``dynamic_dims`` maps ``(input index, dim index)`` to ``(symbol, min, max)``; every other
    input dim is fixed to its example size. Output dims are named per output (unchecked).
    """
    out_path = Path(out_path)
    require(out_path.suffix in (".pt", ".ts"), InvalidInputError,
            f"out_path must end in .pt or .ts, got {out_path.name}")
    dynamic_dims = dict(dynamic_dims or {})
    _require_traceable()
    module = module.to(device).eval()
    args = torch.utils._pytree.tree_map(
        lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tuple(example_inputs))
    inputs, ranges = [], {}
    for i, t in enumerate(args):
        dims = []
        for d, size in enumerate(t.shape):
            if (i, d) in dynamic_dims:
                name, lo, hi = dynamic_dims[(i, d)]
                require(lo <= size <= hi, InvalidInputError,
                        f"example input {i} dim {d} = {size} lies outside {name} [{lo}, {hi}]")
                ranges[name] = (lo, hi)
                dims.append(name)
            else:
                dims.append(int(size))
        inputs.append(TensorSpec(_dtype_name(t.dtype, f"input {i}"), tuple(dims)))
    with torch.inference_mode():
        traced = (torch.jit.script(module) if script
                  else torch.jit.trace(module, args, check_trace=False))
        results = traced(*args)
    results = results if isinstance(results, (tuple, list)) else (results,)
    outputs = tuple(TensorSpec(_dtype_name(r.dtype, f"output {k}"),
                               tuple(f"out{k}_{d}" for d in range(r.dim())))
                    for k, r in enumerate(results))
    package = Package(out_path, "torchscript", device, tuple(inputs), outputs,
                      tuple((n, lo, hi) for n, (lo, hi) in sorted(ranges.items())))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(traced, str(out_path), _extra_files={SIGNATURE_FILE: package.signature})
    return package
