"""The DLPack bridge under hostile tensors and hostile torch operations after a hand-off, run
in a child process (``tests/fuzz_suite.py`` runs ``run(CHECK)``; ``python fuzz_dlpack.py
CHECK...`` alone).

A use-after-free or an abort kills this child, never the test session (faulthandler prints
where). Checks, one report line each:

* ``resize CASE SIZE``: the issue's cases: a tensor of SIZE bytes handed to TF, then torch
  resizes it (``resize_`` past its size, ``untyped_storage().resize_(0)``), replaces its
  storage (``set_``) and drops it, and the allocator is made to reuse freed memory. TF must
  still read the original values; a resize must be refused. ``ok`` or ``wrong``.
* ``raw CASE SIZE``: the same with raw DLPack instead of ``to_tf``: the hazard the bridge
  guards against (prints ``wrong``, or dies at 64 MB): TF reads an address torch freed,
  whether or not the allocator has handed it out again (that part is up to malloc).
* ``fuzz``: hypothesis over dtypes, shapes, views (transposed, offset, broadcast, conj,
  neg, grad), devices and the operations above, both directions: each case crosses with
  equal values and survives what follows, or raises ``BridgeError``. Last line
  ``surface dlpack cases=N crossed=C refused=R``.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import numpy as np
import tensorflow as tf
import torch
import torch.utils.dlpack
from hypothesis import HealthCheck, given, settings, strategies as st

from bridge.dlpack import plan_to_tf, to_tf, to_torch
from bridge.dtypes import Mode
from xgr_common.errors import BridgeError

EXAMPLES = int(os.environ.get("XGR_FUZZ_EXAMPLES", "300"))


def _churn(nbytes: int) -> list:
    """Allocations of the freed size, filled with a marker, so freed memory gets reused."""
    return [torch.full((max(1, nbytes // 4),), -7.0) for _ in range(4)]


def _raw_to_tf(tensor: torch.Tensor) -> tf.Tensor:
    return tf.experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(tensor))


def _tf_address(x: tf.Tensor) -> int:
    """Where a TF tensor's buffer lies (DLPack back to torch shares it, copies nothing)."""
    return torch.utils.dlpack.from_dlpack(tf.experimental.dlpack.to_dlpack(x)).data_ptr()


def resize_case(case: str, nbytes: int, hand_off) -> str:
    """``ok`` when TF still reads the original values from memory torch keeps; ``wrong`` when
    it reads other values, or reads memory torch has let go of (its storage moved away from
    the address TF reads: a dangling view, whether or not the allocator reused it yet)."""
    n = nbytes // 4
    tensor = torch.arange(n, dtype=torch.float32)
    expected = float(np.arange(n, dtype=np.float64).sum())
    x = hand_off(tensor)
    storage = tensor.untyped_storage()
    before = storage.data_ptr()
    refused = 0
    try:
        if case == "resize":
            tensor.resize_(4 * n)
        elif case == "storage_resize":
            tensor.untyped_storage().resize_(0)
        elif case == "set":
            tensor.set_(torch.zeros(3))
    except RuntimeError as e:
        refused = "not resizable" in str(e)
    # The same storage object now elsewhere (or empty) while TF reads the old address: freed.
    dangling = (case != "set" and storage.data_ptr() != before
                and _tf_address(x) == before)
    del tensor, storage   # reference counting frees it now (and whatever torch freed before)
    junk = _churn(nbytes)
    got = float(tf.reduce_sum(tf.cast(x, tf.float64)))
    head = x[:4].numpy().tolist()
    del junk
    ok = got == expected and head == [0.0, 1.0, 2.0, 3.0][:min(4, n)] and not dangling
    return f"{'ok' if ok else 'wrong'} refused={int(refused)}"


# -- the fuzz surface ------------------------------------------------------------------------
TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
                torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64,
                torch.float8_e4m3fn, torch.complex32]
VIEWS = ["plain", "transposed", "offset", "broadcast", "conj", "neg", "grad", "sparse", "numpy",
         "empty"]
AFTER = ["none", "resize", "storage_resize", "set", "write", "delete"]


def _make(dtype, shape, view) -> torch.Tensor:
    base = (torch.arange(int(np.prod(shape)) or 1, dtype=torch.float64) % 7 - 3)
    base = base[:int(np.prod(shape))].reshape(shape)
    if dtype.is_complex:
        base = torch.complex(base, -base).to(dtype) if dtype != torch.complex32 else \
            torch.complex(base.half(), -base.half())
    elif dtype == torch.bool:
        base = base > 0
    else:
        base = base.to(dtype) if dtype not in (torch.uint16, torch.uint32, torch.uint64) \
            else base.abs().to(torch.int64).to(dtype)
    if view == "transposed" and base.dim() >= 2:
        return base.transpose(0, 1)
    if view == "offset":
        return torch.cat([base.reshape(-1)[:1], base.reshape(-1)])[1:].reshape(shape)
    if view == "broadcast" and base.dim() >= 1 and shape[0] > 0:
        return base[:1].expand(shape)
    if view == "conj" and dtype.is_complex and dtype != torch.complex32:
        return base.conj()
    if view == "neg" and dtype.is_complex and dtype != torch.complex32:
        return torch._neg_view(base)
    if view == "grad" and (dtype.is_floating_point or dtype.is_complex) and dtype.itemsize >= 4:
        return base.clone().requires_grad_(True)
    if view == "sparse" and base.dim() >= 1 and dtype in (torch.float32, torch.int64):
        return base.to_sparse()
    if view == "numpy" and dtype in (torch.float32, torch.int64, torch.uint8, torch.bool):
        return torch.from_numpy(base.numpy().copy())
    if view == "empty":
        return torch.empty((0,) + tuple(shape[1:]), dtype=base.dtype)
    return base


