"""What may cross the TF<->Torch DLPack bridge, and how: the one support table.

Two tables, both plain data, with no TF or torch import:

* ``DTYPES``: per dtype and direction, zero-copy / copy / rejected, with the reason. The bridge
  looks every hand-off up here (``dtype_rule``); an unknown dtype is rejected, because TF aborts
  the whole process on some dtypes it cannot export (strings, resources).
* ``CONDITIONS``: properties of one tensor that force a copy (or a rejection) whatever its
  dtype: another device, a non-contiguous or unaligned torch buffer, lazy conjugate bits.
  The bridge names the conditions it applied in its ``HandOff`` plan.

``render_markdown()`` turns both into ``migration_guide/bridge_dtypes.md``
(``python -m bridge.dlpack --markdown``); a test keeps the committed file equal to it.
Measured on TF 2.21 and torch 2.13 (see the bridge tests, which drive every row).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

TO_TORCH = "tf_to_torch"
TO_TF = "torch_to_tf"
DIRECTIONS = (TO_TORCH, TO_TF)


class Mode(str, enum.Enum):
    ZERO_COPY = "zero-copy"
    COPY = "copy"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Rule:
    """How one dtype crosses in one direction. ``on_gpu`` overrides it when the TF side is a GPU."""

    mode: Mode
    reason: str = ""
    on_gpu: "Rule | None" = None


@dataclass(frozen=True)
class DtypeSupport:
    """One row: a dtype by its shared TF/torch name, and its rule in each direction."""

    name: str
    to_torch: Rule
    to_tf: Rule

    def rule(self, direction: str) -> Rule:
        return self.to_torch if direction == TO_TORCH else self.to_tf


_ZERO = Rule(Mode.ZERO_COPY)
# TF places int32 tensors of GPU devices in host memory (shape-like data for host kernels), but
# its DLPack export labels them with the GPU device: a consumer would read host memory as device
# memory. Torch's CUDA int32 in turn would reach TF as device memory where TF expects host memory.
_INT32_GPU = Rule(Mode.COPY, "TF keeps int32 tensors of GPU devices in host memory, so the "
                             "tensor is staged through host memory")
_FLOAT8 = Rule(Mode.REJECTED, "DLPack in TF 2.21 has no float8 type code (and tf.bitcast does "
                              "not take float8); cast to bfloat16 first")
_QUANTIZED_TF = Rule(Mode.REJECTED, "DLPack has no quantized types; tf.bitcast to the plain "
                                    "integer type first")
_QUANTIZED_TORCH = Rule(Mode.REJECTED, "DLPack has no quantized types; hand over `.int_repr()` "
                                       "and the scale/zero point separately")
_NO_TORCH_TYPE = Rule(Mode.REJECTED, "torch has no such dtype")
_STRING = Rule(Mode.REJECTED, "TF strings are not fixed-width; tf.experimental.dlpack would abort "
                              "the process (DataTypeCanUseMemcpy). Map strings to ids in TF "
                              "(StringLookup, Hashing)")

DTYPES: tuple[DtypeSupport, ...] = (
    DtypeSupport("float16", _ZERO, _ZERO),
    DtypeSupport("bfloat16", _ZERO, _ZERO),
    DtypeSupport("float32", _ZERO, _ZERO),
    DtypeSupport("float64", _ZERO, _ZERO),
    DtypeSupport("int8", _ZERO, _ZERO),
    DtypeSupport("int16", _ZERO, _ZERO),
    DtypeSupport("int32", Rule(Mode.ZERO_COPY, on_gpu=_INT32_GPU),
                 Rule(Mode.ZERO_COPY, on_gpu=_INT32_GPU)),
    DtypeSupport("int64", _ZERO, _ZERO),
    DtypeSupport("uint8", _ZERO, _ZERO),
    DtypeSupport("uint16", _ZERO, _ZERO),
    DtypeSupport("uint32", _ZERO, _ZERO),
    DtypeSupport("uint64", _ZERO, _ZERO),
    DtypeSupport("bool", _ZERO, _ZERO),
    DtypeSupport("complex64", _ZERO, _ZERO),
    DtypeSupport("complex128", _ZERO, _ZERO),
    DtypeSupport("string", _STRING, _NO_TORCH_TYPE),
    DtypeSupport("resource", Rule(Mode.REJECTED, "a handle, not data; DLPack export would abort "
                                                 "the process. Read the variable's value first"),
                 _NO_TORCH_TYPE),
    DtypeSupport("variant", Rule(Mode.REJECTED, "an opaque TF object; DLPack export would abort "
                                                "the process"), _NO_TORCH_TYPE),
    DtypeSupport("qint8", _QUANTIZED_TF, _QUANTIZED_TORCH),
    DtypeSupport("quint8", _QUANTIZED_TF, _QUANTIZED_TORCH),
    DtypeSupport("qint32", _QUANTIZED_TF, _QUANTIZED_TORCH),
    DtypeSupport("float8_e4m3fn", _FLOAT8, _FLOAT8),
    DtypeSupport("float8_e5m2", _FLOAT8, _FLOAT8),
)

_BY_NAME = {row.name: row for row in DTYPES}


def dtype_rule(name: str, direction: str, tf_on_gpu: bool = False) -> Rule:
    """The rule for dtype ``name`` crossing in ``direction``; unknown dtypes are rejected.

    ``tf_on_gpu``: the TF side of the hand-off is a GPU device (source for ``TO_TORCH``,
    destination for ``TO_TF``); selects the row's ``on_gpu`` override when it has one.
    """
    row = _BY_NAME.get(name)
    if row is None:
        return Rule(Mode.REJECTED, f"dtype {name!r} is not in the bridge's support table "
                                   f"(bridge/dtypes.py); known: {sorted(_BY_NAME)}")
    rule = row.rule(direction)
    return rule.on_gpu if tf_on_gpu and rule.on_gpu is not None else rule


@dataclass(frozen=True)
class Condition:
    """A property of one tensor that changes how it crosses, whatever its dtype."""

    key: str
    direction: str
    mode: Mode
    reason: str


CONDITIONS: tuple[Condition, ...] = (
    Condition("symbolic", TO_TORCH, Mode.REJECTED,
              "a symbolic tensor (inside tf.function or a Keras functional graph) has no buffer; "
              "hand off in eager mode"),
    Condition("device_mismatch", TO_TORCH, Mode.COPY,
              "the requested torch device differs from the TF tensor's: imported zero-copy on "
              "the TF device, then one `.to(device)` copy"),
    Condition("consumed_capsule", TO_TORCH, Mode.REJECTED,
              "a DLPack capsule can be consumed once; export the tensor again"),
    Condition("consumed_capsule", TO_TF, Mode.REJECTED,
              "a DLPack capsule can be consumed once; export the tensor again"),
    Condition("non_strided", TO_TF, Mode.REJECTED,
              "sparse and other non-strided layouts have no DLPack form; call `.to_dense()`"),
    Condition("unsupported_device", TO_TF, Mode.REJECTED,
              "only CPU and CUDA torch tensors can reach TF"),
    Condition("requires_grad", TO_TF, Mode.ZERO_COPY,
              "detached (no copy): gradients do not flow across the bridge"),
    Condition("lazy_conj_or_neg", TO_TF, Mode.COPY,
              "DLPack drops torch's lazy conjugate/negation bits, so TF would see wrong values; "
              "resolved into a new buffer"),
    Condition("cuda_without_tf_gpu", TO_TF, Mode.COPY,
              "this TF has no GPU device; the CUDA tensor is copied to host memory"),
    Condition("non_contiguous", TO_TF, Mode.COPY,
              "TF takes only compact row-major strides (transposes, step slices and `expand` "
              "are refused); made contiguous"),
    Condition("unaligned", TO_TF, Mode.COPY,
              "TF kernels need 64-byte aligned buffers and abort the process otherwise (e.g. "
              "`base[1:]`, most NumPy-backed tensors); cloned into a fresh aligned allocation"),
    Condition("unpinnable", TO_TF, Mode.COPY,
              "a resizable buffer is shared only once its allocation is pinned against a later "
              "`resize_`, which needs `UntypedStorage._swap_data_ptr_` (torch 2.13 on); older "
              "torch copies it once"),
)


def condition(key: str, direction: str) -> Condition:
    """The ``CONDITIONS`` entry ``key`` for ``direction``; KeyError names the key."""
    for entry in CONDITIONS:
        if entry.key == key and entry.direction == direction:
            return entry
    raise KeyError(f"no bridge condition {key!r} for {direction}")


def _cell(rule: Rule) -> str:
    text = rule.mode.value + (f": {rule.reason}" if rule.reason else "")
    if rule.on_gpu is not None:
        text += f"; with TF on a GPU: {rule.on_gpu.mode.value} ({rule.on_gpu.reason})"
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """The support tables as Markdown (the content of ``migration_guide/bridge_dtypes.md``)."""
    lines = [
        "# TF <-> Torch bridge: what crosses, and how",
        "",
        "Generated from `bridge/dtypes.py` by `python -m bridge.dlpack --markdown`; do not edit.",
        "",
        "`bridge.to_torch(tf_tensor, device=None)` and `bridge.to_tf(torch_tensor)` (`from "
        "bridge import to_torch, to_tf`; defined in `bridge/dlpack.py`) hand tensors over "
        "through DLPack. *zero-copy*: both sides share one buffer (a later "
        "in-place write on the Torch side is visible to TF). *copy*: exactly one explicit copy. "
        "*rejected*: a `xgr_common.errors.BridgeError` naming the reason, raised before DLPack "
        "is touched. A zero-copy `to_tf` leaves the torch tensor's storage fixed in size (the "
        "same bytes, no copy): `resize_` past its size or `untyped_storage().resize_` then "
        "raises `RuntimeError` instead of freeing the buffer TF reads.",
        "",
        "## By dtype",
        "",
        "| dtype | TF -> Torch | Torch -> TF |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{row.name}` | {_cell(row.to_torch)} | {_cell(row.to_tf)} |" for row in DTYPES]
    lines += ["", "0-d and empty tensors of every zero-copy dtype cross zero-copy.", "",
              "## Per tensor, whatever the dtype", "",
              "| condition | direction | outcome | why |", "| --- | --- | --- | --- |"]
    lines += [f"| `{c.key}` | {c.direction.replace('_', ' ')} | {c.mode.value} | {c.reason} |"
              for c in CONDITIONS]
    return "\n".join(lines) + "\n"
