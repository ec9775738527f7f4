"""AOTInductor compiles a CUDA package in two passes: a first, Python pass that runs the program
once on the example inputs (it compiles and tunes the Triton kernels), then the C++ pass that
becomes the package. Exporting the engine on the H200, the first pass of full-size exports
ended with an illegal memory access (raised later, at an unrelated call), while the exported
program ran cleanly eagerly on the same inputs, and every first pass with a device
synchronisation after each kernel (Inductor's ``triton.debug_sync_kernel``) ran cleanly: a
fault of timing between the host and the device in that pass, not of the program, whose
packages answer like ``Engine.recommend``. (Packages holding the fused layer kernels still
fault with the synchronisation, outside the first pass: ``docs/notes/gpu_serving.md``.)

``debug_sync_kernel`` alone cannot be used: it also writes its Python synchronisation into the
C++ wrapper, which then fails to compile. ``synchronised_first_pass`` turns it on for the
Python pass only; the package itself holds no synchronisation.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from xgr_export.inductor_patch import method_replaced


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
