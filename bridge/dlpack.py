"""Hand tensors between TF and Torch over DLPack: zero-copy where possible, one copy otherwise.

``to_torch(tf_tensor, device=None)`` and ``to_tf(torch_tensor)`` share the buffer when the
dtype and device allow it (a cost flat in the tensor's size). Everything else follows the
support table in ``bridge/dtypes.py``:

* rejected dtypes (TF strings, resources, float8, quantized) raise ``BridgeError`` *before*
  DLPack is touched, because TF aborts the whole process on some of them;
* a torch buffer TF cannot safely use (not contiguous, not 64-byte aligned, lazily conjugated,
  on a device TF lacks) is copied exactly once into a fresh, aligned, compact buffer;
* ``requires_grad`` tensors are detached (gradients do not cross);
* int32 on a TF GPU device lives in host memory, so it is staged through the host;
* a raw DLPack capsule is accepted once; a consumed one raises ``BridgeError``.

Zero-copy means aliasing: writing in place into a torch tensor that was handed to TF changes
the TF tensor too. It never means a dangling buffer: TF reads memory that torch could free or
move only through the tensor's storage (``resize_`` past its size, ``untyped_storage().resize_``,
both reallocating the one buffer every view of it uses), so a zero-copy ``to_tf`` first makes
that storage fixed in size (same bytes, no copy): such a resize then raises ``RuntimeError``
("not resizable") instead of freeing what TF reads; ``set_``, ``del`` and in-place writes work
as before.
``plan_to_torch``/``plan_to_tf`` say, without moving data, what a hand-off will do and why.
"""

from __future__ import annotations

import argparse
import functools
import threading
from typing import NamedTuple

import tensorflow as tf
import torch
import torch.utils.dlpack

from bridge.dtypes import TO_TF, TO_TORCH, Mode, condition, dtype_rule, render_markdown
from xgr_common.errors import BridgeError, InvalidInputError

TF_ALIGNMENT = 64  # bytes; EIGEN_MAX_ALIGN_BYTES of TF's CPU kernels (tf.sysconfig flags)
# Serialises the two storage swaps of ``_pin_buffer``: two threads handing tensors of one
# storage to TF at once must not interleave them (the storage is empty between the swaps).
_PIN_LOCK = threading.Lock()
_CPU = torch.device("cpu")
# Enum members as plain names: an attribute lookup on the Enum class is a measurable share of
# a hand-off.
_ZERO_COPY, _COPY, _REJECTED = Mode.ZERO_COPY, Mode.COPY, Mode.REJECTED


class HandOff(NamedTuple):
    """What one hand-off does. ``steps`` are ``bridge.dtypes.CONDITIONS`` keys (or
    ``"host_staging"`` for a dtype rule that forces a copy); ``reasons`` explain them.

    A NamedTuple, not a frozen dataclass: it is built on every hand-off, and a frozen
    dataclass's ``__init__`` alone would be a large share of what a hand-off takes.
    """

    direction: str
    mode: Mode
    source_device: torch.device
    target_device: torch.device
    steps: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


def _reject(direction: str, what: str, reason: str) -> BridgeError:
    arrow = "TF -> Torch" if direction == TO_TORCH else "Torch -> TF"
    return BridgeError(f"{arrow}: {what} cannot cross the bridge: {reason}")


def _is_capsule(obj: object) -> bool:
    return type(obj).__name__ == "PyCapsule"


def _require_fresh_capsule(capsule: object, direction: str) -> None:
    # A consumed capsule is renamed "used_dltensor"; both libraries then fail with obscure text.
    if '"dltensor"' not in repr(capsule):
        raise _reject(direction, f"capsule {capsule!r}",
                      condition("consumed_capsule", direction).reason)


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a == b:  # the common case, decided in C
        return True
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _torch_device_of_tf(device_name: str) -> torch.device:
    """``/job:localhost/replica:0/task:0/device:GPU:1`` -> ``cuda:1``; CPU -> ``cpu``."""
    kind, _, index = device_name.rpartition("device:")[2].partition(":")
    if kind == "GPU":
        return torch.device("cuda", int(index or 0))
    if kind == "CPU":
        return torch.device("cpu")
    raise BridgeError(f"TF -> Torch: unsupported TF device {device_name!r} (CPU and GPU only)")


