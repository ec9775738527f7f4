"""Automatic conversion of TF stages to Torch: layer -> tf2onnx -> checks -> Torch module.

tf2onnx's Python API continues on errors and copies unsupported TF ops raw into the graph, so a
returned model proves nothing. Every stage passes, in order: a pre-check of the layer type
(known non-converters) and of its tensors (strings and ragged tensors cannot enter Torch);
tf2onnx; raw-op detection, ``onnx.checker`` and an onnxruntime session
(:mod:`bridge.migration.onnx_export`); a converter for every node; and a numeric check of the
Torch module against the TF layer on sample inputs (real batches when given). Each failed check
adds a reason; a stage with any reason stays in TF, and all stages' reasons are reported
together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import keras
import numpy as np
import tensorflow as tf
import torch
from tqdm import tqdm

from bridge import to_torch
from bridge.migration.onnx_export import first_line, to_onnx, validate_onnx
from bridge.migration.stages import StagedModel
from bridge.migration.unconvertible import known_layer_reason
from bridge.onnx_torch.from_onnx import graph_from_onnx
from bridge.onnx_torch.graph import GraphSpec, ValueInfo
from bridge.onnx_torch.module import OnnxGraphModule, unsupported_nodes
from bridge.parity.compare import compare
from xgr_common.errors import ConversionError, MigrationError


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


@dataclass(frozen=True)
class StageSample:
    """One call of a stage on real tensors: its arguments and its TF outputs."""

    name: str
    layer: Any
    args: tuple
    kwargs: dict
    outputs: list

    def leaves(self) -> tuple[list, list[int]]:
        flat = keras.tree.flatten((self.args, self.kwargs))
        return flat, [i for i, x in enumerate(flat) if tf.is_tensor(x)]

    def inputs(self) -> list:
        flat, positions = self.leaves()
        return [flat[i] for i in positions]

    def call_with(self, tensors: list):
        """Call the layer with ``tensors`` in place of the sample's tensor arguments."""
        flat, positions = self.leaves()
        for i, t in zip(positions, tensors):
            flat[i] = t
        args, kwargs = keras.tree.pack_sequence_as((self.args, self.kwargs), flat)
        return self.layer(*args, **kwargs)


def random_sample(staged: StagedModel, name: str, rows: int = 4) -> StageSample:
    """A Functional stage's sample from its symbolic inputs: floats N(0, 1), integers in {0, 1}
    (valid ids for any table), strings empty."""
    node, rng = staged.node(name), np.random.default_rng(0)

    def draw(x):
        if not isinstance(x, keras.KerasTensor):
            return x
        shape, dtype = [rows, *x.shape[1:]], tf.as_dtype(x.dtype)
        if dtype == tf.string:
            return tf.fill(shape, "")
        values = rng.normal(size=shape) if dtype.is_floating else rng.integers(0, 2, size=shape)
        return tf.constant(values, dtype=dtype)
    args, kwargs = keras.tree.map_structure(draw, (node.arguments.args, node.arguments.kwargs))
    layer = staged.layer(name)
    return StageSample(name, layer, args, kwargs, keras.tree.flatten(layer(*args, **kwargs)))


def precheck(sample: StageSample) -> list[str]:
    """Reasons visible before tracing: layer type, string / ragged / sparse tensors."""
    reasons = [r for r in (known_layer_reason(sample.layer),) if r]
    for kind, tensors in (("input", sample.inputs()), ("output", sample.outputs)):
        for i, x in enumerate(tensors):
            if isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
                reasons.append(f"{kind} {i} is a {type(x).__name__}: a Torch stage takes "
                               "dense tensors")
            elif x.dtype == tf.string:
                reasons.append(f"{kind} {i} is a string tensor: strings cannot cross the "
                               "DLPack bridge into Torch")
    if not sample.inputs():
        reasons.append("the stage has no tensor inputs")
    return reasons


