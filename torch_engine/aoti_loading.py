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

A second trap on the same host: a package's wrapper library carries its own static copy of the
C++ runtime of the compiler that built it (``ldd`` lists no ``libstdc++``), and its
``std::regex`` (parsing the device string while the model is built) ended in SIGSEGV inside
``std::codecvt`` while the process's own C++ objects came from the shared ``libstdc++`` that
torch's libraries map: the two copies disagree on the locale facets. A process started with
the compiler's own ``libstdc++.so`` preloaded loads and runs the same package
(``benchmarks/notes/gpu_serving.md``, probe of 2026-11-29): preloaded, the shared library comes
first in the global symbol scope and interposes the wrapper's exported C++ runtime symbols, so
one copy serves both. Mapping the same file later (as torch's libraries do, outside the global
scope) does not, so the preload is needed even when that file is the compiler's.
``loader_environment`` gives that environment for a process that will load packages (it cannot
be changed in a running process); ``preloaded`` tells whether this process started with it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import torch


def load_package(path: str | Path, device_index: int | None = None):
    """``torch._inductor.aoti_load_package(path)`` without the CPU-ISA probe builds; returns
    the package's callable."""
    import torch._inductor

    kwargs = {} if device_index is None else {"device_index": device_index}
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        return torch._inductor.aoti_load_package(str(path), **kwargs)


def compiler_libstdcxx() -> Path | None:
    """The shared ``libstdc++`` of the C++ compiler Inductor builds packages with (``g++``, else
    ``c++``), resolved; None when there is no compiler or it names no such file."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return None
    try:
        found = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(found)
    return path.resolve() if path.is_absolute() and path.exists() else None


def loader_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for a child process that loads
    AOTInductor packages with ``load_package``: ``LD_PRELOAD`` starts with the compiler's
    ``libstdc++`` (see the module docstring); unchanged where no compiler is found."""
    env = dict(os.environ if base is None else base)
    library = compiler_libstdcxx()
    if library is None:
        return env
    preload = [str(library), *filter(None, env.get("LD_PRELOAD", "").split(":"))]
    env["LD_PRELOAD"] = ":".join(dict.fromkeys(preload))
    return env


def preloaded(env: dict[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's environment) already holds what
    ``loader_environment`` adds: nothing to restart a process for."""
    env = dict(os.environ if env is None else env)
    return loader_environment(env) == env
