"""``xgr serve`` as a child process for the serving benchmarks: started with batching on
loopback ports the OS picks, its JSON logs in a file, stopped with SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(**extra: str) -> dict[str, str]:
    """This environment for a child process that imports the checkout: ROOT first on
    ``PYTHONPATH``, whatever the caller had there kept after it (on a host whose TensorFlow
    lives in a folder of its own, the child must still find it); ``extra`` variables added."""
    path = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, PYTHONPATH=path, **extra)


def start_server(base: str, log_path: str, max_batch_size: int, batch_timeout_micros: int,
                 poll_seconds: float = 1.0, extra_flags: tuple[str, ...] = ()
                 ) -> tuple[subprocess.Popen, int, int]:
    """``xgr serve`` over ``base`` (with ``extra_flags``): (process, gRPC port, REST port).
    Its JSON logs go to ``log_path`` (the record of what a stop did), its stdout is drained
    so that nothing it prints can block it."""
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    print(f"server log: {log_path}")
    log = open(log_path, "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "xgr_cli.main", "serve", "--model_name=recs",
         f"--model_base_path={base}", "--port=0", "--rest_api_port=0",
         "--bind_address=127.0.0.1", "--enable_batching", "--log_level=INFO",
         f"--max_batch_size={max_batch_size}", f"--batch_timeout_micros={batch_timeout_micros}",
         "--num_batch_threads=2", f"--file_system_poll_wait_seconds={poll_seconds}",
         *extra_flags],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)
    log.close()   # the child holds its own descriptor
    line = process.stdout.readline()
    if "rest port" not in line:
        process.kill()
        raise RuntimeError(f"xgr serve did not start: {line!r}")
    threading.Thread(target=process.stdout.read, daemon=True).start()
    words = line.replace(",", "").split()
    return process, int(words[words.index("grpc") + 2]), int(words[words.index("rest") + 2])


def stop_server(process: subprocess.Popen, seconds: float = 60.0) -> int | str:
    """SIGTERM, then the exit code; a server still alive ``seconds`` later is killed and
    reported as such (the figures are kept either way)."""
    process.terminate()
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return f"still running {seconds:g} s after SIGTERM (killed)"