def _ordered(spec: GraphSpec, count: int) -> tuple[GraphSpec | None, str]:
    """Graph inputs in the stage's call order (``in_0``, ``in_1``, ...): tf2onnx may reorder
    them. Returns (None, reason) when the graph's inputs are not exactly the stage's tensors
    (a captured TF resource or variable became an input)."""
    expected = [f"in_{i}" for i in range(count)]
    by_name = {v.name.split(":")[0]: v for v in spec.inputs}
    if sorted(by_name) != sorted(expected):
        extra = sorted(set(by_name) - set(expected))
        return None, (f"the ONNX graph's inputs {sorted(by_name)} are not the stage's tensors "
                      f"{expected}: {extra} came from captured TF state (a resource or table)")
    return GraphSpec(spec.opsets, tuple(by_name[n] for n in expected), spec.outputs,
                     spec.nodes), ""


def numeric_reasons(sample: StageSample, module: OnnxGraphModule) -> list[str]:
    """Run the Torch module on the sample's inputs; one reason per output that disagrees."""
    with torch.inference_mode():
        got = module(*[to_torch(x) for x in sample.inputs()])
    got = got if isinstance(got, tuple) else (got,)
    if len(got) != len(sample.outputs):
        return [f"converted graph has {len(got)} outputs, the layer {len(sample.outputs)}"]
    reasons = []
    for i, (g, e) in enumerate(zip(got, sample.outputs)):
        result = compare(sample.name, f"output {i}", g, e)
        if not result.passed:
            reasons.append(f"converted output {i} disagrees with TF ({result.problem}, "
                           f"max abs err {result.max_abs:.3g})")
    return reasons


def convert_sample(sample: StageSample) -> StageConversion:
    """Run every check on one stage; never raises for an unconvertible stage."""
    name = sample.name
    reasons = precheck(sample)
    if reasons:
        return StageConversion(name, tuple(reasons))
    signature = [tf.TensorSpec([None, *x.shape[1:]] if x.shape.rank else [], x.dtype,
                               name=f"in_{i}") for i, x in enumerate(sample.inputs())]
    try:
        onnx_model, reasons = to_onnx(lambda *tensors: sample.call_with(list(tensors)), signature)
    except Exception as error:  # tf2onnx raises assorted exception types while tracing
        return StageConversion(name, (f"tf2onnx failed: {first_line(error)}",))
    reasons = reasons or validate_onnx(onnx_model)
    if reasons:
        return StageConversion(name, tuple(reasons))
    try:
        spec, constants = graph_from_onnx(onnx_model)
    except ConversionError as error:
        return StageConversion(name, (str(error),))
    spec, reason = _ordered(spec, len(signature))
    if spec is None:
        return StageConversion(name, (reason,))
    reasons = unsupported_nodes(spec)
    if reasons:
        return StageConversion(name, tuple(reasons))
    try:
        reasons = numeric_reasons(sample, OnnxGraphModule(spec, constants))
    except Exception as error:  # a twin or converter failing on real data is a reason too
        reasons = [f"the converted graph failed on the sample inputs: {first_line(error)}"]
    if reasons:
        return StageConversion(name, tuple(reasons))
    return StageConversion(name, (), spec, constants)


def convert_stages(model: keras.Model, names: list[str] | None = None,
                   batch: Mapping[str, Any] | None = None,
                   progress: bool = False) -> list[StageConversion]:
    """Convert the named stages (all when None). Samples come from ``batch`` when given (needed
    for subclassed models), else from random inputs shaped like a Functional stage's inputs."""
    staged = StagedModel(model)
    names = list(staged.names) if names is None else list(names)
    unknown = [n for n in names if n not in staged.names]
    if unknown:
        raise ConversionError(f"unknown stages {unknown}; the model's stages are {staged.names}")
    if batch is None and not staged.functional:
        raise MigrationError("converting stages of a subclassed model needs a batch of real "
                             "inputs (xgr migrate auto --data BATCHES)")
    results = []
    for name in tqdm(names, desc="converting stages", unit="stage", disable=not progress):
        if batch is not None:
            sample = StageSample(name, staged.layer(name), *staged.capture(batch, name))
        else:
            sample = random_sample(staged, name)
        results.append(convert_sample(sample))
    return results


def format_reasons(results: list[StageConversion]) -> str:
    """All failed stages with their reasons, one block per stage."""
    lines = []
    for result in results:
        if not result.ok:
            lines.append(f"{result.name}: stays in TF")
            lines.extend(f"    - {reason}" for reason in result.reasons)
    return "\n".join(lines)
