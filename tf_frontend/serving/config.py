"""Frozen configuration of the model server and TF Serving's batching parameters file.

The batching parameters file uses TF Serving's text format (a ``BatchingParameters``
text proto), for example::

    max_batch_size { value: 32 }
    batch_timeout_micros { value: 2000 }
    max_enqueued_batches { value: 100 }
    num_batch_threads { value: 2 }

The ``tensorflow-serving-api`` package does not ship that proto, so the few scalar
fields are read here; an unknown or malformed field is an error, never ignored.
"""

from __future__ import annotations

import dataclasses
import re

from xgr_common.errors import ConfigError, require

# Fields of BatchingParameters that change behaviour here. The padding / allowed-size fields of
# TF Serving exist for fixed-shape accelerators; they are accepted and have no effect here
# because batches are concatenated at their natural size.
_INT_FIELDS = ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
               "num_batch_threads")
_ACCEPTED_WITHOUT_EFFECT = ("pad_variable_length_inputs", "allowed_batch_sizes",
                            "enable_large_batch_splitting", "max_execution_batch_size")
_FIELD = re.compile(r"(\w+)\s*(?:\{\s*value\s*:\s*([^}\s]+)\s*\}|:\s*(\S+))")


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    """TF Serving's batching knobs.

    max_batch_size: most rows (sum of the requests' batch dims) in one model call.
    batch_timeout_micros: longest a request waits for others before its batch runs.
    max_enqueued_batches: queue capacity in batches; a request beyond it is refused (503).
    num_batch_threads: batches that may run at the same time.
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 1000
    max_enqueued_batches: int = 100
    num_batch_threads: int = 1

    def __post_init__(self):
        require(self.max_batch_size >= 1, ConfigError,
                f"max_batch_size must be >= 1, got {self.max_batch_size}")
        require(self.batch_timeout_micros >= 0, ConfigError,
                f"batch_timeout_micros must be >= 0, got {self.batch_timeout_micros}")
        require(self.max_enqueued_batches >= 1, ConfigError,
                f"max_enqueued_batches must be >= 1, got {self.max_enqueued_batches}")
        require(self.num_batch_threads >= 1, ConfigError,
                f"num_batch_threads must be >= 1, got {self.num_batch_threads}")

    @property
    def max_enqueued_rows(self) -> int:
        return self.max_batch_size * self.max_enqueued_batches


def parse_batching_parameters(text: str, defaults: BatchingConfig = BatchingConfig()) -> BatchingConfig:
    """Reads a BatchingParameters text proto; fields it does not set keep ``defaults``."""
    body = re.sub(r"#[^\n]*", "", text)
    values: dict[str, int] = {}
    consumed = 0
    for match in _FIELD.finditer(body):
        gap = body[consumed:match.start()]
        require(not gap.strip(), ConfigError,
                f"batching parameters: cannot parse {gap.strip()[:40]!r}")
        consumed = match.end()
        name, raw = match.group(1), match.group(2) or match.group(3)
        if name in _ACCEPTED_WITHOUT_EFFECT:
            continue
        require(name in _INT_FIELDS, ConfigError,
                f"batching parameters: unknown field {name!r}; known: "
                f"{', '.join(_INT_FIELDS + _ACCEPTED_WITHOUT_EFFECT)}")
        require(re.fullmatch(r"-?\d+", raw) is not None, ConfigError,
                f"batching parameters: {name} must be an integer, got {raw!r}")
        values[name] = int(raw)
    require(not body[consumed:].strip(), ConfigError,
            f"batching parameters: cannot parse {body[consumed:].strip()[:40]!r}")
    return dataclasses.replace(defaults, **values)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Everything ``xgr serve`` needs; built from flags by the entry point or directly by tests.

    port / rest_api_port: 0 picks a free port (the bound ports are on the running server).
    file_system_poll_wait_seconds: period of the version scan; 0 scans once at start.
    batching: None serves every request with its own model call.
    max_history_events: longest allowed row of a ragged (values + row_splits) input; None
      takes the model's own limit when it declares one.
    max_request_rows: most rows (batch entries) one request may carry; None takes the model's
      own (``xgr_serving.json`` ``max_rows``: the engine's largest batch).
    max_tensor_elements: most elements one gRPC input tensor may declare, checked before it
      is materialised (a few bytes can declare millions of elements).
    """

    model_name: str
    model_base_path: str
    port: int = 8500
    rest_api_port: int = 8501
    bind_address: str = "0.0.0.0"
    file_system_poll_wait_seconds: float = 1.0
    batching: BatchingConfig | None = None
    max_request_bytes: int = 16 * 1024 * 1024
    max_history_events: int | None = None
    max_request_rows: int | None = None
    max_tensor_elements: int = 1 << 22
    grpc_max_workers: int = 16
    shutdown_grace_seconds: float = 10.0

    def __post_init__(self):
        require(bool(self.model_name) and "/" not in self.model_name, ConfigError,
                f"model_name must be a non-empty name without '/', got {self.model_name!r}")
        require(bool(self.model_base_path), ConfigError, "model_base_path must be set")
        for name in ("port", "rest_api_port"):
            value = getattr(self, name)
            require(0 <= value < 65536, ConfigError, f"{name} must be in [0, 65535], got {value}")
        require(self.file_system_poll_wait_seconds >= 0, ConfigError,
                "file_system_poll_wait_seconds must be >= 0, "
                f"got {self.file_system_poll_wait_seconds}")
        require(self.max_request_bytes >= 1, ConfigError,
                f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        require(self.max_history_events is None or self.max_history_events >= 1, ConfigError,
                f"max_history_events must be >= 1, got {self.max_history_events}")
        require(self.max_request_rows is None or self.max_request_rows >= 1, ConfigError,
                f"max_request_rows must be >= 1, got {self.max_request_rows}")
        require(self.max_tensor_elements >= 1, ConfigError,
                f"max_tensor_elements must be >= 1, got {self.max_tensor_elements}")
        require(self.grpc_max_workers >= 1, ConfigError,
                f"grpc_max_workers must be >= 1, got {self.grpc_max_workers}")
