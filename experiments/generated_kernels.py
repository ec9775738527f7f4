"""What a slow kernel is, for probes that compare a compiled package with the engine.

Two questions the profiler's per-name times leave open:

* **How was it launched?** ``kernel_launches`` reads the profiler's trace for each kernel's
  launches, grid, block (threads: 32 x num_warps), registers per thread and shared memory.
  The same Triton kernel launched by the engine and by an AOTInductor package may differ in
  its launch, which a name alone never shows.
* **What does Inductor's generated kernel do?** Its names (``triton_poi_fused_34``) carry no
  op names when its origins have none. ``generated_origins`` looks each name up in the
  sources Inductor wrote under its cache folder (``TORCHINDUCTOR_CACHE_DIR`` during the
  export): the source nodes and ATen ops it came from, the arguments it writes, and its
  element count, enough to tell a whole-buffer copy from a slice.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

_LAUNCH_KEYS = {"grid": "grid", "block": "block", "registers per thread": "registers",
                "shared memory": "shared_memory"}


def kernel_launches(call: Callable[[], object], calls: int = 2) -> dict[str, dict]:
    """Per kernel name: launches a call, microseconds a call, and the first launch's grid,
    block, registers per thread and shared memory bytes (the GPU's kernels only; empty on a
    host without one). ``call`` runs once unprofiled first."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    out: dict[str, dict] = {}
    for event in events:
        if event.get("cat") != "kernel":
            continue
        name, args = event.get("name", "?"), event.get("args", {})
        entry = out.setdefault(name, {"launches": 0, "us": 0.0, **{
            short: args.get(key) for key, short in _LAUNCH_KEYS.items()}})
        entry["launches"] += 1
        entry["us"] += float(event.get("dur", 0.0))
    for entry in out.values():
        entry["launches"] /= calls
        entry["us"] /= calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))


def generated_origins(cache_dir: str | os.PathLike, names: list[str]) -> dict[str, dict]:
    """For each kernel ``name`` found under ``cache_dir``: the file it sits in, its
    ``xnumel`` (elements it covers, when static) and size hints, the source-node and ATen
    comment lines Inductor wrote above it, the argument names it mutates, and for a user
    kernel its launch configs, argument attributes and argument types. Names not found
    are left out."""
    wanted = set(names)
    found: dict[str, dict] = {}
    for path in sorted(Path(cache_dir).rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name in wanted - found.keys():
            at = text.find(f"def {name}(")
            if at < 0:
                continue
            head = text[max(0, text.rfind("\n\n\n", 0, at)):at]
            end = text.find("\n\n\n", at)
            body = text[at:end if end > 0 else None]
            numel = re.search(r"xnumel\s*=\s*([^\n]+)", body)
            mutated = re.search(r"'mutated_arg_names':\s*(\[[^\]]*\])", head)
            hints = re.search(r"size_hints\s*=\s*(\{[^}]*\})", head)
            # A user kernel's launch settings and the argument attributes Inductor compiled
            # it with (16-byte divisibility decides vectorised loads).
            launch = re.search(r"configs\s*=\s*(\[[^\]]*\])", head)
            attributes = re.search(r"'configs':\s*(\[\{.*?\}\])", head, re.S)
            # The argument types (a Python float arrives as fp64, a dynamic size as i64).
            signature = re.search(r"'signature':\s*(\{[^}]*\})", head)
            found[name] = {
                "file": str(path.relative_to(cache_dir)),
                "xnumel": numel.group(1).strip() if numel else None,
                "origins": [line.strip() for line in head.splitlines()
                            if "Source node" in line or "Original ATen" in line
                            or "Topologically Sorted" in line][:8],
                "mutated": mutated.group(1) if mutated else None,
                "size_hints": hints.group(1) if hints else None,
                "launch_configs": launch.group(1)[:300] if launch else None,
                "arg_attributes": attributes.group(1)[:600] if attributes else None,
                "signature": signature.group(1)[:800] if signature else None,
            }
    return found


def wrapper_context(cache_dir: str | os.PathLike, names: list[str],
                    lines_before: int = 4) -> dict[str, list[str]]:
    """The comment lines above each ``name``'s first launch in the generated C++ wrapper
    (AOTInductor writes the source nodes of each launch there)."""
    out: dict[str, list[str]] = {}
    for path in sorted(Path(cache_dir).rglob("*.cpp")):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for index, line in enumerate(lines):
            for name in names:
                if name in out or f"{name}(" not in line or "void" in line:
                    continue
                context = [lines[i].strip() for i in range(max(0, index - lines_before), index)
                           if lines[i].strip().startswith("//")]
                out[name] = context + [line.strip()[:300]]
    return out


def jit_specializations(kernels: dict[str, object], limit: int = 400) -> dict[str, list[str]]:
    """The specialisations each Triton ``@jit`` kernel was compiled for in this process (its
    cache keys: argument types with their 16-byte divisibility marks, and the launch
    options), to set beside the package's ``arg_attributes``. Wrappers (autotuners,
    heuristics) are unwrapped to the ``@jit`` function."""
    out: dict[str, list[str]] = {}
    for name, kernel in kernels.items():
        while not hasattr(kernel, "device_caches") and hasattr(kernel, "fn"):
            kernel = kernel.fn
        keys: list[str] = []
        for entry in getattr(kernel, "device_caches", {}).values():
            keys += [str(key)[:limit] for key in entry[0]]
        out[name] = keys
    return out
