"""``OnnxGraphModule``: an ``nn.Module`` that interprets a converted ONNX graph in Torch.

Weights (floating-point initializers) become parameters, so a converted stage can be trained
on in Torch; other constants become buffers. Nodes whose inputs are all non-trainable
constants (shape arithmetic, ``Constant`` nodes) are evaluated once when the module is built;
shape arithmetic on runtime shapes runs on Python ints (:mod:`bridge.onnx_torch.shape_values`),
so the module exports through ``torch.export`` with dynamic sizes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bridge.onnx_torch.graph import GraphSpec, load_graph
from bridge.onnx_torch.registry import Converter, GraphNode
from bridge.onnx_torch.resolve import resolve
from bridge.onnx_torch.shape_values import ShapeValue, as_shape_value, converter_input, evaluate
from xgr_common.errors import ConversionError, InvalidInputError


def unsupported_nodes(spec: GraphSpec) -> list[str]:
    """One reason per node that has no converter; empty when the graph converts whole."""
    reasons = []
    for node in spec.nodes:
        found, reason = resolve(node, spec.opset(node.domain))
        if found is None:
            reasons.append(f"node {node.name!r}: {reason}")
    return reasons


class OnnxGraphModule(nn.Module):
    """Runs ``spec`` node by node. ``forward(*inputs)`` takes the graph inputs in order
    (tensors of the dtypes in ``spec.inputs``) and returns one tensor or a tuple."""

    def __init__(self, spec: GraphSpec, constants: dict[str, torch.Tensor]):
        super().__init__()
        missing = unsupported_nodes(spec)
        if missing:
            raise ConversionError("graph has ops without a Torch converter:\n  "
                                  + "\n  ".join(missing))
        self.spec = spec
        self._slots: dict[str, str] = {}   # graph value name -> attribute name on self
        self._static: dict[str, ShapeValue] = {}   # small integer constants as Python values
        trainable = set()
        for name, value in constants.items():
            if value.is_floating_point() and value.dim() > 0:
                self._add(name, nn.Parameter(value.clone()))
                trainable.add(name)
            else:
                self._add(name, value.clone())
        self._steps: list[tuple[GraphNode, Converter]] = []
        for node in spec.nodes:
            converter, _ = resolve(node, spec.opset(node.domain))
            foldable = all(not i or (i in self._slots and i not in trainable) for i in node.inputs)
            if foldable:
                with torch.no_grad():
                    args = [getattr(self, self._slots[i]) if i else None for i in node.inputs]
                    self._store_outputs(node, converter.fn(node, *args), fold=True)
            else:
                self._steps.append((node, converter))

    @classmethod
    def load(cls, directory: Path) -> "OnnxGraphModule":
        """Build the module from a stored ``graph.json`` + ``tensors.safetensors``."""
        return cls(*load_graph(directory))

    def _add(self, name: str, value: torch.Tensor) -> None:
        slot = f"c{len(self._slots)}"
        if isinstance(value, nn.Parameter):
            self.register_parameter(slot, value)
        else:
            self.register_buffer(slot, value)
            static = as_shape_value(value)
            if static is not None:
                self._static[name] = static
        self._slots[name] = slot

    def _value(self, name: str):
        """A constant: small integer ones as Python values (``torch.export`` must see shape
        parameters), the others as the registered parameter or buffer."""
        if name in self._static:
            return self._static[name]
        return getattr(self, self._slots[name])

    def _store_outputs(self, node: GraphNode, result, fold: bool, env=None) -> None:
        results = result if isinstance(result, (tuple, list)) else (result,)
        for out_name, value in zip(node.outputs, results):
            if not out_name:
                continue
            if fold:
                self._add(out_name, value)
            else:
                env[out_name] = value

    def forward(self, *inputs: torch.Tensor):
        if len(inputs) != len(self.spec.inputs):
            raise InvalidInputError(f"converted graph takes {len(self.spec.inputs)} inputs "
                                    f"{[v.name for v in self.spec.inputs]}, got {len(inputs)}")
        env: dict[str, torch.Tensor] = {}
        for info, value in zip(self.spec.inputs, inputs):
            if len(info.shape) != value.dim():
                raise InvalidInputError(f"input {info.name!r}: expected rank {len(info.shape)} "
                                        f"{info.shape}, got shape {tuple(value.shape)}")
            fixed = [(d, size) for d, size in enumerate(info.shape)
                     if size is not None and value.shape[d] != size]
            if fixed:
                raise InvalidInputError(
                    f"input {info.name!r}: shape {tuple(value.shape)}, but the graph was "
                    f"converted with dimension(s) {[d for d, _ in fixed]} fixed to "
                    f"{[s for _, s in fixed]} ({info.shape}, None: any size)")
            env[info.name] = value
        for node, converter in self._steps:
            args = [None if not name else env[name] if name in env else self._value(name)
                    for name in node.inputs]
            shape_value = evaluate(node, args)   # shape arithmetic stays in Python ints
            if shape_value is not None:
                env[node.outputs[0]] = shape_value
                continue
            args = [converter_input(node, i, a) for i, a in enumerate(args)]
            self._store_outputs(node, converter.fn(node, *args), fold=False, env=env)
        outs = tuple(env[o.name] if o.name in env else self._value(o.name)
                     for o in self.spec.outputs)
        outs = tuple(o.to_tensor() if isinstance(o, ShapeValue) else o for o in outs)
        return outs[0] if len(outs) == 1 else outs
