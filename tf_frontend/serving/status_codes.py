"""One mapping from the project's errors to HTTP statuses and gRPC codes (TF Serving's)."""

from __future__ import annotations

import grpc

from xgr_common.errors import CapacityError, InvalidInputError, ServingError
from tf_frontend.serving.servable import ModelExecutionError

# Checked in order: the first matching class decides.
_TABLE = (
    (InvalidInputError, 400, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelExecutionError, 500, grpc.StatusCode.INTERNAL),
    (CapacityError, 503, grpc.StatusCode.UNAVAILABLE),
    (ServingError, 404, grpc.StatusCode.NOT_FOUND),
)


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


def message(error: BaseException) -> str:
    """What the caller sees: the project's own messages, or the type for unexpected errors."""
    if isinstance(error, (InvalidInputError, ServingError, CapacityError)):
        return str(error)
    return f"internal error: {type(error).__name__}: {error}"
