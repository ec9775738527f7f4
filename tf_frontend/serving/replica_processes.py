"""The serving processes behind ``xgr serve --replicas N``: one ``xgr serve`` child per
replica on loopback ports the OS picks, each on its own GPU (``CUDA_VISIBLE_DEVICES`` set to
one device, so an engine package compiled for ``cuda:0`` runs there: the device is chosen at
load time, not at export), with NVLink multicast off in their environment
(``xgr_common.multi_gpu``), stopped with SIGTERM when the front stops."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Sequence

from xgr_common.errors import ConfigError, require
from xgr_common.multi_gpu import without_multicast


@dataclass
class ReplicaProcess:
    name: str
    process: subprocess.Popen
    grpc_port: int
    rest_port: int


# Flags the front keeps for itself: the children listen on loopback ports of their own.
FRONT_FLAGS = ("--replicas", "--replica_devices", "--port", "--rest_api_port",
               "--bind_address", "--ssl_config_file")


def child_argv(argv: Sequence[str]) -> list[str]:
    """``xgr serve``'s arguments for a replica: the front's, less the front's own flags, on
    loopback ports the OS picks."""
    kept = [arg for arg in argv if not any(arg == flag or arg.startswith(flag + "=")
                                           for flag in FRONT_FLAGS)]
    return [*kept, "--port=0", "--rest_api_port=0", "--bind_address=127.0.0.1"]


def start_replicas(argv: Sequence[str], count: int, devices: Sequence[str],
                   log_dir: str | None = None, timeout_seconds: float = 1800.0
                   ) -> list[ReplicaProcess]:
    """``count`` replicas of ``xgr serve`` (``argv``: its arguments after ``serve``), replica
    i on ``devices[i]`` when devices are named (none: the host's defaults, e.g. the CPU).
    Returns once each prints its ports (its newest version loaded); a replica that exits
    first fails the start with its last words."""
    require(count >= 2, ConfigError, f"--replicas must be >= 2 to put a front before them, "
                                     f"got {count}")
    require(not devices or len(devices) == count, ConfigError,
            f"--replica_devices names {len(devices)} devices for {count} replicas")
    started: list[ReplicaProcess] = []
    try:
        pending = []
        for i in range(count):
            env = without_multicast()
            if devices:
                env["CUDA_VISIBLE_DEVICES"] = str(devices[i])
            err = (open(os.path.join(log_dir, f"replica_{i}.log"), "w") if log_dir
                   else subprocess.DEVNULL)
            process = subprocess.Popen(
                [sys.executable, "-m", "xgr_cli.main", "serve", *child_argv(argv)],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            if log_dir:
                err.close()
            pending.append((f"r{i}", process))
        for name, process in pending:
            line = _first_line(process, timeout_seconds)
            if "rest port" not in line:
                raise ConfigError(f"replica {name} did not start: "
                                  f"{line.strip() or 'it exited with ' + str(process.poll())}")
            words = line.replace(",", "").split()
            started.append(ReplicaProcess(name, process, int(words[words.index("grpc") + 2]),
                                          int(words[words.index("rest") + 2])))
            # Keep draining what it prints, so it never blocks on a full pipe.
            threading.Thread(target=process.stdout.read, daemon=True).start()
    except BaseException:
        for _, process in pending:
            process.kill()
        raise
    return started


def _first_line(process: subprocess.Popen, timeout_seconds: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(process.stdout.readline()),
                              daemon=True)
    reader.start()
    reader.join(timeout_seconds)
    return box[0] if box else ""


def stop_replicas(replicas: Sequence[ReplicaProcess], grace_seconds: float) -> list[int]:
    """SIGTERM to each (their own graceful stop), then their exit codes; one still running
    a while after is killed (-9)."""
    for replica in replicas:
        replica.process.terminate()
    codes = []
    for replica in replicas:
        try:
            codes.append(replica.process.wait(timeout=grace_seconds + 15))
        except subprocess.TimeoutExpired:
            replica.process.kill()
            codes.append(-9)
    return codes
