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

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np
import tensorflow as tf
import torch
from tqdm import tqdm

from bridge import to_torch
from bridge.migration.keras_flavours import is_keras_tensor, keras_mask, set_keras_mask
from bridge.migration.onnx_export import full_message, to_onnx, validate_onnx
from bridge.migration.stages import StagedModel
from bridge.migration.unconvertible import known_layer_reason
from bridge.onnx_torch.from_onnx import graph_from_onnx
from bridge.onnx_torch.graph import GraphSpec, ValueInfo
from bridge.onnx_torch.module import OnnxGraphModule, unsupported_nodes
from bridge.parity.compare import compare
from xgr_common.errors import ConversionError, InvalidInputError, MigrationError, XgrError


@dataclass(frozen=True)
class StageConversion:
    """The outcome for one stage: a converted graph, or the reasons it stays in TF."""

    name: str
    reasons: tuple[str, ...] = ()
    spec: GraphSpec | None = None
    constants: Mapping[str, torch.Tensor] = field(default_factory=dict)
    notes: tuple[str, ...] = ()     # what a user should know about a converted stage

    @property
    def ok(self) -> bool:
        return not self.reasons

    def notes_text(self) -> str:
        return "".join(f"\n    note: {note}" for note in self.notes)


@dataclass(frozen=True)
class StageSample:
    """One call of a stage on real tensors: its arguments and its TF outputs."""

    name: str
    layer: Any
    args: tuple
    kwargs: dict
    outputs: list

    def leaves(self) -> tuple[list, list[int]]:
        flat = tf.nest.flatten((self.args, self.kwargs))
        return flat, [i for i, x in enumerate(flat) if tf.is_tensor(x)]

    def inputs(self) -> list:
        flat, positions = self.leaves()
        return [flat[i] for i in positions]

    def call_with(self, tensors: list):
        """Call the layer with ``tensors`` in place of the sample's tensor arguments."""
        flat, positions = self.leaves()
        for i, t in zip(positions, tensors):
            flat[i] = t
        args, kwargs = tf.nest.pack_sequence_as((self.args, self.kwargs), flat)
        return self.layer(*args, **kwargs)

    def mask_inputs(self) -> list[int]:
        """Positions of the tensor inputs that carry a Keras mask."""
        return [i for i, x in enumerate(self.inputs()) if keras_mask(x) is not None]

    def mask_outputs(self) -> list[int]:
        """Positions of the outputs the layer gave a Keras mask."""
        return [i for i, x in enumerate(self.outputs) if keras_mask(x) is not None]

    def graph_inputs(self) -> list:
        """What the converted graph takes: the tensor inputs, then their masks."""
        inputs = self.inputs()
        return inputs + [keras_mask(inputs[i]) for i in self.mask_inputs()]

    def graph_outputs(self) -> list:
        """What the converted graph returns: the outputs, then their masks."""
        return list(self.outputs) + [keras_mask(self.outputs[i]) for i in self.mask_outputs()]

    def traced(self):
        """The function tf2onnx traces: graph inputs -> graph outputs. Masks are attached to
        their tensors as Keras attaches them, so the layer masks as it does in the model."""
        count, mask_inputs, mask_outputs = len(self.inputs()), self.mask_inputs(), \
            self.mask_outputs()

        def fn(*tensors):
            data = list(tensors[:count])
            for position, mask in zip(mask_inputs, tensors[count:]):
                set_keras_mask(data[position], mask)
            flat = tf.nest.flatten(self.call_with(data))
            masks = [keras_mask(flat[i]) for i in mask_outputs]
            if any(m is None for m in masks):
                raise MigrationError("the traced layer gives no Keras mask where the eager "
                                     f"layer does (outputs {mask_outputs})")
            return flat + masks
        return fn


def random_sample(staged: StagedModel, name: str, rows: int = 4, free: int = 3,
                  seed: int = 0) -> StageSample:
    """A Functional stage's sample from its symbolic inputs: floats N(0, 1), integers in {0, 1}
    (valid ids for any table), strings empty; ``rows`` rows and ``free`` positions along every
    other dimension the model leaves open (a sequence length)."""
    call, rng = staged.call(name), np.random.default_rng(seed)

    def draw(x):
        if not is_keras_tensor(x):
            return x
        dims = list(x.shape)[1:]
        shape = [rows, *(free if d is None else int(d) for d in dims)]
        dtype = tf.as_dtype(x.dtype)
        if dtype == tf.string:
            return tf.fill(shape, "")
        values = rng.normal(size=shape) if dtype.is_floating else rng.integers(0, 2, size=shape)
        tensor = tf.constant(values, dtype=dtype)
        symbolic_mask = keras_mask(x)
        if symbolic_mask is not None:   # e.g. after Embedding(mask_zero=True)
            mask = rng.random(shape[:len(symbolic_mask.shape)]) < 0.7
            mask[..., 0] = True         # every row keeps a position, as real padding does
            set_keras_mask(tensor, tf.constant(mask))
        return tensor
    args, kwargs = tf.nest.map_structure(draw, (call.args, call.kwargs))
    layer = staged.layer(name)
    return StageSample(name, layer, args, kwargs, tf.nest.flatten(layer(*args, **kwargs)))


