"""The environment of a child Python process that imports this repository's packages."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(*extra_paths: str | os.PathLike, **variables: str) -> dict[str, str]:
    """This process's environment plus ``variables``, with ``PYTHONPATH`` holding
    ``extra_paths`` (in that order, first), the repository root, then the inherited
    ``PYTHONPATH``: the child imports this checkout wherever it starts, and the given folders
    ahead of it."""
    if "PYTHONPATH" in variables:
        raise ValueError("child_env: pass the folders to import from as positional arguments "
                         "(they go ahead of the repository root), not as PYTHONPATH=")
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    path = os.pathsep.join([*map(str, extra_paths), str(ROOT), *inherited])
    return {**os.environ, **variables, "PYTHONPATH": path}
