"""How a CUDA engine package's AOTInductor compile runs its first pass.

For CUDA, AOTInductor by default compiles and tunes every Triton kernel in one generated
"tuning block" that launches each kernel on arguments it makes up (random floats, integer
tensors of zeros, sizes from hints), not on the program's example inputs. On the H200 that
block ended in illegal memory accesses, raised later at an unrelated call, for engines with
the fused layer kernels and at times for full-size engines without them, while the exported programs
ran cleanly eagerly on the same inputs and the same block compiled when a device
synchronisation followed each of its launches (``experiments/probe_aoti_autotune.py``). So
``cuda_first_pass`` turns that block off (``REAL_INPUT_FIRST_PASS``): the compile then takes
two passes, a Python pass that runs the whole program once on the real example inputs (valid
requests, whatever the kernels index) and the C++ pass that becomes the package.

The Python pass runs under ``torch.no_grad()``: the module's parameters require gradients,
and Inductor's products with an output buffer refuse such arguments in grad mode (seen there).
It also synchronises the device after every kernel it writes (``synchronised_first_pass``), so
a fault of that pass is raised at its kernel; ``triton.debug_sync_kernel`` alone cannot be
used: it also writes its Python synchronisation into the C++ wrapper, which then fails to
compile. The package itself holds no synchronisation.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from xgr_export.inductor_patch import method_replaced

# Inductor settings of a CUDA package's compile: the real-input first pass, no tuning block.
REAL_INPUT_FIRST_PASS = {"triton.autotune_at_compile_time": False}


def _scheduling_class():
    try:
        from torch._inductor.codegen.simd import SIMDScheduling
    except ImportError:    # a torch without Inductor's Triton scheduling: nothing to do
        return None
    return SIMDScheduling if "codegen_sync" in SIMDScheduling.__dict__ else None


def codegen_sync(self) -> None:
    """A device synchronisation after the kernel just written, in the Python wrapper only."""
    from torch._inductor.virtualized import V

    if not V.graph.cpp_wrapper:
        V.graph.wrapper_code.writeline(V.graph.device_ops.synchronize())


@contextlib.contextmanager
def synchronised_first_pass() -> Iterator[bool]:
    """While open, the Python pass of an AOTInductor compile synchronises the device after
    every kernel and the C++ pass does not. Yields whether this torch allows it (False: its
    scheduling has another shape; the compile then runs unchanged)."""
    import torch._inductor.config as inductor_config

    cls = _scheduling_class()
    if cls is None:
        yield False
        return
    with method_replaced(cls, "codegen_sync", codegen_sync), \
            inductor_config.patch({"triton.debug_sync_kernel": True}):
        yield True


@contextlib.contextmanager
def cuda_first_pass(device: str) -> Iterator[dict]:
    """While open, an AOTInductor compile for ``device`` runs its first pass as this module
    says; yields the Inductor settings to add to the compile's (none off CUDA, where the
    compile has one pass)."""
    if not device.startswith("cuda"):
        yield {}
        return
    import torch

    with torch.no_grad(), synchronised_first_pass():
        yield dict(REAL_INPUT_FIRST_PASS)
