"""Automatic conversion of TF stages to Torch: Keras layer -> tf2onnx -> checks -> Torch module.

tf2onnx's Python API continues on errors and copies unsupported TF ops raw into the graph, so a
returned model proves nothing. Every stage therefore passes, in order: a pre-check of its
tensors (strings and ragged tensors cannot enter Torch) and of layer types known not to
convert; tf2onnx; raw-op detection; ``onnx.checker``; an onnxruntime session; a converter for
every node; and a numeric check of the Torch module against the TF layer on sample inputs.
Each failed check adds a reason; a stage with any reason stays in TF, and all stages' reasons
are reported together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import keras
import numpy as np
import onnx
import tensorflow as tf
import torch

from bridge.migration.model_graph import StageCall, run_stages, stage_calls
from bridge.migration.unconvertible import known_layer_reason, known_op_reason
from bridge.onnx_torch.from_onnx import graph_from_onnx
from bridge.onnx_torch.graph import GraphSpec, ValueInfo
from bridge.onnx_torch.module import OnnxGraphModule, unsupported_nodes
from bridge.onnx_torch.registry import CUSTOM_DOMAIN
from bridge.parity.compare import compare
from torch_engine.errors import ConversionError

OPSET = 17


@dataclass(frozen=True)
class StageConversion:
    """The outcome for one stage: a converted graph, or the reasons it stays in TF."""

    name: str
    reasons: tuple[str, ...] = ()
    spec: GraphSpec | None = None
    constants: Mapping[str, torch.Tensor] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.reasons


def _tensor_leaves(call: StageCall) -> tuple[Any, list[int], list]:
    template = (call.node.arguments.args, call.node.arguments.kwargs)
    leaves = keras.tree.flatten(template)
    positions = [i for i, x in enumerate(leaves) if isinstance(x, keras.KerasTensor)]
    return template, positions, leaves


def precheck(call: StageCall) -> list[str]:
    """Reasons visible before tracing: layer type, string / ragged / sparse tensors."""
    reasons = [r for r in (known_layer_reason(call.layer),) if r]
    _, positions, leaves = _tensor_leaves(call)
    for kind, tensors in (("input", [leaves[i] for i in positions]), ("output", call.node.outputs)):
        for i, x in enumerate(tensors):
            if x.dtype == "string":
                reasons.append(f"{kind} {i} is a string tensor: strings cannot cross the "
                               "DLPack bridge into Torch")
            if getattr(x, "ragged", False) or getattr(x, "sparse", False):
                reasons.append(f"{kind} {i} is ragged/sparse: a Torch stage takes dense tensors")
    if not positions:
        reasons.append("the stage has no tensor inputs")
    return reasons


def to_onnx(call: StageCall) -> onnx.ModelProto:
    """Trace the stage's layer alone with tf2onnx (``from_function``, opset 17)."""
    import tf2onnx

    template, positions, leaves = _tensor_leaves(call)
    signature = [tf.TensorSpec([None, *leaves[i].shape[1:]], leaves[i].dtype, name=f"in_{n}")
                 for n, i in enumerate(positions)]

    def layer_call(*tensors):
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        args, kwargs = keras.tree.pack_sequence_as(template, filled)
        return call.layer(*args, **kwargs)

    logging.getLogger("tf2onnx").setLevel(logging.ERROR)
    model, _ = tf2onnx.convert.from_function(tf.function(layer_call), input_signature=signature,
                                             opset=OPSET)
    return model


def validate_onnx(model: onnx.ModelProto) -> list[str]:
    """Reasons the ONNX graph is not a faithful standard graph (raw TF ops, checker, runtime)."""
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


def _ordered(spec: GraphSpec) -> GraphSpec:
    """Graph inputs in the stage's call order (``in_0``, ``in_1``, ...): tf2onnx may reorder."""
    def index(v: ValueInfo) -> int:
        return int(v.name.split(":")[0].rsplit("_", 1)[1])
    return GraphSpec(spec.opsets, tuple(sorted(spec.inputs, key=index)), spec.outputs, spec.nodes)


