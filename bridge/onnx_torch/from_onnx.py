"""Read an ``onnx.ModelProto`` into the interpreter's :class:`GraphSpec` and constants."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from bridge.onnx_torch.graph import GraphSpec, ValueInfo
from bridge.onnx_torch.registry import GraphNode
from xgr_common.errors import ConversionError


def _tensor(proto: onnx.TensorProto, where: str) -> torch.Tensor:
    array = numpy_helper.to_array(proto)
    if array.dtype.kind in "OSU":
        raise ConversionError(f"{where}: string tensor {proto.name!r} cannot live in Torch")
    return torch.from_numpy(np.array(array, copy=True, order="C"))  # keeps 0-d shapes


def _value_info(value: onnx.ValueInfoProto) -> ValueInfo:
    tensor_type = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name \
        if tensor_type.elem_type else "unknown"
    shape = tuple(d.dim_value if d.HasField("dim_value") else None
                  for d in tensor_type.shape.dim)
    return ValueInfo(value.name, dtype, shape)


def _attribute(attr: onnx.AttributeProto, where: str):
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return _tensor(value, where)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        if value and isinstance(value[0], (onnx.TensorProto, onnx.GraphProto)):
            raise ConversionError(f"{where}: list-of-tensor/graph attribute {attr.name!r}")
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    if isinstance(value, onnx.GraphProto):
        raise ConversionError(f"{where}: control-flow subgraph attribute {attr.name!r} "
                              "(If/Loop/Scan) is not interpreted")
    return value


def graph_from_onnx(model: onnx.ModelProto) -> tuple[GraphSpec, dict[str, torch.Tensor]]:
    """Split ``model`` into a node list and its initializers as torch tensors."""
    graph = model.graph
    constants = {init.name: _tensor(init, "initializer") for init in graph.initializer}
    nodes = tuple(
        GraphNode(name=node.name or f"node_{i}", op_type=node.op_type, domain=node.domain,
                  inputs=tuple(node.input), outputs=tuple(node.output),
                  attrs={a.name: _attribute(a, f"node {node.name!r} ({node.op_type})")
                         for a in node.attribute})
        for i, node in enumerate(graph.node))
    initializer_names = set(constants)
    opsets = {(o.domain or ""): o.version for o in model.opset_import}
    return GraphSpec(opsets=opsets,
                     inputs=tuple(_value_info(v) for v in graph.input
                                  if v.name not in initializer_names),
                     outputs=tuple(_value_info(v) for v in graph.output),
                     nodes=nodes), constants
