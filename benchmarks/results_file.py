"""The one way a benchmark names and writes its result file:
``<folder>/<prefix>_<date>[_<tag>].json``,
with the UTC time of the run in the result's ``date`` field and the run's provenance beside it:
``commit`` (and ``dirty``), ``machine`` and ``versions``.

The commit comes from the ``XGR_COMMIT`` environment variable when it is set (a copy of the
tree on another machine says what it is a copy of: its ``.git``, if any, may be stale), else
from git when the tree is a checkout, else ``"unknown"``.

    python -m benchmarks.results_file FILE.json   # stamps a JSON written elsewhere (xgr export)
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMIT_VARIABLE = "XGR_COMMIT"
# Distributions whose versions a result records, when installed (read from their metadata, so
# nothing is imported: triton must not be imported after tensorflow).
LIBRARIES = ("torch", "triton", "transformers", "tensorflow", "tensorflow-cpu", "numpy")


def utc_now() -> str:
    """The run's time for a result's ``date`` field (UTC, to the second)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _git(root: Path, *args: str) -> str | None:
    """``git args`` in ``root``: its stdout, or None where git cannot answer."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit(root: Path = ROOT) -> dict:
    """``{"commit": sha or "unknown", "dirty": bool or None}``. ``dirty``: tracked files differ
    from the commit (untracked ones, such as fresh result files, do not count); None where
    git cannot tell."""
    named = os.environ.get(COMMIT_VARIABLE)
    if named:
        return {"commit": named, "dirty": None}
    # A copy of the tree without its .git could sit inside another repository: ask git only
    # where this tree is itself a checkout (.git is a folder, or a file in a worktree).
    if (root / ".git").exists():
        sha = _git(root, "rev-parse", "HEAD")
        if sha:
            status = _git(root, "status", "--porcelain", "--untracked-files=no")
            return {"commit": sha, "dirty": None if status is None else bool(status)}
    return {"commit": "unknown", "dirty": None}


def _cpu_name() -> str:
    """The CPU's model name and core count, e.g. ``"AMD EPYC 9454 (16 cores)"``."""
    name = ""
    try:
        with open("/proc/cpuinfo") as handle:
            name = next((line.split(":", 1)[1].strip() for line in handle
                         if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{name or platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def machine() -> str:
    """The GPU's name where torch sees CUDA, else the CPU's."""
    if importlib.util.find_spec("torch") is not None:
        import torch  # torch loads no triton on import, so this is safe after tensorflow

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    return _cpu_name()


def versions() -> dict:
    """Python's version and each installed library's of ``LIBRARIES``."""
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def provenance() -> dict:
    """What a result records about its run: commit, dirty, machine, versions."""
    return {**commit(), "machine": machine(), "versions": versions()}


def stamped(result: dict) -> dict:
    """``result`` with the provenance fields first. A ``machine`` or ``versions`` the result
    already holds is kept (the benchmark knows more, e.g. cuDNN's version); a benchmark never
    writes ``commit`` itself."""
    if "commit" in result or "dirty" in result:
        raise ValueError("results_file: the writer records `commit` and `dirty`; the result "
                         "passed in already has them")
    found = provenance()
    found["versions"] = {**found["versions"], **result.get("versions", {})}
    if "machine" in result:
        found["machine"] = result["machine"]
    return {**found, **{k: v for k, v in result.items() if k not in found}}


def result_path(folder: str | os.PathLike, prefix: str, tag: str = "",
                stamp: str | None = None) -> Path:
    """``<folder>/<prefix>_<stamp>[_<tag>].json``; ``stamp`` defaults to today's date."""
    suffix = f"_{tag}" if tag else ""
    return Path(folder) / f"{prefix}_{stamp or datetime.date.today().isoformat()}{suffix}.json"


def write_json(path: str | os.PathLike, result: dict, indent: int = 1, default=None) -> str:
    """Writes ``result`` with its provenance to ``path`` (folders made when missing) and
    returns the path; ``default`` converts what JSON cannot hold."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped(result), indent=indent, default=default) + "\n")
    return str(path)


def write_result(folder: str | os.PathLike, prefix: str, result: dict, tag: str = "",
                 indent: int = 1, default=None) -> str:
    """Writes ``result`` as ``<folder>/<prefix>_<today>[_<tag>].json`` and returns the path."""
    return write_json(result_path(folder, prefix, tag), result, indent, default)


def stamp_file(path: str | os.PathLike) -> str:
    """Adds the provenance fields to a JSON result another program wrote (in place)."""
    return write_json(path, json.loads(Path(path).read_text()), indent=2)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m benchmarks.results_file FILE.json [FILE.json ...]")
    for name in sys.argv[1:]:
        print("stamped", stamp_file(name))