def plan_tf_to_torch(dtype: str, source: torch.device, target: torch.device) -> HandOff:
    """Plan for a TF tensor of ``dtype`` on ``source`` (as a torch device) going to ``target``.

    Raises ``BridgeError`` for rejected dtypes. Pure: testable for devices this host lacks.
    """
    rule = dtype_rule(dtype, TO_TORCH, tf_on_gpu=source.type == "cuda")
    if rule.mode is _REJECTED:
        raise _reject(TO_TORCH, f"a {dtype} tensor", rule.reason)
    steps, reasons = [], []
    if rule.mode is _COPY:
        steps.append("host_staging")
        reasons.append(rule.reason)
    elif not _same_device(source, target):
        steps.append("device_mismatch")
        reasons.append(condition("device_mismatch", TO_TORCH).reason)
    return HandOff(TO_TORCH, _COPY if steps else _ZERO_COPY, source, target,
                   tuple(steps), tuple(reasons))


def plan_to_torch(tf_tensor: tf.Tensor, device: str | torch.device | None = None) -> HandOff:
    """What ``to_torch(tf_tensor, device)`` will do, without moving data."""
    if not isinstance(tf_tensor, tf.Tensor):
        raise _reject(TO_TORCH, f"a {type(tf_tensor).__name__}",
                      "expected an eager tf.Tensor (for a tf.Variable pass "
                      "tf.convert_to_tensor(variable), a snapshot)")
    if tf.is_symbolic_tensor(tf_tensor):
        raise _reject(TO_TORCH, f"symbolic tensor {tf_tensor.name!r}",
                      condition("symbolic", TO_TORCH).reason)
    source = _torch_device_of_tf(tf_tensor.device)
    if device is None:
        return plan_tf_to_torch(tf_tensor.dtype.name, source, source)
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InvalidInputError(f"device must be a torch device such as 'cpu' or 'cuda:0', "
                                f"got {device!r} ({err})") from None
    return plan_tf_to_torch(tf_tensor.dtype.name, source, target)


def to_torch(tf_tensor: tf.Tensor, device: str | torch.device | None = None) -> torch.Tensor:
    """A torch tensor with ``tf_tensor``'s dtype, shape and values.

    Args:
      tf_tensor: an eager ``tf.Tensor`` (any shape, 0-d and empty included) or a fresh DLPack
        capsule.
      device: torch device for the result; ``None`` keeps the TF tensor's device. When it
        matches, the result shares the TF buffer (zero-copy); otherwise exactly one copy.
    Raises:
      BridgeError: the dtype, tensor kind or capsule cannot cross (see ``bridge/dtypes.py``).
      InvalidInputError: ``device`` is not a torch device.
    """
    if _is_capsule(tf_tensor):
        _require_fresh_capsule(tf_tensor, TO_TORCH)
        out = torch.utils.dlpack.from_dlpack(tf_tensor)
        return out if device is None or _same_device(out.device, torch.device(device)) \
            else out.to(device)
    plan = plan_to_torch(tf_tensor, device)
    if plan.steps and plan.steps[0] == "host_staging":
        # .numpy() knows TF's memory types (int32 on a GPU device sits in host memory).
        out = torch.from_numpy(tf_tensor.numpy())
    else:
        out = torch.utils.dlpack.from_dlpack(tf.experimental.dlpack.to_dlpack(tf_tensor))
    return out if _same_device(out.device, plan.target_device) else out.to(plan.target_device)


