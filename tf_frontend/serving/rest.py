"""TF Serving's REST API on aiohttp's HTTP server, in one event-loop thread.

Routes::

    GET  /v1/models/NAME[/versions/N]            model version status
    GET  /v1/models/NAME[/versions/N]/metadata   signature defs
    POST /v1/models/NAME[/versions/N]:predict    row ("instances") or columnar ("inputs")
    GET  /monitoring/prometheus/metrics          Prometheus exposition
    GET  /healthz                                200 while a version is AVAILABLE, else 503

Errors answer ``{"error": "...", "request_id": "..."}`` with 400 (the caller's mistake), 404
(unknown model, version or path), 408 (request sent too slowly), 503 (queue full, no version
loads), 504 (the REST timeout passed) or 500 (the model or the server failed; the log has the
detail under the request id). Every response carries ``X-Request-Id`` (the client's own when it
sent a plain one).

Connections cost no thread: one event loop reads every socket, and only request bodies are
decoded and unbatched model calls run on a bounded pool (``rest_api_num_threads``); a batched
request waits for its batch on the loop. Connections are bounded: a client has
``rest_api_read_timeout_seconds`` from a request's first byte to send its headers and body
(408 or closed otherwise), an idle keep-alive connection is closed after
``rest_api_idle_timeout_seconds``, and a connection beyond ``rest_api_max_connections`` is
answered 503 and closed. A stop closes the port and idle connections at once, lets requests
already read finish within the grace, then cancels the rest.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import ssl
import threading
import time
from typing import Any

from aiohttp import web, web_protocol, web_server
from aiohttp.web_request import BaseRequest

from xgr_common.errors import (DeadlineExceededError, InvalidInputError, NotFoundError,
                               SlowClientError, require)
from xgr_common.serving_names import USER_KEY_HEADER
from tf_frontend.serving import status_codes
from tf_frontend.serving.config import ServerConfig
from tf_frontend.serving.json_codec import decode_request, encode_response
from tf_frontend.serving.metadata import metadata_json, status_json
from tf_frontend.serving.metrics import ServerMetrics
from tf_frontend.serving.model_manager import ModelManager
from tf_frontend.serving.public_text import full_detail
from tf_frontend.serving.servable import ServableVersion

LOG = logging.getLogger("xgr.serving")
_MODEL_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d{1,18}))?(?:(/metadata)|:(\w+))?$")
_JSON = "application/json"


class _Connection(web_protocol.RequestHandler):
    """aiohttp's connection handler with a read timeout: from the first byte of a request,
    its headers must arrive within ``read_timeout`` (else 408 and close), and its body by the
    same deadline (``read_deadline``, enforced where the body is read).

    aiohttp 3.14's own keep-alive timer only watches idle connections; the hooks used here
    (``_messages``, ``_request_in_progress``) are that version's (pinned in requirements)."""

    __slots__ = ("_read_timeout", "_read_timer", "read_deadline")

    def __init__(self, manager: web_server.Server, *, read_timeout: float, **kwargs):
        super().__init__(manager, **kwargs)
        self._read_timeout = read_timeout
        self._read_timer: asyncio.TimerHandle | None = None
        self.read_deadline = 0.0

    def data_received(self, data: bytes) -> None:
        starts_request = (self._read_timer is None and not self._request_in_progress
                          and not self._messages)
        if starts_request:
            self.read_deadline = self._loop.time() + self._read_timeout
            self._read_timer = self._loop.call_at(self.read_deadline, self._headers_too_slow)
        super().data_received(data)
        if self._messages and self._read_timer is not None:  # the headers are complete
            self._read_timer.cancel()
            self._read_timer = None

    def _headers_too_slow(self) -> None:
        self._read_timer = None
        if self.transport is not None and not self._messages and not self._request_in_progress:
            body = json.dumps({"error": f"the request headers did not arrive within "
                                        f"{self._read_timeout:g} s"}).encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: "
                                 b"application/json\r\nConnection: close\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        super().connection_lost(exc)


class _Refusal(asyncio.Protocol):
    """What a connection beyond the limit gets: one 503 and a close, no handler, no thread."""

    _BODY = json.dumps({"error": "too many open connections; retry later"}).encode()
    _RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(_BODY)).encode()
                 + b"\r\n\r\n" + _BODY)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self._RESPONSE)
        transport.close()


