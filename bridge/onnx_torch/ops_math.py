"""Converters for ONNX element-wise and matrix ops (ai.onnx domain).

ONNX broadcasting is numpy broadcasting, which torch follows, so binary ops map one to one.
"""

from __future__ import annotations

import torch

from bridge.onnx_torch.registry import GraphNode, converter


def _binary(op_type: str, fn) -> None:
    converter(op_type, summary=f"torch.{fn.__name__}, numpy broadcasting")(
        lambda node, a, b: fn(a, b))


_binary("Add", torch.add)
_binary("Sub", torch.sub)
_binary("Mul", torch.mul)
_binary("Max", torch.maximum)
_binary("Min", torch.minimum)
_binary("Equal", torch.eq)
_binary("Less", torch.lt)
_binary("Greater", torch.gt)
_binary("And", torch.logical_and)
_binary("Or", torch.logical_or)


@converter("Div")
def div(node: GraphNode, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.div; integer inputs truncate toward zero as ONNX requires."""
    if a.is_floating_point():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


@converter("Pow")
def pow_(node: GraphNode, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.pow, result in the base's dtype (ONNX: output type = base type)."""
    return torch.pow(a, b.to(a.dtype) if a.is_floating_point() else b).to(a.dtype)


def _unary(op_type: str, fn) -> None:
    converter(op_type, summary=f"torch.{fn.__name__}")(lambda node, x: fn(x))


_unary("Neg", torch.neg)
_unary("Abs", torch.abs)
_unary("Sqrt", torch.sqrt)
_unary("Reciprocal", torch.reciprocal)
_unary("Exp", torch.exp)
_unary("Log", torch.log)
_unary("Erf", torch.erf)
_unary("Relu", torch.relu)
_unary("Sigmoid", torch.sigmoid)
_unary("Tanh", torch.tanh)
_unary("Not", torch.logical_not)
_unary("Floor", torch.floor)


@converter("LeakyRelu", since_version=6)
def leaky_relu(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """torch.nn.functional.leaky_relu with the node's alpha (default 0.01)."""
    return torch.nn.functional.leaky_relu(x, node.attr("alpha", 0.01))


@converter("Clip", since_version=11)
def clip(node: GraphNode, x: torch.Tensor, low: torch.Tensor | None = None,
         high: torch.Tensor | None = None) -> torch.Tensor:
    """torch.clamp with optional min/max inputs."""
    return torch.clamp(x, low, high)


@converter("Where", since_version=9)
def where(node: GraphNode, cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.where."""
    return torch.where(cond, a, b)


@converter("MatMul")
def matmul(node: GraphNode, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul (numpy matmul semantics, batched)."""
    return torch.matmul(a, b)


@converter("Gemm", since_version=11)
def gemm(node: GraphNode, a: torch.Tensor, b: torch.Tensor,
         c: torch.Tensor | None = None) -> torch.Tensor:
    """alpha * A' @ B' + beta * C, with A' / B' transposed per transA / transB."""
    if node.attr("transA", 0):
        a = a.transpose(0, 1)
    if node.attr("transB", 0):
        b = b.transpose(0, 1)
    out = node.attr("alpha", 1.0) * torch.matmul(a, b)
    if c is not None:
        out = out + node.attr("beta", 1.0) * c
    return out


def _softmax_legacy(fn):
    """Opset < 13: the input is coerced to 2-D at ``axis`` and normalised over the tail."""
    def run(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
        axis = node.attr("axis", 1) % max(x.dim(), 1)
        flat = x.reshape(int(torch.tensor(x.shape[:axis]).prod()), -1)
        return fn(flat, dim=1).reshape(x.shape)
    return run


converter("Softmax", since_version=1, summary="torch.softmax over the flattened tail")(
    _softmax_legacy(torch.softmax))
converter("LogSoftmax", since_version=1, summary="torch.log_softmax over the flattened tail")(
    _softmax_legacy(torch.log_softmax))


@converter("Softmax", since_version=13)
def softmax(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """torch.softmax over one axis (default -1)."""
    return torch.softmax(x, dim=node.attr("axis", -1))


@converter("LogSoftmax", since_version=13)
def log_softmax(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """torch.log_softmax over one axis (default -1)."""
    return torch.log_softmax(x, dim=node.attr("axis", -1))
