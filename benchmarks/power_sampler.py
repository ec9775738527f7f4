"""The board's power draw, SM clock and throttle reasons while a block of work runs.

A search that keeps the tensor cores busy for tens of milliseconds runs into the board's power
limit, and the driver lowers the SM clock to hold it: a kernel then takes longer inside a long
graph than alone. ``PowerSampler`` reads ``nvidia-smi`` every 100 ms in a child process while
its block runs, so a benchmark row can say at what power and clock it was measured:

    with PowerSampler() as power:
        times = timed(work)
    row.update(power.summary())     # {} where nvidia-smi is not there

Throttle reasons are NVML's bit mask (``clocks_event_reasons.active``): 0x4 is the software
power cap, 0x1 idle.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess

QUERY = "clocks.sm,power.draw,power.limit,clocks_event_reasons.active"
POWER_CAP_BIT = 0x4


class PowerSampler:
    """Context manager sampling the first GPU while the block runs; ``summary()`` afterwards."""

    def __init__(self, period_ms: int = 100) -> None:
        self.period_ms = period_ms
        self.samples: list[tuple[float, float, float, int]] = []
        self._child: subprocess.Popen | None = None

    def __enter__(self) -> "PowerSampler":
        tool = shutil.which("nvidia-smi")
        if tool:
            self._child = subprocess.Popen(
                [tool, "-i", "0", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                 f"-lms={self.period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._child is None:
            return
        self._child.terminate()
        out, _ = self._child.communicate(timeout=10)
        for line in out.splitlines():
            self.samples.extend(_parse(line))

    def summary(self) -> dict[str, float]:
        """Medians of the busy samples (SM clock above idle) and the share of them with the
        power cap active; {} without samples."""
        busy = [s for s in self.samples if not (s[3] & 0x1)] or self.samples
        if not busy:
            return {}
        return {"sm_clock_mhz": statistics.median(s[0] for s in busy),
                "power_w": statistics.median(s[1] for s in busy),
                "power_limit_w": busy[0][2],
                "power_capped_share": sum(bool(s[3] & POWER_CAP_BIT) for s in busy) / len(busy),
                "power_samples": len(busy)}


def _parse(line: str) -> list[tuple[float, float, float, int]]:
    """One ``nvidia-smi`` CSV line -> [(clock MHz, power W, limit W, reasons)], or [] when a
    field is missing ("[N/A]")."""
    fields = [f.strip() for f in line.split(",")]
    try:
        return [(float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3], 16))]
    except (IndexError, ValueError):
        return []