def open_dims(staged: StagedModel, name: str, sample: StageSample) -> list[tuple[bool, ...]]:
    """Per stage input, which dimensions stay dynamic in the converted graph: the batch and
    every dimension the Functional model leaves open (``None``); all of them for a subclassed
    model, whose layers have no symbolic shapes."""
    tensors = sample.inputs()
    if not staged.functional:
        return [(True,) * x.shape.rank for x in tensors]
    symbolic = staged.call(name).inputs
    dims = []
    for x, ref in zip(tensors, symbolic):
        shape = list(ref.shape)
        dims.append(tuple(i == 0 or shape[i] is None for i in range(len(shape))))
    return dims


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
    """Run the Torch module on the sample's inputs (and masks); one reason per output (or
    output mask) that disagrees."""
    with torch.inference_mode():
        got = module(*[to_torch(x) for x in sample.graph_inputs()])
    got = got if isinstance(got, tuple) else (got,)
    expected = sample.graph_outputs()
    if len(got) != len(expected):
        return [f"converted graph has {len(got)} outputs, the layer {len(expected)} "
                "(outputs and their Keras masks)"]
    labels = [f"output {i}" for i in range(len(sample.outputs))]
    labels += [f"the Keras mask of output {i}" for i in sample.mask_outputs()]
    reasons = []
    for label, g, e in zip(labels, got, expected):
        result = compare(sample.name, label, g, e)
        if not result.passed:
            reasons.append(f"converted {label} disagrees with TF ({result.problem}, "
                           f"max abs err {result.max_abs:.3g})")
    return reasons


def _signature(sample: StageSample, dynamic: list[tuple[bool, ...]]) -> list[tf.TensorSpec]:
    """Specs of the graph inputs: each mask takes the open dimensions of its tensor."""
    inputs = sample.inputs()
    dims = list(dynamic) + [dynamic[i] for i in sample.mask_inputs()]
    return [tf.TensorSpec([None if open_ else int(d) for d, open_ in zip(x.shape, flags)],
                          x.dtype, name=f"in_{i}")
            for i, (x, flags) in enumerate(zip(sample.graph_inputs(), dims))]


def _convert_traced(sample: StageSample, signature: list[tf.TensorSpec],
                    checks: list[StageSample]) -> StageConversion:
    """tf2onnx at ``signature``, then every check; numeric checks on each of ``checks``."""
    name = sample.name
    try:
        onnx_model, reasons = to_onnx(sample.traced(), signature)
    except Exception as error:  # tf2onnx raises assorted exception types while tracing
        return StageConversion(name, (f"tf2onnx failed: {full_message(error)}",))
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
    spec = replace(spec, mask_inputs=tuple(sample.mask_inputs()),
                   mask_outputs=tuple(sample.mask_outputs()))
    reasons = group_missing_ops(unsupported_nodes(spec))
    if reasons:
        return StageConversion(name, tuple(reasons))
    module = OnnxGraphModule(spec, constants)
    for check in checks:
        shapes = ", ".join(str(list(x.shape)) for x in check.inputs())
        try:
            reasons = numeric_reasons(check, module)
        except Exception as error:  # a twin or converter failing on real data is a reason too
            reasons = [f"the converted graph failed on sample inputs of shapes {shapes}: "
                       f"{full_message(error)}"]
        if reasons:
            return StageConversion(name, tuple(reasons))
    return StageConversion(name, (), spec, constants)


def fixed_dims_note(sample: StageSample, dynamic: list[tuple[bool, ...]]) -> str:
    """Which dimensions a conversion at the sample's shapes fixes (dynamic in ``dynamic``)."""
    fixed = [f"input {i} dim {d} = {int(x.shape[d])}"
             for i, (x, dims) in enumerate(zip(sample.inputs(), dynamic))
             for d in range(1, len(dims)) if dims[d]]
    return ("converted with fixed dimensions (" + ", ".join(fixed) + "): it accepts only "
            "inputs of these sizes, other sizes are refused naming the stage") if fixed else ""