def plan_torch_to_tf(dtype: str, device: str | torch.device, *, strided: bool = True,
                     contiguous: bool = True, aligned: bool = True, lazy_bits: bool = False,
                     requires_grad: bool = False, tf_has_gpu: bool = False,
                     pinnable: bool = True) -> HandOff:
    """Plan for a torch tensor with these properties going to TF. Raises ``BridgeError`` for
    anything rejected. Pure: testable for devices this host lacks."""
    device = torch.device(device)
    device_type = device.type
    what = f"a {dtype} tensor on {device}"
    if not strided:
        raise _reject(TO_TF, what, condition("non_strided", TO_TF).reason)
    if device_type not in ("cpu", "cuda"):
        raise _reject(TO_TF, what, condition("unsupported_device", TO_TF).reason)
    on_gpu = device_type == "cuda" and tf_has_gpu
    rule = dtype_rule(dtype, TO_TF, tf_on_gpu=on_gpu)
    if rule.mode is _REJECTED:
        raise _reject(TO_TF, what, rule.reason)
    target = device if on_gpu and rule.mode is _ZERO_COPY else _CPU
    flags = (("requires_grad", requires_grad), ("lazy_conj_or_neg", lazy_bits),
             ("cuda_without_tf_gpu", device_type == "cuda" and not tf_has_gpu),
             ("non_contiguous", not contiguous), ("unaligned", contiguous and not aligned),
             ("unpinnable", not pinnable))
    steps = [key for key, present in flags if present]
    reasons = [condition(key, TO_TF).reason for key in steps]
    if rule.mode is _COPY:
        steps.append("host_staging")
        reasons.append(rule.reason)
    copies = any(condition(k, TO_TF).mode is _COPY for k in steps if k != "host_staging")
    mode = _COPY if copies or rule.mode is _COPY else _ZERO_COPY
    return HandOff(TO_TF, mode, device, target, tuple(steps), tuple(reasons))


@functools.cache
def _tf_has_gpu() -> bool:
    # TF fixes its devices when its runtime starts; asked once, on the first CUDA hand-off.
    return bool(tf.config.list_logical_devices("GPU"))


def plan_to_tf(torch_tensor: torch.Tensor) -> HandOff:
    """What ``to_tf(torch_tensor)`` will do, without moving data."""
    if not isinstance(torch_tensor, torch.Tensor):
        raise _reject(TO_TF, f"a {type(torch_tensor).__name__}", "expected a torch.Tensor")
    t = torch_tensor
    strided = t.layout == torch.strided
    return plan_torch_to_tf(
        str(t.dtype)[6:], t.device, strided=strided,
        contiguous=strided and t.is_contiguous(),
        aligned=strided and t.data_ptr() % TF_ALIGNMENT == 0,
        lazy_bits=t.is_conj() or t.is_neg(), requires_grad=t.requires_grad,
        tf_has_gpu=t.device.type == "cuda" and _tf_has_gpu(),
        pinnable=can_pin() or not t.untyped_storage().resizable())


def _aligned_empty(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised compact tensor whose data starts on a ``TF_ALIGNMENT`` boundary."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.data_ptr() % TF_ALIGNMENT == 0:
        return out  # torch's CPU allocator aligns to 64 bytes; the fallback is for other ones
    nbytes = out.numel() * out.element_size()
    raw = torch.empty(nbytes + TF_ALIGNMENT, dtype=torch.uint8, device=device)
    skip = -raw.data_ptr() % TF_ALIGNMENT
    return raw[skip:skip + nbytes].view(dtype).view(shape)


def _fixed_alias(whole: torch.Tensor) -> torch.UntypedStorage:
    """A storage that cannot be resized over ``whole``'s bytes, keeping ``whole`` alive."""
    if whole.device.type == "cpu":   # numpy's route: a few microseconds faster than DLPack's
        return torch.from_numpy(whole.numpy()).untyped_storage()
    return torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(whole)).untyped_storage()


