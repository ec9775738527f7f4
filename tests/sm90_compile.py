"""Compiling Triton kernels for sm_90 without a GPU, in a child process (Triton's own ptxas),
and reading their resource usage: the CPU tests' check that a kernel compiles for the H200 and
keeps its registers (no spills to local memory).

The compile runs in a fresh process because the interpreter, which the CPU tests run under,
replaces every jit function of the process that imports it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.child_env import ROOT, child_env

# The start of every compile script: the imports (or "SKIP" when this Triton has no CUDA
# backend), ``TARGET`` and ``usage(kernel)``, the cubin's resource line from cuobjdump.
PRELUDE = """
import pathlib, subprocess, sys, tempfile
import triton
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
except ImportError as error:
    print("SKIP", error); sys.exit(0)
TARGET = GPUTarget("cuda", 90, 32)
cuobjdump = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"


def usage(kernel):
    if not cuobjdump.exists():
        return "no cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        dump = subprocess.run([str(cuobjdump), "--dump-resource-usage", cubin.name],
                              capture_output=True, text=True).stdout
    return next(line.strip() for line in dump.splitlines() if "REG:" in line)
"""


def compiled_lines(script: str, expected: int) -> list[str]:
    """Runs ``PRELUDE + script`` in a child process and returns its ``COMPILED ...`` lines
    (``expected`` of them). Skips where a GPU is present (the gpu tests compile for it) or
    where this Triton cannot compile for CUDA."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the gpu tests compile the kernel for it")
    env = child_env(TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, "-c", PRELUDE + script], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    if done.stdout.startswith("SKIP"):
        pytest.skip(f"the CUDA backend of Triton cannot compile here: {done.stdout.strip()}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("COMPILED")]
    assert len(lines) == expected, done.stdout
    print("\n".join(lines))
    return lines


def assert_no_spills(lines: list[str]) -> None:
    """Each resource line ("REG:n STACK:0 ... LOCAL:0") shows no spill to local memory."""
    for line in lines:
        assert "no cuobjdump" in line or ("STACK:0" in line and "LOCAL:0" in line), line
