"""Loading an AOTInductor package from Python (``torch._inductor.aoti_load_package``) without
Inductor's CPU-ISA build probe.

Before it loads a package, Inductor compares the package's recorded CPU vector ISA with this
machine's, and finds this machine's by compiling and ``dlopen``-ing a probe C++ file for each
ISA the CPU flags allow (AMX, AVX512-VNNI, AVX512, AVX2), once per process. On the H200 host
that took longer than 40 s per fresh process (stacks in ``benchmarks/notes/gpu_serving.md``), so
a Python process serving a package seemed to hang before its first call. The comparison only
logs a warning on a mismatch, and the package's code is already compiled, so the probes are
skipped (``cpp.vec_isa_ok = False``: no vector ISA is claimed for this machine, which costs the
one "Device information mismatch for AOTI_CPU_ISA" warning). Claiming the ISAs from the CPU
flags instead (``True``) still builds probes for their sub-features (AVX512-BF16, VNNI, AMX).
TorchCall's C++ loader never runs the probe.
"""

from __future__ import annotations

from pathlib import Path

import torch


def load_package(path: str | Path, device_index: int | None = None):
    """``torch._inductor.aoti_load_package(path)`` without the CPU-ISA probe builds; returns
    the package's callable."""
    import torch._inductor

    kwargs = {} if device_index is None else {"device_index": device_index}
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        return torch._inductor.aoti_load_package(str(path), **kwargs)