class _BoundedServer(web_server.Server):
    """aiohttp's low-level server making ``_Connection``s, at most ``max_connections``."""

    def __init__(self, handler, *, max_connections: int, read_timeout: float, **kwargs):
        super().__init__(handler, **kwargs)
        self._max_connections, self._read_timeout = max_connections, read_timeout

    def close_idle(self) -> None:
        """At a stop: closes every connection without a request under way now, and marks the
        others to close after their answer. (aiohttp's ``pre_shutdown`` misses a connection
        whose handler task has not started yet: it would hold the stop for the whole grace.)"""
        for connection in list(self._connections):
            if connection._request_in_progress:
                connection.close()
            else:
                connection.force_close()

    def __call__(self) -> asyncio.Protocol:
        if len(self._connections) >= self._max_connections:
            return _Refusal()
        return _Connection(self, loop=self._loop, read_timeout=self._read_timeout, **self._kwargs)


def _version(text: str | None) -> int | None:
    return None if text is None else int(text)


def _parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except RecursionError:   # the client's nesting, not a server fault
        raise InvalidInputError("malformed JSON: nested deeper than the parser allows") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"malformed JSON: {e}") from e
    require(isinstance(body, dict), InvalidInputError,
            f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _decode(version: ServableVersion, raw: bytes, user_key: str | None = None):
    """The pool's half of a predict: JSON -> checked request (CPU work, off the loop);
    ``user_key``: the request's ``USER_KEY_HEADER``, if any."""
    body = _parse_json(raw)
    signature_name = body.get("signature_name", "")
    require(isinstance(signature_name, str), InvalidInputError,
            "'signature_name' must be a string")
    sig = version.signature(signature_name)
    inputs, row_format = decode_request(sig, body, version.limits.max_tensor_elements)
    prepared = version.prepare(sig.name, inputs, user_key)
    return prepared, row_format, len(body["instances"]) if row_format else None


class RestServer:
    """The REST port: started and stopped from any thread, served on its own event loop."""

    def __init__(self, config: ServerConfig, manager: ModelManager, metrics: ServerMetrics,
                 ssl_context: ssl.SSLContext | None = None):
        self._config, self._manager, self._metrics = config, manager, metrics
        self._ssl = ssl_context
        self._pool = concurrent.futures.ThreadPoolExecutor(config.rest_api_num_threads,
                                                           thread_name_prefix="rest")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rest-loop",
                                        daemon=True)
        self._server: _BoundedServer | None = None
        self._listener: asyncio.AbstractServer | None = None
        self.port = 0

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> int:
        """Binds and starts serving; returns the bound port."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()
        return self.port

    async def _open(self) -> None:
        config = self._config
        self._server = _BoundedServer(
            self._handle, max_connections=config.rest_api_max_connections,
            read_timeout=config.rest_api_read_timeout_seconds,
            keepalive_timeout=config.rest_api_idle_timeout_seconds,
            # A refused oversized body is read and dropped for up to this long so that the
            # client, still sending, sees the 400 instead of a reset connection.
            lingering_time=config.rest_api_read_timeout_seconds,
            handler_cancellation=True, access_log=None, loop=self._loop)
        self._listener = await self._loop.create_server(
            self._server, config.bind_address, config.rest_api_port, ssl=self._ssl,
            ssl_handshake_timeout=config.rest_api_read_timeout_seconds if self._ssl else None,
            backlog=1024, reuse_address=True)
        self.port = self._listener.sockets[0].getsockname()[1]

    def stop(self, deadline: float) -> None:
        """Stops accepting, closes idle connections, lets requests under way finish until
        ``deadline`` (``time.monotonic``), cancels what is left, and ends the loop."""
        if not self._thread.is_alive():
            return
        closing = asyncio.run_coroutine_threadsafe(self._close(deadline), self._loop)
        try:
            closing.result(max(0.0, deadline - time.monotonic()) + 2.0)
        except (concurrent.futures.TimeoutError, Exception) as e:  # the stop goes on regardless
            LOG.warning("REST shutdown did not finish cleanly", extra={"error": full_detail(e)})
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(2.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _close(self, deadline: float) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            # Idle and half-sent connections close now (a handler waiting for their next
            # request would otherwise hold the stop for the whole grace); connections with a
            # request under way close after its answer.
            self._server.close_idle()
            await self._server.shutdown(max(0.0, deadline - time.monotonic()))

    @property
    def open_connections(self) -> int:
        return len(self._server.connections) if self._server is not None else 0

    # -- requests -----------------------------------------------------------------------------
    async def _handle(self, request: BaseRequest) -> web.StreamResponse:
        request_id = status_codes.request_id(request.headers.get(status_codes.REQUEST_ID_HEADER))
        started = time.perf_counter()
        api, content_type, close = "rest_unknown", _JSON, False
        try:
            api, work = self._route(request.method, request.path)
            status, body, content_type = await work(request, request_id)
        except asyncio.CancelledError:
            raise   # the client went away (or the server stops): nobody reads an answer
        except Exception as e:  # every failure becomes a status + JSON body; the server lives on
            status = status_codes.http_status(e)
            close = isinstance(e, SlowClientError)   # its body is half read: start afresh
            body = json.dumps({"error": status_codes.message(e, request_id),
                               "request_id": request_id}).encode()
            (LOG.error if status >= 500 and status != 503 else LOG.info)(
                "request failed", extra={"api": api, "request_id": request_id,
                                         "status": status, "path": request.path,
                                         "error": full_detail(e)})
        response = web.Response(status=status, body=body, headers={
            "Content-Type": content_type, status_codes.REQUEST_ID_HEADER: request_id})
        if close:
            response.force_close()
        self._metrics.observe_request(api, str(status), time.perf_counter() - started)
        return response

    def _route(self, method: str, path: str):
        if method == "GET" and path == "/monitoring/prometheus/metrics":
            return "rest_metrics", self._metrics_page
        if method == "GET" and path == "/healthz":
            return "rest_health", self._health
        match = _MODEL_PATH.match(path)
        if match is not None:
            name, number = match.group(1), _version(match.group(2))
            if method == "POST" and match.group(4) == "predict":
                return "rest_predict", lambda r, i: self._predict(r, i, name, number)
            if method == "GET" and match.group(4) is None:
                if match.group(3):
                    return "rest_metadata", lambda r, i: self._json(
                        metadata_json(self._manager.get(name, number)))
                return "rest_status", lambda r, i: self._json(
                    status_json(self._manager.statuses(name, number)))
        raise NotFoundError(f"no such endpoint: {method} {path}")

    async def _json(self, payload: Any, status: int = 200):
        return status, json.dumps(payload).encode("utf-8"), _JSON

    async def _metrics_page(self, request: BaseRequest, request_id: str):
        return 200, *self._metrics.exposition()

    async def _health(self, request: BaseRequest, request_id: str):
        healthy, body = self._manager.health()
        return await self._json(body, 200 if healthy else 503)

    async def _read_body(self, request: BaseRequest) -> bytes:
        limit = self._config.max_request_bytes
        size = request.content_length
        require(size is None or size <= limit, InvalidInputError,
                f"request body of {size} bytes exceeds max_request_bytes {limit}")
        protocol = request.protocol
        deadline = getattr(protocol, "read_deadline", 0.0) or (
            self._loop.time() + self._config.rest_api_read_timeout_seconds)
        chunks, total = [], 0
        try:
            async with asyncio.timeout_at(deadline):
                while chunk := await request.content.read(1 << 16):
                    total += len(chunk)
                    require(total <= limit, InvalidInputError,
                            f"request body of more than {limit} bytes exceeds max_request_bytes "
                            f"{limit}")
                    chunks.append(chunk)
        except TimeoutError:
            raise SlowClientError(
                f"the request body did not arrive within "
                f"{self._config.rest_api_read_timeout_seconds:g} s "
                f"(--rest_api_read_timeout_seconds); {total} bytes came") from None
        return b"".join(chunks)

    async def _predict(self, request: BaseRequest, request_id: str, name: str,
                       number: int | None):
        loop = self._loop
        with self._manager.admitted(name, number) as version:
            raw = await self._read_body(request)
            timeout_s = version.limits.rest_api_timeout_in_ms / 1000.0
            deadline = time.monotonic() + timeout_s
            try:
                async with asyncio.timeout(timeout_s):
                    prepared, row_format, rows = await loop.run_in_executor(
                        self._pool, _decode, version, raw, request.headers.get(USER_KEY_HEADER))
                    future = version.submit(prepared, deadline)
                    if future is None:
                        outputs = await loop.run_in_executor(self._pool, version.run, prepared,
                                                             deadline)
                    else:   # cancelling this wait (timeout, client gone) drops a queued request
                        outputs = await asyncio.wrap_future(future, loop=loop)
            except TimeoutError:
                raise DeadlineExceededError(
                    f"the request took longer than the REST timeout of "
                    f"{version.limits.rest_api_timeout_in_ms} ms (--rest_api_timeout_in_ms)"
                ) from None
        body = await loop.run_in_executor(self._pool, lambda: json.dumps(
            encode_response(prepared.signature, outputs, row_format, rows)).encode("utf-8"))
        return 200, body, _JSON
