"""The REST port under clients that misbehave at the connection level, over raw sockets: slow
headers, slow bodies, idle keep-alive connections, too many connections, oversized and
chunked bodies. None of them costs the server a thread, and each is closed or answered within
its timeout while well-behaved clients keep being served."""

import http.client as http_client
import json
import socket
import threading
import time

import numpy as np
import pytest

from tests.serving.helpers import columnar, http, random_request, start_server

READ_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTIONS = 0.5, 1.0, 320
PREDICT = "/v1/models/recs:predict"


@pytest.fixture(scope="module")
def server(model_base):
    running = start_server(model_base, file_system_poll_wait_seconds=0,
                           rest_api_read_timeout_seconds=READ_TIMEOUT,
                           rest_api_idle_timeout_seconds=IDLE_TIMEOUT,
                           rest_api_max_connections=MAX_CONNECTIONS, max_request_bytes=64 * 1024)
    yield running
    running.stop()


def _body() -> bytes:
    return json.dumps({"inputs": columnar(random_request(np.random.default_rng(40), 2))}).encode()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_all(sock: socket.socket, limit: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started, chunks = time.monotonic(), []
    sock.settimeout(limit)
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks), time.monotonic() - started
        chunks.append(chunk)


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_slow_headers_get_408_and_are_closed_within_the_read_timeout(server):
    sock = _connect(server.rest_port)
    sock.sendall(b"POST /v1/models/recs:predict HTTP/1.1\r\nHost: x\r\n")   # never finished
    answer, waited = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert READ_TIMEOUT * 0.8 <= waited <= READ_TIMEOUT + 1.0


def test_a_body_sent_too_slowly_gets_408_with_a_request_id(server):
    sock = _connect(server.rest_port)
    sock.sendall(b"POST /v1/models/recs:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                 b"Content-Type: application/json\r\n\r\n{\"inputs\"")
    answer, waited = _read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"X-Request-Id" in head, answer
    assert json.loads(body)["request_id"] and waited <= READ_TIMEOUT + 1.0


def test_keep_alive_serves_several_requests_then_idles_out(server):
    connection = http_client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
    for _ in range(3):
        connection.request("POST", PREDICT, _body(), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("X-Request-Id")
        response.read()
    sock = connection.sock
    answer, waited = _read_all(sock)
    assert answer == b"" and waited <= IDLE_TIMEOUT + 1.5   # closed by the server, idle


def test_300_slow_header_connections_hold_no_threads_and_others_are_served(server):
    threads_before = threading.active_count()
    slow = [_connect(server.rest_port) for _ in range(300)]
    for sock in slow:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost")
    _wait_for(lambda: server._rest.open_connections >= 300, 5)
    assert threading.active_count() - threads_before <= 2   # no thread per connection
    status, body = http(server.rest_port, "/healthz")         # a client arriving meanwhile
    assert status == 200 and body == {"status": "SERVING"}
    closed = 0
    for sock in slow:
        answer, _ = _read_all(sock, limit=5)
        closed += answer.startswith(b"HTTP/1.1 408")
        sock.close()
    assert closed == 300
    _wait_for(lambda: server._rest.open_connections == 0, 5)


def test_connections_beyond_the_limit_are_answered_503(server):
    held = [_connect(server.rest_port) for _ in range(MAX_CONNECTIONS)]
    try:
        _wait_for(lambda: server._rest.open_connections >= MAX_CONNECTIONS, 5)
        extra = _connect(server.rest_port)
        answer, _ = _read_all(extra, limit=5)
        assert answer.startswith(b"HTTP/1.1 503") and b"too many open connections" in answer
    finally:
        for sock in held:
            sock.close()
    _wait_for(lambda: server._rest.open_connections == 0, 5)
    assert http(server.rest_port, "/healthz")[0] == 200


def test_oversized_chunked_bodies_are_refused_without_reading_them_whole(server):
    connection = http_client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
    chunks = (b"[" + b"1," * 4000 + b"1]" for _ in range(20))   # ~160 KB over the 64 KB limit
    connection.request("POST", PREDICT, chunks, {"Content-Type": "application/json"},
                       encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 400
    assert "exceeds max_request_bytes" in json.loads(response.read())["error"]


def test_the_query_string_is_not_part_of_the_model_name(server):
    status, body = http(server.rest_port, PREDICT + "?debug=1", raw=_body(), method="POST")
    assert status == 200, body


def test_a_taken_port_is_a_config_error_not_a_half_started_server(model_base):
    from tf_frontend.serving.config import ServerConfig
    from tf_frontend.serving.server import ModelServer
    from xgr_common.errors import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for ports, which in (({"port": 0, "rest_api_port": port}, "REST"),
                             ({"port": port, "rest_api_port": 0}, "gRPC")):
            server = ModelServer(ServerConfig(model_name="recs", model_base_path=model_base,
                                              file_system_poll_wait_seconds=0, **ports))
            with pytest.raises(ConfigError, match=f"cannot bind the {which} port"):
                server.start()
            assert not server.manager.healthy()   # what it had loaded is unloaded again
