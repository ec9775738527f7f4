"""The one error hierarchy of xgr-bridge.

Every package raises these (``torch_engine``, ``bridge``, ``custom_ops``, ``tf_frontend``).
This module imports nothing heavy, so TF-only code (``custom_ops``) may import it without
pulling in torch.

Messages say what was expected and what came, and name the input.
"""

from __future__ import annotations


class XgrError(Exception):
    """Base class of every error raised by xgr-bridge."""


class InvalidInputError(XgrError, ValueError):
    """A caller passed a bad argument (shape, dtype, range). Names the argument and the rule."""


class SlowClientError(InvalidInputError):
    """A client took longer than the server's read timeout to send its request (REST 408);
    the connection is closed."""


class ConfigError(XgrError, ValueError):
    """A configuration value is inconsistent or out of range."""


class CatalogError(XgrError, ValueError):
    """A semantic-ID catalog is malformed (bad code paths, duplicate ids, wrong layout)."""


class CatalogFileError(CatalogError):
    """A catalog file (Parquet, ``.npz``) cannot be read or breaks one of its rules.

    The message names the file, then the row, column and value where there is one; the same
    facts are kept as attributes (``path``, ``row``, ``column``; None where they do not apply)
    so a caller can point at the offending cell.
    """

    def __init__(self, message: str, *, path: str | None = None, row: int | None = None,
                 column: str | None = None):
        super().__init__(message)
        self.path = path
        self.row = row
        self.column = column


class EmbeddingFileError(CatalogFileError):
    """An item-embedding file, the source of ``xgr catalog build`` (Parquet, ``.npy``), cannot
    be read or breaks one of its rules (a NaN, a repeated id, no rows, rows of other widths);
    ``path``, ``row`` and ``column`` as for ``CatalogFileError``."""


class CapacityError(XgrError, RuntimeError):
    """A request cannot fit the device (memory, beam width, batch); raised before any work starts."""


class BridgeError(XgrError, TypeError):
    """A tensor cannot cross the TF<->Torch DLPack bridge (unsupported dtype, device, layout)."""


class OpLibraryError(XgrError, RuntimeError):
    """A C++ op library is missing, unbuilt or failed to load."""


class ExportError(XgrError, RuntimeError):
    """A model or pipeline could not be exported or its exported form could not be loaded."""


class MigrationError(XgrError, RuntimeError):
    """A migration plan is invalid or a stage cannot be converted."""


class ConversionError(MigrationError):
    """A TF stage cannot be converted to Torch; carries the reason per offending op."""


class ParityError(XgrError, AssertionError):
    """Two implementations that must agree do not (values outside the tolerance table)."""


class ServingError(XgrError, RuntimeError):
    """The serving layer cannot answer a request (unknown model, version, signature)."""


class NotFoundError(ServingError):
    """A request names a model, version or endpoint the server does not have (404 / NOT_FOUND)."""


class UnavailableError(ServingError):
    """The server cannot serve now through no fault of the request: no version of the model
    loads, or the server is stopping (503 / UNAVAILABLE); a retry may succeed later."""


class OverloadedError(CapacityError):
    """The server's bounded request queue is full (503 / RESOURCE_EXHAUSTED): refused at once,
    before any work, so that overload never grows the server's memory or latency."""


class DeadlineExceededError(ServingError):
    """A request's deadline (gRPC's, or the REST timeout) passed before it ran or finished
    (504 / DEADLINE_EXCEEDED); a queued request is dropped instead of run."""


class RequestCancelledError(ServingError):
    """The client went away (cancelled gRPC call, closed REST connection) before its request
    ran; the request is dropped from its batch."""


def require_fields(data: object, known: set[str], what: str) -> None:
    """Refuse (``ConfigError``) a JSON object ``data`` describing a ``what`` unless its keys
    are exactly ``known``, naming the unknown or missing keys."""
    require(isinstance(data, dict), ConfigError,
            f"a {what} must be a JSON object, got {type(data).__name__}")
    unknown, missing = sorted(set(data) - known), sorted(known - set(data))
    require(not unknown, ConfigError, f"unknown {what} fields {unknown}; known: {sorted(known)}")
    require(not missing, ConfigError, f"{what} lacks fields {missing}")


def require(condition: bool, error: type[XgrError], message: str) -> None:
    """Raise ``error(message)`` when ``condition`` is false; for validating user input.

    Unlike ``assert`` this survives ``python -O``.
    """
    if not condition:
        raise error(message)
