"""Find the converter of a node: the ONNX registry, or a custom op's Torch twin.

Nodes in the ``xgr.custom`` domain are the project's C++ TF ops as tf2onnx emitted them through
the ``custom_ops`` registry; their converter calls that op's Torch twin.
"""

from __future__ import annotations

from bridge.onnx_torch.registry import CUSTOM_DOMAIN, REGISTRY, Converter, GraphNode
# Imported for their side effect: each module registers its converters.
from bridge.onnx_torch import ops_index, ops_math, ops_nn, ops_shape  # noqa: F401


def custom_twin_converter(op_type: str) -> Converter | None:
    """A converter calling the Torch twin of custom op ``op_type``, or None when it has none."""
    from custom_ops.registry import torch_twin_for_onnx  # lazy: the registry loads op libraries

    twin = torch_twin_for_onnx(op_type)
    if twin is None:
        return None

    def call(node: GraphNode, *inputs):
        return twin(*inputs, **dict(node.attrs))

    return Converter(CUSTOM_DOMAIN, op_type, 1, call, f"Torch twin of custom op {op_type}")


def resolve(node: GraphNode, opset: int) -> tuple[Converter | None, str]:
    """``(converter, "")`` or ``(None, reason)`` for ``node`` in a graph of ``opset``."""
    if node.domain == CUSTOM_DOMAIN:
        found = custom_twin_converter(node.op_type)
        reason = "" if found else f"custom op {node.op_type} has no Torch twin in custom_ops"
        return found, reason
    found = REGISTRY.lookup(node.domain, node.op_type, opset)
    return found, "" if found else REGISTRY.why_missing(node.domain, node.op_type, opset)
