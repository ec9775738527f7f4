"""One `xgr export --verify_requests` of the tiny engine per test session, for the tests that
need a real exported SavedModel and engine package (``tests/torch_call/test_export_engine.py``,
the fuzz suite's TorchCall surface). The serving example exports the same catalog, model and
sizes, so the package cache makes one of them reuse the other's compile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.child_env import ROOT, child_env

CACHE = ROOT / "build" / "serving_example_cache"
SEED, ITEMS, BEAMS, TOP_K, TOP_N, MAX_BATCH = 0, 300, 16, 10, 5, 64
VERIFIED = 4   # requests `xgr export --verify_requests` checks in a fresh process


def run_python(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    """``python ARGS`` in a child with this checkout importable; asserts it succeeded."""
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    return done


def served(saved_model: Path, features: dict, tmp_path: Path, name: str,
           signature: str) -> dict:
    """``signature``'s outputs on ``features`` from the SavedModel reloaded in a fresh process
    (``tests/torch_call/reload_child.py``: TF and custom_ops only); a refused request gives
    its message under ``error``."""
    import numpy as np

    arrays = {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v))
              for k, v in features.items()}
    arrays["country"] = arrays["country"].astype("S")
    np.savez(tmp_path / f"{name}.npz", **arrays)
    run_python([str(ROOT / "tests" / "torch_call" / "reload_child.py"), str(saved_model),
                str(tmp_path / f"{name}.npz"), str(tmp_path / f"{name}.out.npz"), signature],
               timeout=300)
    with np.load(tmp_path / f"{name}.out.npz", allow_pickle=True) as data:
        return {k: data[k] for k in data.files}


def export_tiny(folder: Path) -> tuple[Path, str, dict]:
    """(SavedModel folder, stdout, JSON report) of the export into ``folder``."""
    out, report = folder / "pipeline", folder / "report.json"
    done = run_python(["-m", "xgr_cli.main", "export", f"--out={out}", f"--seed={SEED}",
                       f"--num_items={ITEMS}", f"--beam_width={BEAMS}", f"--top_k={TOP_K}",
                       f"--top_n={TOP_N}", f"--max_batch={MAX_BATCH}", f"--cache_dir={CACHE}",
                       f"--verify_requests={VERIFIED}", f"--report_json={report}"], timeout=900)
    return out, done.stdout, json.loads(report.read_text())
