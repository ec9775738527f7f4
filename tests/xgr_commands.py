"""Runs a sequence of ``xgr`` commands of one subcommand in one fresh process, as a user would.

Each subcommand defines its own absl flags and subcommands share flag names, so every
subcommand runs in its own process, never inside pytest's. One helper process runs the
commands in turn (importing TF or torch once), with the flags restored between them
(``flagsaver``), and reports each command's exit status and output back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = """
import contextlib, importlib, io, json, sys
from absl.testing import flagsaver
from absl import app  # noqa: F401  (absl.app and the subcommand define flags once,
from xgr_cli.main import SUBCOMMANDS, run  # outside flagsaver, which would drop them)
commands = json.loads(sys.argv[1])
importlib.import_module(SUBCOMMANDS[commands[0][0]][0])
results = []
for args in commands:
    out, err = io.StringIO(), io.StringIO()
    with flagsaver.flagsaver(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run(["xgr", *args])
            code = 0
        except SystemExit as stop:
            code = stop.code or 0
    results.append([code, out.getvalue(), err.getvalue()])
print("RESULTS" + json.dumps(results))
"""


def run_commands(commands: list[list[str]], env: dict, timeout: int = 300
                 ) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of each command (``["migrate", "init", ...]``), run in
    order in one fresh process at the repository root with ``env``."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
    marker = proc.stdout.rfind("RESULTS")
    assert marker >= 0, proc.stderr[-3000:]
    return [tuple(result) for result in json.loads(proc.stdout[marker + len("RESULTS"):])]