def convert_sample(sample: StageSample, dynamic: list[tuple[bool, ...]] | None = None,
                   extra_checks: tuple[StageSample, ...] = ()) -> StageConversion:
    """Run every check on one stage; never raises for an unconvertible stage. ``dynamic``:
    per input, the dimensions to keep dynamic (default: the batch only). A stage that does not
    convert with them converts at the sample's sizes instead, and its notes say which
    dimensions that fixed."""
    name = sample.name
    reasons = precheck(sample)
    if reasons:
        return StageConversion(name, tuple(reasons))
    batch_only = [tuple(d == 0 for d in range(x.shape.rank)) for x in sample.inputs()]
    dynamic = dynamic or batch_only
    result = _convert_traced(sample, _signature(sample, dynamic), [sample, *extra_checks])
    if result.ok or dynamic == batch_only:
        return result
    fixed = _convert_traced(sample, _signature(sample, batch_only), [sample])
    if not fixed.ok:
        return result
    return StageConversion(name, (), fixed.spec, fixed.constants,
                           (fixed_dims_note(sample, dynamic),
                            "with dynamic sizes: " + "; ".join(result.reasons)))


def stage_sample(staged: StagedModel, name: str, batch: Mapping[str, Any] | None
                 ) -> tuple[StageSample, tuple[StageSample, ...]]:
    """The sample a stage converts on and further samples it must agree on: the stage's real
    inputs from ``batch``, else two random samples of different sizes (the second checks that
    open dimensions stayed open)."""
    if batch is not None:
        return StageSample(name, staged.layer(name), *staged.capture(batch, name)), ()
    return random_sample(staged, name), (random_sample(staged, name, rows=3, free=5, seed=1),)


def convert_stages(model: Any, names: list[str] | None = None,
                   batch: Mapping[str, Any] | None = None,
                   progress: bool = False) -> list[StageConversion]:
    """Convert the named stages (all when None). Samples come from ``batch`` when given (needed
    for subclassed models), else from random inputs shaped like a Functional stage's inputs.
    A stage that cannot be sampled gets its reason; the other stages still convert."""
    staged = StagedModel(model)
    names = list(staged.names) if names is None else list(names)
    unknown = [n for n in names if n not in staged.names]
    if unknown:
        raise ConversionError(f"unknown stages {unknown}; the model's stages are {staged.names}")
    if batch is None and not staged.functional:
        raise MigrationError("converting stages of a subclassed model needs a batch of real "
                             "inputs (xgr migrate auto --data BATCHES)")
    if batch is not None:
        check_batch(staged, batch)
    results = []
    for name in tqdm(names, desc="converting stages", unit="stage", disable=not progress):
        try:
            sample, checks = stage_sample(staged, name, batch)
        except Exception as error:  # a layer failing on random inputs, or not run by the batch
            hint = "" if batch is not None else \
                " (random inputs; pass real ones with --data BATCHES)"
            results.append(StageConversion(name, (f"cannot sample the stage's inputs{hint}: "
                                                  f"{full_message(error)}",)))
            continue
        results.append(convert_sample(sample, open_dims(staged, name, sample), checks))
    return results


def check_batch(staged: StagedModel, batch: Mapping[str, Any]) -> None:
    """Raise InvalidInputError when ``batch`` does not run through the all-TF model."""
    try:
        staged.run(batch)
    except XgrError:
        raise
    except Exception as error:  # TF's own errors for wrong dtypes or shapes
        raise InvalidInputError(f"the data batch does not run through the TF model: "
                                f"{full_message(error)}") from None


def group_missing_ops(reasons: list[str]) -> list[str]:
    """One line per missing op with its node count, instead of one line per node."""
    counts: dict[str, int] = {}
    for reason in reasons:
        _, _, why = reason.partition(": ")
        counts[why or reason] = counts.get(why or reason, 0) + 1
    return [f"{why} ({count} node{'s' if count > 1 else ''})" for why, count in counts.items()]


def format_reasons(results: list[StageConversion]) -> str:
    """All failed stages with their reasons, one block per stage (long messages indented)."""
    lines = []
    for result in results:
        if not result.ok:
            lines.append(f"{result.name}: stays in TF")
            for reason in result.reasons:
                first, *rest = reason.splitlines() or [""]
                lines.append(f"    - {first}")
                lines.extend(f"      {line}" for line in rest)
    return "\n".join(lines)
