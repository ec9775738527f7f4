"""Converters for ONNX neural-network ops that are more than one torch call."""

from __future__ import annotations

import torch

from bridge.onnx_torch.registry import GraphNode, converter


@converter("LayerNormalization", since_version=17)
def layer_normalization(node: GraphNode, x: torch.Tensor, scale: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Normalise over axes ``axis..rank-1`` with ``epsilon``; the extra outputs are not given."""
    axis = node.attr("axis", -1) % x.dim()
    shape = x.shape[axis:]
    return torch.nn.functional.layer_norm(x, shape, scale.expand(shape),
                                          None if bias is None else bias.expand(shape),
                                          eps=node.attr("epsilon", 1e-5))
