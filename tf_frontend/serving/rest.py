"""TF Serving's REST API on the standard library's threading HTTP server.

Routes::

    GET  /v1/models/NAME[/versions/N]            model version status
    GET  /v1/models/NAME[/versions/N]/metadata   signature defs
    POST /v1/models/NAME[/versions/N]:predict    row ("instances") or columnar ("inputs")
    GET  /monitoring/prometheus/metrics          Prometheus exposition
    GET  /healthz                                200 while a version is AVAILABLE, else 503

Errors answer ``{"error": "..."}`` with 400 (bad request), 404 (unknown model, version or
path), 503 (queue full, not ready) or 500. Connections close after each response
(HTTP/1.0), so a graceful shutdown only waits for requests already read.
"""

from __future__ import annotations

import http.server
import json
import logging
import re
import time
from typing import Any

from xgr_common.errors import InvalidInputError, ServingError, require
from tf_frontend.serving import status_codes
from tf_frontend.serving.json_codec import decode_request, encode_response
from tf_frontend.serving.metadata import metadata_json, status_json
from tf_frontend.serving.metrics import ServerMetrics
from tf_frontend.serving.model_manager import ModelManager

LOG = logging.getLogger("xgr.serving")
_MODEL_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?(?:(/metadata)|:(\w+))?$")
# A refused oversized body is read and dropped up to this size so that the client, still
# sending, sees the 400 instead of a reset connection.
_DRAIN_LIMIT = 64 * 1024 * 1024


class RestServer(http.server.ThreadingHTTPServer):
    """Owns the model manager and metrics that its handlers use."""

    daemon_threads = False  # server_close() joins handler threads: in-flight requests finish
    request_queue_size = 256

    def __init__(self, address, manager: ModelManager, metrics: ServerMetrics,
                 max_request_bytes: int):
        self.manager, self.metrics, self.max_request_bytes = manager, metrics, max_request_bytes
        super().__init__(address, _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: RestServer
    server_version = "xgr-serving"

    def log_message(self, fmt: str, *args) -> None:
        LOG.debug("http", extra={"client": self.client_address[0], "request": fmt % args})

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode("utf-8"))

    def _answer(self, api: str, work) -> None:
        started = time.perf_counter()
        try:
            status, payload = 200, work()
        except Exception as e:  # every failure becomes a status + {"error"}; the server lives on
            status, payload = status_codes.http_status(e), {"error": status_codes.message(e)}
            if status >= 500:
                LOG.error("request failed", extra={"api": api, "path": self.path, "error": str(e)})
        try:
            self._send_json(status, payload)
        finally:
            self.server.metrics.observe_request(api, str(status), time.perf_counter() - started)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/monitoring/prometheus/metrics":
            body, content_type = self.server.metrics.exposition()
            self._send(200, body, content_type)
            return
        if self.path == "/healthz":
            healthy = self.server.manager.healthy()
            self._send_json(200 if healthy else 503,
                            {"status": "SERVING" if healthy else "NOT_SERVING"})
            return
        match = _MODEL_PATH.match(self.path)
        if match is None or match.group(4) is not None:
            self._answer("rest_unknown", lambda: _not_found(self.path))
            return
        name, version = match.group(1), _version(match.group(2))
        manager = self.server.manager
        if match.group(3):
            self._answer("rest_metadata", lambda: metadata_json(manager.get(name, version)))
        else:
            self._answer("rest_status", lambda: status_json(manager.statuses(name, version)))

    def do_POST(self) -> None:  # noqa: N802
        match = _MODEL_PATH.match(self.path)
        if match is None or match.group(4) != "predict":
            self._answer("rest_unknown", lambda: _not_found(self.path))
            return
        self._answer("rest_predict", lambda: self._predict(match.group(1), _version(match.group(2))))

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        require(length is not None and length.isdigit(), InvalidInputError,
                "a predict request needs a Content-Length header")
        size, limit = int(length), self.server.max_request_bytes
        if size > limit:
            if size <= _DRAIN_LIMIT:
                self.rfile.read(size)
            raise InvalidInputError(f"request body of {size} bytes exceeds max_request_bytes {limit}")
        return self.rfile.read(size)

    def _predict(self, name: str, version_number: int | None) -> dict:
        raw = self._read_body()
        version = self.server.manager.get(name, version_number)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidInputError(f"malformed JSON: {e}") from e
        except RecursionError:   # the client's nesting, not a server fault
            raise InvalidInputError("malformed JSON: nested deeper than the parser allows") \
                from None
        require(isinstance(body, dict), InvalidInputError,
                f"the request body must be a JSON object, got {type(body).__name__}")
        signature_name = body.get("signature_name", "")
        require(isinstance(signature_name, str), InvalidInputError,
                "'signature_name' must be a string")
        sig = version.signature(signature_name)
        inputs, row_format = decode_request(sig, body)
        sig, outputs = version.predict(sig.name, inputs)
        rows = len(body["instances"]) if row_format else None
        return encode_response(sig, outputs, row_format, rows)


def _version(text: str | None) -> int | None:
    return None if text is None else int(text)


def _not_found(path: str) -> dict:
    raise ServingError(f"no such endpoint: {path}")
