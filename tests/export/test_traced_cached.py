"""A CUDA package that keeps a prompt cache traces the paged attention kernels into its
program (each a ``torch.library.triton_op``, so AOTInductor embeds them) with the suffix
width, the block table and the pool's pages left dynamic: the runtime sizes them per call.
Traced on the CPU in a child with the Triton interpreter off (``trace_cached_child.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.child_env import ROOT, child_env

# Each test traces the whole CUDA export in a child: a subprocess build, so not in test-quick.
pytestmark = pytest.mark.heavy


def _trace(*args: str) -> dict:
    env = child_env()
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "export" /
                                               "trace_cached_child.py"), *args],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_stores_in_place(traced: dict) -> None:
    """A miss's store writes into the pool input itself, which Inductor updates in place. A
    write into a view of the pool is compiled (before torch 2.13, as on the GPU host) as
    a copy of the whole pool: twice its memory, two passes over it per call. One write a
    layer's keys or values, each onto the value the one before wrote; nothing reads a
    replaced value after its write (the prefill's kernels read the pool before)."""
    [write] = traced["pool_writes"]
    assert write["ops"] == ["aten.index_put.default"] * (2 * traced["layers"]), write
    assert (write["onto"], write["reads_after"]) == ("input", []), write


def _assert_float32_scalars(traced: dict, expected: set[str]) -> None:
    """A package launches a Python float argument as a float64 scalar; every kernel narrows
    each such argument to float32 at entry, or its arithmetic with it (the attention's
    scale, the norms' eps: every element of a row) would run in float64 (three times the
    time of the engine's ``silu_mul`` inside a package)."""
    assert expected <= set(traced["float_args"]), traced["float_args"]
    assert traced["float64_compute"] == [], traced["float64_compute"]


def test_the_cached_search_traces_the_paged_kernels():
    traced = _trace()
    assert {"_paged_prefill_kernel", "_decode_partial_kernel"} <= set(traced["kernels"])
    assert traced["symbolic"] == {"suffix": True, "pages": True, "pool": True}
    assert traced["cache_line"][0].startswith("cache runtime=5 page_tokens=64")
    # Every runtime-sized dimension bounded: a pool of more than 2**31 elements (4 GiB in
    # bf16) must get 64-bit indexing, not the 32 bits its small example would choose.
    assert traced["unbounded"] == []
    _assert_stores_in_place(traced)
    _assert_float32_scalars(traced, {"_paged_prefill_kernel.qk_scale",
                                     "_decode_partial_kernel.qk_scale"})


def test_the_layer_kernel_program_stores_each_layer_from_where_it_is():
    """With the layer kernels, each layer's keys and values come back from ``qkv_rotary`` as
    new tensors. The program stores them from there: no copy of them into buffers of its own
    and no concatenation of every layer before the store (each would be a kernel a layer or
    a pass over every layer's KV in each call, hit or miss)."""
    traced = _trace("--layer_kernels")
    assert {"_qkv_rotary_kernel", "_silu_mul_kernel", "_paged_prefill_kernel"} <= set(
        traced["kernels"])
    assert traced["copies_into_new_buffers"] == 0
    assert traced["concatenations"] == 0
    assert traced["unbounded"] == []
    _assert_stores_in_place(traced)
    _assert_float32_scalars(traced, {"_qkv_rotary_kernel.eps", "_silu_mul_kernel.eps",
                                     "_paged_prefill_kernel.qk_scale"})
