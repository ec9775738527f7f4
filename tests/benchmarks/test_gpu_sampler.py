"""GpuSampler reads ``nvidia-smi``'s periodic lines into per-phase figures, skips the lines it
cannot parse, and gives None where the tool is missing (no figure rather than a made-up one)."""

import os
import time

from benchmarks.gpu_sampler import GpuSampler

FAKE = """#!/bin/sh
# A stand-in for nvidia-smi: utilisation 20 then 60, one unparsable line, memory rising.
echo "20, 1000"
echo "[N/A], [N/A]"
sleep 0.3
echo "60, 3000"
sleep 30
"""


def test_windows_summarise_the_samples_inside_them(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(FAKE)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    began = time.monotonic()
    with GpuSampler(period_ms=100) as gpu:
        assert gpu.available
        time.sleep(1.0)
        whole = gpu.window(began, time.monotonic())
        assert gpu.window(began - 10, began - 5) is None   # no sample in that phase
    assert whole == {"samples": 2, "gpu_util_mean_pct": 40.0, "gpu_util_max_pct": 60.0,
                     "gpu_memory_max_mib": 3000.0}


def test_without_nvidia_smi_every_window_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with GpuSampler() as gpu:
        assert not gpu.available and gpu.window(0, time.monotonic()) is None