def sample_inputs(call: StageCall, model: keras.Model, batch: Mapping[str, Any] | None,
                  rows: int = 4) -> list[tf.Tensor]:
    """The stage's flat input tensors: captured from ``batch`` when given, else random (floats
    N(0, 1); integers in {0, 1} so any id table accepts them)."""
    _, positions, leaves = _tensor_leaves(call)
    if batch is not None:
        captured: list = []

        def capture(args, kwargs):
            captured.extend(x for x in keras.tree.flatten((args, kwargs)) if tf.is_tensor(x))
            return keras.tree.flatten(call.layer(*args, **kwargs))
        run_stages(model, batch, {call.name: capture})
        return captured
    rng = np.random.default_rng(0)
    out = []
    for i in positions:
        shape = [rows, *leaves[i].shape[1:]]
        dtype = tf.as_dtype(leaves[i].dtype)
        values = rng.normal(size=shape) if dtype.is_floating else rng.integers(0, 2, size=shape)
        out.append(tf.constant(values, dtype=dtype))
    return out


def numeric_reasons(call: StageCall, module: OnnxGraphModule, inputs: list) -> list[str]:
    """Run the Torch module and the TF layer on ``inputs``; one reason per disagreeing output."""
    expected = [call.layer(*a, **k) for a, k in [_fill(call, inputs)]][0]
    expected = keras.tree.flatten(expected)
    with torch.inference_mode():
        got = module(*[torch.from_numpy(np.array(x.numpy())) for x in inputs])
    got = got if isinstance(got, tuple) else (got,)
    reasons = []
    for i, (g, e) in enumerate(zip(got, expected)):
        result = compare(call.name, f"output {i}", g, e)
        if not result.passed:
            reasons.append(f"converted output {i} disagrees with TF ({result.problem}, "
                           f"max abs err {result.max_abs:.3g})")
    if len(got) != len(expected):
        reasons.append(f"converted graph has {len(got)} outputs, the layer {len(expected)}")
    return reasons


def _fill(call: StageCall, tensors: list) -> tuple[tuple, dict]:
    template, positions, leaves = _tensor_leaves(call)
    filled = list(leaves)
    for i, t in zip(positions, tensors):
        filled[i] = t
    return keras.tree.pack_sequence_as(template, filled)


def convert_stage(call: StageCall, model: keras.Model,
                  batch: Mapping[str, Any] | None = None) -> StageConversion:
    """Run every check on one stage; never raises for an unconvertible stage."""
    reasons = precheck(call)
    if reasons:
        return StageConversion(call.name, tuple(reasons))
    try:
        onnx_model = to_onnx(call)
    except Exception as error:  # tf2onnx raises assorted exception types while tracing
        return StageConversion(call.name, (f"tf2onnx failed: {type(error).__name__}: "
                                           f"{str(error).splitlines()[0] if str(error) else ''}",))
    reasons = validate_onnx(onnx_model)
    if reasons:
        return StageConversion(call.name, tuple(reasons))
    try:
        spec, constants = graph_from_onnx(onnx_model)
    except ConversionError as error:
        return StageConversion(call.name, (str(error),))
    spec = _ordered(spec)
    reasons = unsupported_nodes(spec)
    if reasons:
        return StageConversion(call.name, tuple(reasons))
    module = OnnxGraphModule(spec, constants)
    reasons = numeric_reasons(call, module, sample_inputs(call, model, batch))
    return StageConversion(call.name, tuple(reasons), spec if not reasons else None,
                           constants if not reasons else {})


def convert_stages(model: keras.Model, names: list[str] | None = None,
                   batch: Mapping[str, Any] | None = None) -> list[StageConversion]:
    """Convert the named stages (all stages when None); unknown names raise together."""
    calls = {c.name: c for c in stage_calls(model)}
    names = list(calls) if names is None else names
    unknown = [n for n in names if n not in calls]
    if unknown:
        raise ConversionError(f"unknown stages {unknown}; the model's stages are {list(calls)}")
    return [convert_stage(calls[n], model, batch) for n in names]


def format_reasons(results: list[StageConversion]) -> str:
    """All failed stages with their reasons, one block per stage."""
    lines = []
    for result in results:
        if not result.ok:
            lines.append(f"{result.name}: stays in TF")
            lines.extend(f"    - {reason}" for reason in result.reasons)
    return "\n".join(lines)
