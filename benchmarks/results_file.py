"""The one way a benchmark names and writes its result file: ``<folder>/<prefix>_<date>[_<tag>].json``,
with the UTC time of the run in the result's ``date`` field."""

from __future__ import annotations

import datetime
import json
import os


def utc_now() -> str:
    """The run's time for a result's ``date`` field (UTC, to the second)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_result(folder: str, prefix: str, result: dict, tag: str = "", indent: int = 1,
                 default=None) -> str:
    """Writes ``result`` as ``<folder>/<prefix>_<today>[_<tag>].json`` (the folder made when
    missing) and returns the path; ``default`` converts what JSON cannot hold."""
    os.makedirs(folder, exist_ok=True)
    suffix = f"_{tag}" if tag else ""
    path = os.path.join(folder, f"{prefix}_{datetime.date.today().isoformat()}{suffix}.json")
    with open(path, "w") as handle:
        json.dump(result, handle, indent=indent, default=default)
    return path
