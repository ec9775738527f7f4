"""One mapping from the project's errors to HTTP statuses and gRPC codes (TF Serving's), the
message a caller is shown, and the id each request is known by in the log."""

from __future__ import annotations

import re
import uuid

import grpc

from xgr_common.errors import (CapacityError, DeadlineExceededError, InvalidInputError,
                               NotFoundError, OverloadedError, RequestCancelledError,
                               ServingError, SlowClientError, UnavailableError)
from tf_frontend.serving.public_text import public_text
from tf_frontend.serving.servable import ModelExecutionError

# Checked in order: the first matching class decides. A client's mistake is the only 4xx
# besides a missing model; everything the server or its model did wrong is a 5xx.
_TABLE = (
    (SlowClientError, 408, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidInputError, 400, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelExecutionError, 500, grpc.StatusCode.INTERNAL),
    (OverloadedError, 503, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CapacityError, 503, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceededError, 504, grpc.StatusCode.DEADLINE_EXCEEDED),
    (RequestCancelledError, 499, grpc.StatusCode.CANCELLED),
    (UnavailableError, 503, grpc.StatusCode.UNAVAILABLE),
    (NotFoundError, 404, grpc.StatusCode.NOT_FOUND),
    (ServingError, 404, grpc.StatusCode.NOT_FOUND),
)
# Errors whose own message is meant for the caller (it names the input and the rule).
_TOLD = (InvalidInputError, CapacityError, ServingError)
_OFFERED_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_METADATA = "x-request-id"


def http_status(error: BaseException) -> int:
    for cls, status, _ in _TABLE:
        if isinstance(error, cls):
            return status
    return 500


def grpc_code(error: BaseException) -> grpc.StatusCode:
    for cls, _, code in _TABLE:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


def http_status_for_code(code: grpc.StatusCode) -> int:
    """The HTTP status the REST API answers where the gRPC API answers ``code``: the last row
    of the table with that code, the general class (``INVALID_ARGUMENT`` is 400, not a slow
    client's 408); 500 for a code the table lacks. For clients that compare the two APIs."""
    return next((status for _, status, row in reversed(_TABLE) if row == code), 500)


def message(error: BaseException, request_id: str | None = None) -> str:
    """What the caller sees: the project's own messages without server internals; for a model
    fault or an unexpected error only its class, and the request id the log has it under."""
    where = f" (request id {request_id})" if request_id else ""
    if isinstance(error, ModelExecutionError):
        return f"{public_text(str(error.public))}; the server log has the detail{where}"
    if isinstance(error, _TOLD):
        return public_text(str(error))
    return f"internal error ({type(error).__name__}); the server log has the detail{where}"


def request_id(offered: str | None = None) -> str:
    """The id a request is logged and answered with: the client's own (``X-Request-Id`` /
    ``x-request-id`` metadata) when it is a short plain token, else a fresh one."""
    if offered and _OFFERED_ID.fullmatch(offered):
        return offered
    return uuid.uuid4().hex[:16]
