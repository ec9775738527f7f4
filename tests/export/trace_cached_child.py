"""Child of ``test_traced_cached.py``: the cached search of a version 2 model (its prompts'
first tokens from a prompt cache's pool) traced for a CUDA package on the CPU, as
``trace_widths_child.py`` traces the plain one (the Triton interpreter off; the device checks
and backend choices that need CUDA switched off; nothing compiled or run). Prints, as JSON,
the Triton kernels of the traced program's launches, whether the suffix width, the block
table's width and the pool's page count stayed symbolic, how the pool is written, the
copies into new buffers and concatenations the program makes, and the float arguments of
its launches (AOTInductor types them float64) with those the kernel does not narrow.

    python tests/export/trace_cached_child.py [--layer_kernels]
"""

from __future__ import annotations

import json
import os
import sys

import triton

import torch_engine.attention as attention
import torch_engine.beam_search as beam_search
import torch_engine.engine as engine_module
from tests.export.trace_widths_child import functional_graph, launches_in, unbounded_dims
from tests.export.v2_spec import small_v2_spec
from tests.torch_engine.engine_worlds import small_world
from torch_engine.catalog import Catalog
from torch_engine.config import engine_config_for
from torch_engine.kernels import _common
from torch_engine.model import Model
from xgr_export import cached_package, torch_package
from xgr_export.config import EngineExportConfig


class _TargetOnly:
    """A Triton driver that names the GPU host's target and runs nothing."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)


class _Traced(Exception):
    """Stops the export once the program is traced (no compile on this host)."""


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run with the Triton interpreter off"
    # What needs a GPU is switched off: the device checks and the backend choices.
    _common.check_devices = lambda *args, **kwargs: None
    engine_module.resolve_backend = attention.resolve_backend = lambda name, device: "triton"
    # Inductor reads each kernel's Triton IR to learn which arguments it writes; that needs a
    # target, not a GPU. Without one it assumes every argument written, pool views included.
    triton.runtime.driver.set_active(_TargetOnly())
    beam_search.resolve_selection = lambda name, device: "triton"
    traced = {}

    def keep_program(program, *args, **kwargs):
        traced["program"], traced["extra"] = program, kwargs.get("extra", ())
        raise _Traced

    cached_package.torch_package.package_aoti = keep_program
    layer_kernels = "--layer_kernels" in sys.argv[1:]
    ids, codes = small_world()
    model = Model.from_preset("tiny", seed=1)
    if layer_kernels:
        model.fuse_projections(kernels=True)
    spec = small_v2_spec(model.config.hidden_size)
    engine = engine_module.Engine(model, Catalog.from_arrays(ids, codes), engine_config_for(
        spec, attention_backend="triton", selection_backend="triton", cuda_graphs=False))
    try:
        cached_package.export_cached_engine(engine, spec, "unused.pt2",
                                            EngineExportConfig(8, 6, max_batch=8),
                                            layer_kernels=layer_kernels)
    except _Traced:
        pass
    program = traced["program"]
    contract = torch_package.contract_of(program, "cuda:0")
    runtime = 5                      # the five engine inputs, no beam_slots
    table, slots, pool = contract.inputs[runtime + 1], contract.inputs[runtime + 2], \
        contract.inputs[runtime + 3]
    graph, signature = functional_graph(program, absent=(runtime,))
    launches = launches_in(graph)
    kernels = {launch["kernel"] for launch in launches}
    print(json.dumps({"kernels": sorted(kernels),
                      "symbolic": {"suffix": isinstance(slots.dims[1], str),
                                   "pages": isinstance(table.dims[1], str),
                                   "pool": isinstance(pool.dims[2], str)},
                      "cache_line": list(traced["extra"]),
                      "unbounded": unbounded_dims(program),
                      "layers": model.config.num_layers,
                      "pool_writes": pool_writes(graph, signature),
                      "copies_into_new_buffers": copies_into_new_buffers(graph),
                      "concatenations": sum(str(n.target) == "aten.cat.default"
                                            for n in graph.graph.nodes),
                      **float_arguments(launches)}))


def float_arguments(launches: list[dict]) -> dict:
    """``float_args``: the float scalar arguments of ``launches`` (``launches_in``) as
    ``kernel.argument``; ``float64_compute``: those whose kernel does not narrow them to
    float32 at entry. A package launches them as float64 scalars, and arithmetic with one
    runs in float64."""
    named = {(f"{launch['kernel']}.{name}", name in launch["float32_at_entry"])
             for launch in launches for name in launch["floats"]}
    return {"float_args": sorted(arg for arg, _ in named),
            "float64_compute": sorted(arg for arg, narrowed in named if not narrowed)}


_VIEWS = {"view", "_unsafe_view", "reshape", "select", "slice", "as_strided", "expand",
          "alias", "unsqueeze", "squeeze", "permute", "flatten"}


def _is_view(node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", "").split(".")[0] \
        in _VIEWS


def pool_writes(graph, signature) -> list[dict]:
    """How the program's new value of each input it mutates (the pool) is made: the chain of
    writes from the input to that value (each write's op, in order), whether the chain starts
    at the input itself rather than a view of it, and the ops that read a value of the chain
    after the write that replaces it. Inductor updates an input in place only when nothing
    reads a replaced value after its write, and (before torch 2.13) only when the writes
    target the input itself; otherwise it copies the whole input."""
    order = {node: position for position, node in enumerate(graph.graph.nodes)}
    nodes = {node.name: node for node in graph.graph.nodes}
    writes = []
    for output, name in signature.user_inputs_to_mutate.items():
        chain, write = [], nodes[output]
        while write.op == "call_function" and write.name != name:
            while _is_view(write):             # views of the written value, back to it
                write = write.args[0]
            if write.op != "call_function" or not write.args:
                break
            chain.append(write)
            write = write.args[0]
        chain.reverse()                        # the first write first
        late = []
        for value, replaced_by in zip([write, *chain], chain):
            old, readers = [value], set()      # the value and every view of it
            while old:
                node = old.pop()
                for user in node.users:
                    if _is_view(user):
                        old.append(user)
                    else:
                        readers.add(user)
            late += sorted(str(r.target) for r in readers if r is not replaced_by
                           and r.op != "output" and order[r] > order[replaced_by])
        writes.append({"input": name, "ops": [str(w.target) for w in chain],
                       "onto": "input" if write.name == name else
                       "view" if _is_view(write) else "other",
                       "reads_after": late})
    return writes


def copies_into_new_buffers(graph) -> int:
    """``aten.copy`` ops whose destination is a new, empty buffer (a layer's keys and
    values copied out of the tensors a kernel returned): each is a kernel a call."""
    fresh = {"aten.new_empty.default", "aten.empty_like.default", "aten.empty.memory_format"}
    return sum(str(n.target) == "aten.copy.default" and str(n.args[0].target) in fresh
               for n in graph.graph.nodes)


if __name__ == "__main__":
    main()
