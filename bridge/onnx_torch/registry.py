"""ONNX -> Torch converter registry, keyed by (domain, op_type) and versioned by opset.

Each converter is a plain function registered with :func:`converter`, in the manner of
tf2onnx's ``@tf_op(..., onnx_opset=N)`` handlers: an op may have several converters, and the
one used for a graph is the newest whose ``since_version`` does not exceed the graph's opset
for that domain (ONNX changed e.g. ``Squeeze``'s axes from an attribute to an input at 13).

A converter receives the node (:class:`GraphNode`) and the node's input tensors (``None`` for
an omitted optional input) and returns one tensor or a tuple of tensors, one per node output.
The support table in ``migration_guide/`` is generated from this registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

from xgr_common.errors import ConversionError

ONNX_DOMAIN = ""          # the default ONNX operator set ("ai.onnx" is an alias)
CUSTOM_DOMAIN = "xgr.custom"


@dataclass(frozen=True)
class GraphNode:
    """One ONNX node as the interpreter sees it; ``attrs`` hold JSON-able values or tensors."""

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


ConverterFn = Callable[..., "torch.Tensor | tuple[torch.Tensor, ...]"]


@dataclass(frozen=True)
class Converter:
    domain: str
    op_type: str
    since_version: int
    fn: ConverterFn
    summary: str


def normalise_domain(domain: str) -> str:
    return ONNX_DOMAIN if domain in ("", "ai.onnx") else domain


class ConverterRegistry:
    """All converters of one interpreter. The project has one: :data:`REGISTRY`."""

    def __init__(self) -> None:
        self._converters: dict[tuple[str, str], list[Converter]] = {}

    def register(self, op_type: str, *, domain: str = ONNX_DOMAIN, since_version: int = 1,
                 summary: str = "") -> Callable[[ConverterFn], ConverterFn]:
        """Decorator: register ``fn`` for ``(domain, op_type)`` from opset ``since_version`` on."""
        key = (normalise_domain(domain), op_type)

        def wrap(fn: ConverterFn) -> ConverterFn:
            versions = self._converters.setdefault(key, [])
            if any(c.since_version == since_version for c in versions):
                raise ConversionError(f"converter for {key} opset {since_version} registered twice")
            doc = summary or ((fn.__doc__ or "").strip().splitlines() or [""])[0]
            versions.append(Converter(key[0], op_type, since_version, fn, doc))
            versions.sort(key=lambda c: c.since_version)
            return fn

        return wrap

    def lookup(self, domain: str, op_type: str, opset: int) -> Converter | None:
        """The converter for a graph of ``opset`` in ``domain``, or None when there is none."""
        chosen = None
        for candidate in self._converters.get((normalise_domain(domain), op_type), ()):
            if candidate.since_version <= opset:
                chosen = candidate
        return chosen

    def why_missing(self, domain: str, op_type: str, opset: int) -> str:
        """A sentence saying why ``lookup`` found nothing (unknown op, or only newer versions)."""
        versions = self._converters.get((normalise_domain(domain), op_type))
        shown = f"{domain or 'ai.onnx'}::{op_type}"
        if not versions:
            return f"ONNX op {shown} has no Torch converter"
        return (f"ONNX op {shown} has Torch converters only from opset "
                f"{versions[0].since_version}, the graph uses opset {opset}")

    def __iter__(self) -> Iterator[Converter]:
        for key in sorted(self._converters):
            yield from self._converters[key]


REGISTRY = ConverterRegistry()
converter = REGISTRY.register
