"""Child of ``test_traced_widths.py``: the engine's Triton search traced with a dynamic beam
width on the CPU, as a CUDA export traces it (the Triton interpreter off, so every launcher
runs under tracing with symbolic sizes; the device checks and backend choices that need CUDA
are switched off, nothing is compiled or run). Prints, as JSON, the traced range of the width
and the constant arguments of every Triton launch, as AOTInductor's own trace of the program
(the ops decomposed into their launches) holds them.

    python tests/export/trace_widths_child.py 16,24,32
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run with the Triton interpreter off"

import torch_engine.attention as attention  # noqa: E402
import torch_engine.beam_search as beam_search  # noqa: E402
import torch_engine.engine as engine_module  # noqa: E402
from torch_engine.kernels import _common  # noqa: E402

_common.check_devices = lambda *args, **kwargs: None
engine_module.resolve_backend = attention.resolve_backend = lambda name, device: "triton"
beam_search.resolve_selection = lambda name, device: "triton"

from torch_engine.catalog import Catalog  # noqa: E402
from torch_engine.config import EngineConfig  # noqa: E402
from torch_engine.model import Model  # noqa: E402
from xgr_common.prompt_spec import PromptSpec  # noqa: E402
from xgr_export import engine_package, torch_package  # noqa: E402
from xgr_export.config import EngineExportConfig  # noqa: E402


class _Traced(Exception):
    """Stops the export once the program is traced (no compile on this host)."""


def main(widths: tuple[int, ...]) -> None:
    traced = {}

    def keep_program(program, *args, **kwargs):
        traced["program"] = program
        raise _Traced

    torch_package.package_aoti = keep_program
    model = Model.from_preset("tiny", seed=0)
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(3000), size=300, replace=False).astype(np.int64)
    codes = rng.integers(0, 8, (300, 3)).astype(np.int32)
    engine = engine_module.Engine(model, Catalog.from_arrays(ids, codes),
                                  EngineConfig(attention_backend="triton",
                                               selection_backend="triton", cuda_graphs=False))
    spec = PromptSpec(model_hidden=model.config.hidden_size, keep_last=40,
                      window_seconds=3650 * 86400)
    try:
        engine_package.export_engine(
            engine, spec, "unused.pt2",
            EngineExportConfig(widths[0], 10, max_batch=16, device="cpu", beam_widths=widths))
    except _Traced:
        pass
    program = traced["program"]
    slots = [node for node in program.graph.nodes if node.op == "placeholder"
             and node.name in program.graph_signature.user_inputs][5]
    width = slots.meta["val"].shape[0].node.expr
    bounds = program.range_constraints[width]
    print(json.dumps({"low": int(bounds.lower), "high": int(bounds.upper),
                      "launches": launches(program), "unbounded": unbounded_dims(program)}))


def unbounded_dims(program) -> list[str]:
    """The input-sized symbols of ``program`` without a finite upper bound (data-dependent
    ``u`` symbols aside): AOTInductor would size their kernels' indexing by the example."""
    from torch.utils._sympy.numbers import int_oo

    return sorted(str(symbol) for symbol, bounds in program.range_constraints.items()
                  if not str(symbol).startswith("u")
                  and (bounds.upper == int_oo or int(bounds.upper) >= 2 ** 62))


def functional_graph(program, absent: tuple[int, ...] = ()):
    """``program`` traced as AOTInductor traces it (the triton_ops decomposed, the sizes
    symbolic, the mutations functional): the graph and its signature. ``absent``: positions
    of the program's arguments that were exported as None."""
    from torch._functorch import config as functorch_config
    from torch._functorch.aot_autograd import aot_export_module
    from torch._guards import detect_fake_mode

    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"]
    user = [node.meta["val"] for node in placeholders
            if node.name in program.graph_signature.user_inputs]
    for position in absent:
        user.insert(position, None)
    with functorch_config.patch(decompose_custom_triton_ops=True), \
            detect_fake_mode([node.meta["val"] for node in placeholders]):
        return aot_export_module(program.module(), tuple(user), trace_joint=False)


def launches(program, absent: tuple[int, ...] = ()) -> list[dict]:
    """(kernel name, its int and bool arguments, its float arguments and those of them it
    narrows to float32 at entry) of every Triton launch in ``program``'s ops
    (``functional_graph``)."""
    return launches_in(functional_graph(program, absent)[0])


def launches_in(graph) -> list[dict]:
    """``launches`` of a functional graph."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    found = []
    for node in graph.graph.nodes:
        if node.op != "call_function" or "triton_kernel_wrapper" not in str(node.target):
            continue
        kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
        while not hasattr(kernel, "params") and hasattr(kernel, "fn"):
            kernel = kernel.fn       # the @jit function under autotuners and heuristics
        args = {**node.kwargs["kwargs"],
                **kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])}
        constexprs = {p.name for p in getattr(kernel, "params", ()) if p.is_constexpr}
        floats = sorted(name for name, value in args.items()
                        if isinstance(value, float) and name not in constexprs)
        found.append({"kernel": getattr(kernel, "__name__", "?"),
                      "ints": {name: value for name, value in args.items()
                               if isinstance(value, (int, bool))},
                      "floats": floats,
                      "float32_at_entry": [name for name in floats
                                           if _narrowed_at_entry(kernel, name)]})
    return found


def _narrowed_at_entry(kernel, name: str) -> bool:
    """Whether ``kernel``'s source narrows argument ``name`` (``name = tl.cast(name,
    tl.float32)``): a package launches a Python float as a float64 scalar."""
    import inspect
    import re

    pattern = rf"\b{name}\s*=\s*tl\.cast\(\s*{name}\s*,\s*tl\.float32\s*\)"
    return re.search(pattern, inspect.getsource(kernel.fn)) is not None


if __name__ == "__main__":
    main(tuple(int(w) for w in sys.argv[1].split(",")))
