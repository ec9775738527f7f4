"""Version pick-up without dropped requests, warm-up records, graceful stop, and `xgr serve`."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tf_frontend.serving.config import BatchingConfig, ServerConfig
from xgr_common.errors import ConfigError
from tests.serving.helpers import (columnar, history_reference, http, random_request,
                                   save_history_model, start_server, wait_for_pending,
                                   write_warmup)

# Heavy (`xgr serve` in a subprocess): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

PREDICT = "/v1/models/recs:predict"


def _wait_for(condition, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _states(port):
    _, body = http(port, "/v1/models/recs")
    return {int(v["version"]): v["state"] for v in body["model_version_status"]}


def test_new_version_is_picked_up_without_dropping_requests(model_base, tmp_path):
    base = tmp_path / "recs"
    shutil.copytree(os.path.join(model_base, "1"), base / "1")
    server = start_server(str(base), file_system_poll_wait_seconds=0.2,
                          batching=BatchingConfig(max_batch_size=8, batch_timeout_micros=2000))
    failures, answered_by, stop = [], [], threading.Event()
    request = random_request(np.random.default_rng(20), rows=2)
    by_scale = {s: history_reference(s, **request)["score"] for s in (1.0, 2.0)}

    def client():
        while not stop.is_set():
            status, body = http(server.rest_port, PREDICT, {"inputs": columnar(request)})
            if status != 200:
                failures.append(body)
                continue
            score = np.asarray(body["outputs"]["score"], np.float32)
            match = [s for s, ref in by_scale.items() if np.allclose(score, ref, rtol=1e-6)]
            answered_by.append(match[0] if match else None)

    clients = [threading.Thread(target=client) for _ in range(3)]
    try:
        for c in clients:
            c.start()
        staging = tmp_path / "staging"
        save_history_model(str(staging), 2.0)
        os.rename(staging, base / "2")  # appears complete, as a copy-then-rename deploy does
        _wait_for(lambda: _states(server.rest_port) == {2: "AVAILABLE", 1: "END"})
        count = len(answered_by)
        _wait_for(lambda: len(answered_by) > count + 3)
    finally:
        stop.set()
        for c in clients:
            c.join()
        server.stop()
    assert not failures
    assert None not in answered_by
    assert answered_by[0] == 1.0 and answered_by[-1] == 2.0
    first_new = answered_by.index(2.0)
    assert set(answered_by[first_new:]) == {2.0}


def test_an_empty_base_path_serves_once_a_version_appears(model_base, tmp_path):
    base = tmp_path / "recs"
    base.mkdir()
    (base / "not_a_version").mkdir()
    server = start_server(str(base), file_system_poll_wait_seconds=0.2)
    try:
        assert http(server.rest_port, "/healthz") == (503, {"status": "NOT_SERVING"})
        status, body = http(server.rest_port, "/v1/models/recs")
        assert status == 404 and "no version of model 'recs'" in body["error"]
        status, body = http(server.rest_port, PREDICT, {"inputs": {}})
        assert status == 404 and "no available version" in body["error"]
        shutil.copytree(os.path.join(model_base, "1"), tmp_path / "staging")
        os.rename(tmp_path / "staging", base / "3")
        _wait_for(lambda: http(server.rest_port, "/healthz")[0] == 200)
        assert _states(server.rest_port) == {3: "AVAILABLE"}
    finally:
        server.stop()


def test_warmup_runs_and_a_failing_warmup_fails_only_that_version(model_base, tmp_path):
    base = tmp_path / "recs"
    shutil.copytree(os.path.join(model_base, "1"), base / "1")
    rng = np.random.default_rng(21)
    write_warmup(base / "1", [random_request(rng, 2), random_request(rng, 1)])
    server = start_server(str(base), file_system_poll_wait_seconds=0.2)
    try:
        labels = {"model_name": "recs"}
        assert server.metrics.registry.get_sample_value("xgr_serving_batch_size_count", labels) == 2
        shutil.copytree(os.path.join(model_base, "1"), tmp_path / "staging")
        broken = random_request(rng, 1)
        broken["history_items"] = -np.ones(len(broken["history_items"]) or 1, np.int64)
        broken["history_times"] = np.zeros(len(broken["history_items"]), np.int64)
        broken["history_splits"] = np.array([0, len(broken["history_items"])], np.int64)
        write_warmup(tmp_path / "staging", [broken])
        os.rename(tmp_path / "staging", base / "2")
        _wait_for(lambda: _states(server.rest_port).get(2) == "END")
        _, body = http(server.rest_port, "/v1/models/recs/versions/2")
        status = body["model_version_status"][0]["status"]
        assert status["error_code"] == "UNKNOWN" and "warm-up request 0 failed" in status["error_message"]
        code, answer = http(server.rest_port, PREDICT, {"inputs": columnar(random_request(rng, 1))})
        assert code == 200 and _states(server.rest_port)[1] == "AVAILABLE"
    finally:
        server.stop()


def test_stop_finishes_in_flight_requests_then_refuses(model_base):
    server = start_server(model_base, file_system_poll_wait_seconds=0,
                          batching=BatchingConfig(max_batch_size=64, batch_timeout_micros=1_500_000))
    request = random_request(np.random.default_rng(22), rows=2)
    result = {}
    waiting = threading.Thread(target=lambda: result.update(
        answer=http(server.rest_port, PREDICT, {"inputs": columnar(request)})))
    waiting.start()
    wait_for_pending(server, 1)   # the request waits in the batch queue (1.5 s timeout)
    server.stop()
    waiting.join()
    status, body = result["answer"]
    assert status == 200
    np.testing.assert_allclose(body["outputs"]["score"], history_reference(1.0, **request)["score"],
                               rtol=1e-6)
    with pytest.raises(OSError):
        http(server.rest_port, "/healthz")


def test_xgr_serve_subprocess_json_logs_and_sigterm(model_base, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 4 }\nbatch_timeout_micros { value: 1000 }\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "xgr_cli.main", "serve", "--model_name=recs",
         f"--model_base_path={model_base}", "--port=0", "--rest_api_port=0",
         "--bind_address=127.0.0.1", "--enable_batching", f"--batching_parameters_file={batching}",
         "--max_history_events=3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        line = process.stdout.readline()
        assert "rest port" in line, process.stderr.read()
        rest_port = int(line.rsplit(" ", 1)[1])
        request = random_request(np.random.default_rng(23), rows=2, max_events=3)
        status, body = http(rest_port, PREDICT, {"inputs": columnar(request)})
        assert status == 200, body
        too_long = dict(columnar(request), history_items=[1] * 4, history_times=[0] * 4,
                        history_splits=[0, 4, 4])
        status, body = http(rest_port, PREDICT, {"inputs": too_long})
        assert status == 400 and "maximum history length is 3" in body["error"]
        five_rows = random_request(np.random.default_rng(24), rows=5, max_events=1)
        status, body = http(rest_port, PREDICT, {"inputs": columnar(five_rows)})
        assert status == 400 and "larger than max_batch_size 4" in body["error"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    logs = [json.loads(x) for x in process.stderr.read().splitlines() if x.startswith("{")]
    messages = [entry["message"] for entry in logs]
    assert "model version available" in messages and messages[-1] == "stopped"
    available = logs[messages.index("model version available")]
    assert available["version"] == 1 and available["level"] == "INFO"


def test_xgr_serve_refuses_a_bad_batching_file_with_a_message(model_base, tmp_path):
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch { value: 3 }\n")
    done = subprocess.run(
        [sys.executable, "-m", "xgr_cli.main", "serve", f"--model_base_path={model_base}",
         "--enable_batching", f"--batching_parameters_file={batching}"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 1
    assert "batching parameters: unknown field 'max_batch'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("field", ["file_system_poll_wait_seconds", "shutdown_grace_seconds",
                                   "rest_api_read_timeout_seconds",
                                   "rest_api_idle_timeout_seconds"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0])
def test_a_wait_of_the_server_must_be_a_finite_number(field, value):
    """An endless wait would overflow the timers it reaches (threads, asyncio, gRPC) only at
    shutdown or on the first poll; the config refuses it when the server starts."""
    with pytest.raises(ConfigError, match=f"{field} must be a finite number"):
        ServerConfig(model_name="recs", model_base_path="/models/recs", **{field: value})


@pytest.mark.parametrize("flag", ["--prompt_cache_gb=-1", "--prompt_cache_host_gb=-0.5",
                                  "--prompt_cache_host_gb=nan", "--prompt_cache_gb=inf"])
def test_xgr_serve_refuses_a_negative_or_endless_prompt_cache_size(model_base, flag):
    done = subprocess.run(
        [sys.executable, "-m", "xgr_cli.main", "serve", f"--model_base_path={model_base}",
         flag], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 1
    assert f"{flag.split('=')[0]} must be a finite number >= 0" in done.stderr
    assert "Traceback" not in done.stderr
