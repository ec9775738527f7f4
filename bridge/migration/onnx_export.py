"""One stage to ONNX with tf2onnx, and the checks that decide whether to believe the result.

The project's custom TF ops (``custom_ops.registry``) leave tf2onnx as nodes of domain
``xgr.custom`` with the registry's attributes; the interpreter runs them as Torch twins.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import onnx
import tensorflow as tf

from bridge.migration.unconvertible import known_op_reason
from bridge.onnx_torch.registry import CUSTOM_DOMAIN

OPSET = 17


def _custom_handlers(failures: list[str]) -> dict[str, tuple[Callable, list]]:
    """tf2onnx ``custom_op_handlers`` for every registered custom op that has an ONNX node.
    A node that cannot take the registry's form appends its reason to ``failures``."""
    from custom_ops.registry import OPS

    def as_custom_node(ctx, node, name, args):
        # tf2onnx has already renamed the node to the registry's ONNX op type.
        (entry,) = args
        if len(node.input) != len(entry.onnx.inputs):
            # e.g. the semantic-ID lookup reads a TF table resource; its ONNX node wants the
            # catalog arrays as inputs, which a trace of the stage cannot supply.
            failures.append(f"custom op {entry.tf_op} takes {len(node.input)} inputs in TF but "
                            f"its ONNX node takes {list(entry.onnx.inputs)}: a TF resource "
                            "input (a table) cannot be carried into the graph")
            raise ValueError(failures[-1])
        node.domain = CUSTOM_DOMAIN
        for key in list(node.attr):
            if key not in entry.onnx.attributes:
                del node.attr[key]   # TF bookkeeping attrs (T, _class, ...) are not part of the node
        return node

    return {op.tf_op: (as_custom_node, [op.onnx.op_type, op])
            for op in OPS if op.onnx is not None}


def to_onnx(fn: Callable, signature: Sequence[tf.TensorSpec]) -> tuple[onnx.ModelProto, list[str]]:
    """Trace ``fn`` (flat tensors -> the layer's outputs) with tf2onnx at opset 17; returns the
    model and the reasons custom ops could not be mapped."""
    import tf2onnx

    logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)
    failures: list[str] = []
    model, _ = tf2onnx.convert.from_function(
        tf.function(fn), input_signature=list(signature), opset=OPSET,
        custom_op_handlers=_custom_handlers(failures),
        extra_opset=[onnx.helper.make_opsetid(CUSTOM_DOMAIN, 1)])
    return model, failures


def validate_onnx(model: onnx.ModelProto) -> list[str]:
    """Reasons the graph is not a faithful standard graph: TF ops copied raw, extension-only
    ops, ``onnx.checker`` errors, an onnxruntime that cannot load it. Empty when it passes."""
    reasons = []
    for node in model.graph.node:
        domain = node.domain or ""
        if domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            reasons.append(f"TF op {node.op_type} has no ONNX mapping (tf2onnx copied it raw)"
                           + known_op_reason(node.op_type))
        elif domain not in ("", "ai.onnx", CUSTOM_DOMAIN):
            reasons.append(f"op {domain}::{node.op_type} needs an onnxruntime extension"
                           + known_op_reason(node.op_type))
    if reasons:
        return sorted(set(reasons))
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        return [f"onnx.checker rejected the graph: {str(error).splitlines()[0]}"]
    if any(n.domain == CUSTOM_DOMAIN for n in model.graph.node):
        return []   # custom nodes run only as Torch twins; the numeric check covers them
    import onnxruntime

    try:
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own unrelated exception classes
        return [f"onnxruntime cannot load the graph: {str(error).splitlines()[0]}"]
    return []


def first_line(error: Any) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def full_message(error: Any) -> str:
    """The exception's type and whole message: tf2onnx and TF put the cause after a first
    line such as "in user code:"."""
    return f"{type(error).__name__}: {str(error).strip()}"
