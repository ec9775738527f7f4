"""The stored form of a converted stage: a graph description (JSON) beside its tensors.

``<dir>/graph.json`` lists the graph's inputs, outputs, opsets and nodes (op type, domain,
input/output names, attributes); ``<dir>/tensors.safetensors`` holds its constants (weights,
folded shapes, tensor-valued attributes under ``<node>/<attr>``). Loading needs neither onnx
nor TF, so a converted stage runs wherever torch runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bridge.onnx_torch.registry import GraphNode
from xgr_common.errors import MigrationError

FORMAT = "xgr-onnx-torch/1"
GRAPH_FILE = "graph.json"
TENSORS_FILE = "tensors.safetensors"
TENSOR_ATTR = "__tensor__"   # attrs value {"__tensor__": key} refers to a stored tensor


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: ``shape`` uses None for dynamic dimensions."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]


@dataclass(frozen=True)
class GraphSpec:
    """A converted graph. A stage whose tensors carry Keras masks takes, after its data
    inputs, one bool mask per input listed in ``mask_inputs`` (positions among the data
    inputs), and returns, after its data outputs, the masks of the outputs in
    ``mask_outputs``."""

    opsets: dict[str, int]
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    nodes: tuple[GraphNode, ...]
    mask_inputs: tuple[int, ...] = ()
    mask_outputs: tuple[int, ...] = ()

    def opset(self, domain: str) -> int:
        return self.opsets.get(domain, self.opsets.get("ai.onnx" if domain == "" else domain, 1))


def save_graph(directory: Path, spec: GraphSpec, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``graph.json`` and ``tensors.safetensors`` under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    stored: dict[str, torch.Tensor] = {k: v.contiguous() for k, v in tensors.items()}
    nodes = []
    for node in spec.nodes:
        attrs = {}
        for key, value in node.attrs.items():
            if isinstance(value, torch.Tensor):
                stored[f"{node.name}/{key}"] = value.contiguous()
                value = {TENSOR_ATTR: f"{node.name}/{key}"}
            attrs[key] = value
        nodes.append({**asdict(node), "attrs": attrs})
    payload = {"format": FORMAT, "opsets": spec.opsets,
               "inputs": [asdict(v) for v in spec.inputs],
               "outputs": [asdict(v) for v in spec.outputs],
               "constants": sorted(tensors), "nodes": nodes,
               "mask_inputs": list(spec.mask_inputs), "mask_outputs": list(spec.mask_outputs)}
    (directory / GRAPH_FILE).write_text(json.dumps(payload, indent=1) + "\n")
    save_file(stored, str(directory / TENSORS_FILE))


def load_graph(directory: Path) -> tuple[GraphSpec, dict[str, torch.Tensor]]:
    """Read a stored graph; returns the spec and its constants (weights and folded values)."""
    graph_path, tensor_path = directory / GRAPH_FILE, directory / TENSORS_FILE
    for path in (graph_path, tensor_path):
        if not path.is_file():
            raise MigrationError(f"converted stage {directory}: missing {path.name}; "
                                 "rerun `xgr migrate auto` for this stage")
    try:
        payload = json.loads(graph_path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise MigrationError(f"{graph_path} is not valid JSON ({error}); rerun "
                             "`xgr migrate auto` for this stage") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise MigrationError(f"{graph_path}: format {found!r}, expected {FORMAT!r}")
    try:
        stored = load_file(str(tensor_path))
    except Exception as error:  # safetensors raises its own SafetensorError for bad files
        raise MigrationError(f"{tensor_path} cannot be read ({type(error).__name__}: {error}); "
                             "rerun `xgr migrate auto` for this stage") from None
    try:
        return _parse(payload, stored)
    except (KeyError, TypeError, ValueError) as error:
        raise MigrationError(f"{graph_path} does not describe a graph stored beside "
                             f"{tensor_path.name} ({type(error).__name__}: {error}); rerun "
                             "`xgr migrate auto` for this stage") from None


def _parse(payload: dict, stored: dict[str, torch.Tensor]
           ) -> tuple[GraphSpec, dict[str, torch.Tensor]]:
    """The spec and constants of a loaded ``graph.json`` payload and its stored tensors."""
    def attr_value(value: Any) -> Any:
        if isinstance(value, dict) and TENSOR_ATTR in value:
            return stored[value[TENSOR_ATTR]]
        return value

    nodes = tuple(GraphNode(n["name"], n["op_type"], n["domain"], tuple(n["inputs"]),
                            tuple(n["outputs"]), {k: attr_value(v) for k, v in n["attrs"].items()})
                  for n in payload["nodes"])
    info = lambda v: ValueInfo(v["name"], v["dtype"], tuple(v["shape"]))  # noqa: E731
    spec = GraphSpec(dict(payload["opsets"]), tuple(map(info, payload["inputs"])),
                     tuple(map(info, payload["outputs"])), nodes,
                     tuple(payload.get("mask_inputs", ())), tuple(payload.get("mask_outputs", ())))
    return spec, {name: stored[name] for name in payload["constants"]}