def _values(tensor: torch.Tensor) -> np.ndarray | None:
    """The tensor's values as numpy (None where numpy has no such dtype)."""
    t = tensor.detach().resolve_conj().resolve_neg()
    if t.layout != torch.strided:
        t = t.to_dense()
    try:
        return t.numpy().copy()
    except TypeError:
        return None


class Tally:
    cases = crossed = refused = 0


def torch_to_tf_case(dtype, shape, view, after) -> None:
    tensor = _make(dtype, shape, view)
    before = _values(tensor)
    Tally.cases += 1
    try:
        shared = plan_to_tf(tensor).mode is Mode.ZERO_COPY
        x = to_tf(tensor)
    except BridgeError:
        Tally.refused += 1
        return
    Tally.crossed += 1
    try:
        if after == "resize":
            tensor.detach().resize_(4 * max(1, tensor.numel()))
        elif after == "storage_resize":
            tensor.untyped_storage().resize_(0)
        elif after == "set":
            tensor.detach().set_(torch.zeros(1, dtype=tensor.dtype))
        elif after == "write" and tensor.layout == torch.strided:
            with torch.no_grad():
                tensor.zero_()
            if shared:   # aliasing: TF sees the write; after a copy it keeps the old values
                before = _values(tensor)
    except RuntimeError:
        pass   # torch refusing the operation is fine; TF must not see it anyway
    del tensor   # reference counting frees it here (no cycles): no gc.collect, which is slow
    if after in ("delete", "resize", "storage_resize", "set"):
        junk = _churn(max(64, x.shape.num_elements() * x.dtype.size))
    got = x.numpy() if before is not None else None
    if before is not None and got is not None and got.dtype == before.dtype:
        assert np.array_equal(got, before, equal_nan=True), (dtype, shape, view, after)
    if after in ("delete", "resize", "storage_resize", "set"):
        del junk


TF_KINDS = ["float32", "int32", "int64", "bool", "string", "resource", "variant", "uint8",
            "complex128", "bfloat16", "qint8"]


def tf_to_torch_case(kind, shape) -> None:
    Tally.cases += 1
    if kind == "string":
        value = tf.fill(shape, "de")
    elif kind == "resource":
        value = tf.Variable(1.0).handle
    elif kind == "variant":
        value = tf.data.Dataset.range(3)._variant_tensor
    elif kind == "qint8":
        value = tf.bitcast(tf.zeros(shape, tf.int8), tf.qint8)
    else:
        value = tf.cast(tf.reshape(tf.range(int(np.prod(shape))) % 5, shape), kind)
    try:
        out = to_torch(value)
    except BridgeError:
        Tally.refused += 1
        return
    Tally.crossed += 1
    try:   # a torch tensor over TF's buffer cannot be reallocated under it
        out.resize_(4 * max(1, out.numel()))
    except RuntimeError:
        pass
    del out
    assert value.numpy().shape == tuple(shape)


SHAPES = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def fuzz() -> None:
    settings_ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck))

    @settings_
    @given(st.sampled_from(TORCH_DTYPES), SHAPES, st.sampled_from(VIEWS), st.sampled_from(AFTER))
    def torch_side(dtype, shape, view, after):
        torch_to_tf_case(dtype, shape, view, after)

    @settings(max_examples=max(20, EXAMPLES // 5), deadline=None, database=None,
              derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(TF_KINDS), SHAPES)
    def tf_side(kind, shape):
        tf_to_torch_case(kind, shape)

    torch_side()
    tf_side()
    print(f"surface dlpack cases={Tally.cases} crossed={Tally.crossed} refused={Tally.refused}",
          flush=True)


def run(check: str) -> None:
    """``fuzz``, or ``resize:CASE:SIZE`` / ``raw:CASE:SIZE`` (one line of report each)."""
    if check == "fuzz":
        fuzz()
        return
    kind, case, size = check.split(":")
    hand_off = to_tf if kind == "resize" else _raw_to_tf
    print(kind, case, size, resize_case(case, int(size), hand_off), flush=True)


if __name__ == "__main__":
    faulthandler.enable()
    for argument in sys.argv[1:]:
        run(argument)
