"""One private temporary folder per server process, and the folders of dead servers removed.

AOTInductor unpacks every engine package it loads into the temporary directory (megabytes to
gigabytes: the kernels and the weights). TorchCall removes those folders when its process
exits, but a process killed with SIGKILL, or one that aborted, cannot, and an afternoon of
restarts fills the disk. So ``xgr serve`` points ``TMPDIR`` at its own
``<tmp>/xgr-serve-<pid>-<start time>`` before any package loads, and at start removes every
such folder whose process no longer runs (the start time tells a live process from a later
one that reuses its pid).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "xgr-serve-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)")


def process_start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat``
    field 22), or None when no such process runs."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def remove_stale(root: str | os.PathLike) -> list[Path]:
    """Removes the scratch folders under ``root`` of server processes that are gone; returns
    them. Does nothing where processes cannot be told apart (no ``/proc``)."""
    if process_start_time(os.getpid()) is None:
        return []
    removed = []
    for entry in sorted(Path(root).glob(PREFIX + "*")):
        match = _NAME.fullmatch(entry.name)
        if match is None or not entry.is_dir() or entry.is_symlink():
            continue
        if process_start_time(int(match.group(1))) == match.group(2):
            continue   # that server still runs
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    return removed


def claim_scratch_folder(root: str | os.PathLike | None = None) -> tuple[Path, list[Path]]:
    """Removes dead servers' folders under ``root`` (default: the temporary directory), makes
    this process's own (mode 0700) and makes it the temporary directory of this process and
    its libraries (``TMPDIR``, Python's ``tempfile``). Returns (the folder, the removed ones)."""
    root = Path(root if root is not None else tempfile.gettempdir())
    removed = remove_stale(root)
    started = process_start_time(os.getpid()) or "0"
    mine = root / f"{PREFIX}{os.getpid()}-{started}"
    mine.mkdir(mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = str(mine)      # read by torch's package loader and TF at use
    tempfile.tempdir = str(mine)
    return mine, removed