def can_pin() -> bool:
    """Whether this torch can move a storage's allocation (``_swap_data_ptr_``, torch 2.13 on);
    without it ``to_tf`` copies a resizable buffer instead of sharing it."""
    return hasattr(torch.UntypedStorage, "_swap_data_ptr_")


def _pin_buffer(tensor: torch.Tensor) -> None:
    """Makes ``tensor``'s buffer outlive any resize of its storage: the allocation moves to a
    fresh private storage, and the storage itself (``tensor``'s and every view's) is left on
    the same bytes but fixed in size, through a pointer that keeps the private one alive.

    Why: TF's DLPack view holds the tensor's storage, but a storage is one buffer that
    ``resize_`` replaces in place for every tensor on it, freeing the old one under TF (SIGSEGV
    at 64 MB, silent garbage at 4 KB). After this, such a resize raises "not resizable";
    ``_swap_data_ptr_`` moves ownership of the allocation, never the bytes, so nothing is
    copied and whoever lets go last frees it."""
    storage = tensor.untyped_storage()
    if not storage.resizable() or storage.nbytes() == 0:
        # Fixed-size storages (numpy's, DLPack's, an earlier to_tf's) are never reallocated;
        # TF's reference keeps them alive like any other.
        return
    with _PIN_LOCK:
        if not storage.resizable():   # another thread pinned it meanwhile
            return
        private = (torch.UntypedStorage() if storage.device.type == "cpu"
                   else torch.UntypedStorage(0, device=storage.device))
        storage._swap_data_ptr_(private)           # private owns the allocation now
        whole = torch.empty(0, dtype=torch.uint8, device=private.device).set_(private)
        storage._swap_data_ptr_(_fixed_alias(whole))   # same bytes, not resizable


def to_tf(torch_tensor: torch.Tensor) -> tf.Tensor:
    """A TF tensor with ``torch_tensor``'s dtype, shape and values.

    Args:
      torch_tensor: a strided CPU or CUDA ``torch.Tensor`` (any shape, 0-d and empty included),
        or a fresh DLPack capsule.
    Returns:
      A TF tensor sharing the torch buffer when it is compact, 64-byte aligned and on a device
      TF has; otherwise a tensor over exactly one copy into such a buffer (``plan_to_tf`` says
      which). The torch buffer stays alive and in place as long as the TF tensor does: after a
      zero-copy hand-off the torch tensor's storage cannot be resized (see the module doc).
    Raises:
      BridgeError: the dtype, layout, device or capsule cannot cross (see ``bridge/dtypes.py``).
    """
    if _is_capsule(torch_tensor):
        _require_fresh_capsule(torch_tensor, TO_TF)
        torch_tensor = torch.utils.dlpack.from_dlpack(torch_tensor)
    plan = plan_to_tf(torch_tensor)
    source = torch_tensor.detach()
    if plan.mode is _COPY:
        # One copy covers every reason at once: copy_ resolves lazy conj/neg bits, compacts
        # strides and moves devices; the destination is fresh and aligned.
        staged = _aligned_empty(source.shape, source.dtype, plan.target_device)
        source = staged.copy_(source)   # a fresh buffer nobody else holds: nothing to pin
    else:
        _pin_buffer(source)
    return tf.experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(source))


def tf_data_pointer(tf_tensor: tf.Tensor) -> int:
    """Address of a CPU TF tensor's buffer (to check zero-copy against ``Tensor.data_ptr()``)."""
    if _torch_device_of_tf(tf_tensor.device).type != "cpu":
        raise BridgeError(f"tf_data_pointer reads CPU tensors only, got {tf_tensor.device!r}")
    # _numpy() is TF's view of its own buffer (no copy), unlike .numpy().
    return tf_tensor._numpy().__array_interface__["data"][0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bridge.dlpack",
                                     description="Print the bridge's dtype support table.")
    parser.add_argument("--markdown", action="store_true", help="as Markdown (the default)")
    parser.parse_args(argv)
    print(render_markdown(), end="")


if __name__ == "__main__":
    main()
