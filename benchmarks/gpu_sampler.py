"""GPU utilisation and memory over a benchmark's phases, sampled by ``nvidia-smi``.

``nvidia-smi --query-gpu ... -lms`` prints one line per period; a reader thread keeps
(time, utilisation %, memory MiB) per GPU. ``window(start, end)`` summarises the samples of a
phase (``time.monotonic()`` bounds). Without ``nvidia-smi`` (a CPU host) every window is
None, and the benchmark says so instead of printing a figure.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time


class GpuSampler:
    """Context manager: samples every ``period_ms`` while open."""

    def __init__(self, period_ms: int = 100, gpu: int = 0) -> None:
        self._period_ms, self._gpu = period_ms, gpu
        self._samples: list[tuple[float, float, float]] = []
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._process is not None

    def __enter__(self) -> "GpuSampler":
        if shutil.which("nvidia-smi"):
            self._process = subprocess.Popen(
                ["nvidia-smi", f"--id={self._gpu}", "--query-gpu=utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits", f"-lms={self._period_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                util, memory = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):   # "[N/A]" or a partial line
                continue
            with self._lock:
                self._samples.append((time.monotonic(), util, memory))

    def window(self, start: float, end: float) -> dict | None:
        """Mean and peak utilisation (%) and peak memory (MiB) of the samples in [start, end]."""
        if not self.available:
            return None
        with self._lock:
            inside = [s for s in self._samples if start <= s[0] <= end]
        if not inside:
            return None
        utils = [s[1] for s in inside]
        return {"samples": len(inside), "gpu_util_mean_pct": sum(utils) / len(utils),
                "gpu_util_max_pct": max(utils), "gpu_memory_max_mib": max(s[2] for s in inside)}

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
