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

import codecs
import dataclasses
import math
import re

from xgr_common.errors import ConfigError, require

# Fields of BatchingParameters that change behaviour here. The padding / allowed-size fields of
# TF Serving exist for fixed-shape accelerators; they are accepted and have no effect here
# because batches are concatenated at their natural size.
_INT_FIELDS = ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
               "num_batch_threads")
_ACCEPTED_WITHOUT_EFFECT = ("pad_variable_length_inputs", "allowed_batch_sizes",
                            "enable_large_batch_splitting", "max_execution_batch_size")
# `warmup_batches`: "auto" warms the batch sizes of a version whose packages replay CUDA
# graphs (where the first call of a shape costs a capture), "all" of any version, "none" never.
WARMUP_BATCH_MODES = ("auto", "all", "none")
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
class RequestLimits:
    """What one request may ask of a model version. None leaves a limit to the next source:
    a server flag wins over the version's ``assets.extra/xgr_serving.json``, which wins over
    the model's own attribute (``max_history_events``) and the defaults in ``DEFAULT_LIMITS``.

    max_rows: most rows (batch entries) one request may carry.
    max_history_events: longest row of a ragged (values + row splits) input.
    max_tensor_elements: most elements one input may hold, checked on what a request declares
      before anything is materialised (a few bytes of gRPC can declare millions of elements).
    max_pending_requests: most requests of this version admitted at once (decoding, queued or
      running); one more is refused with 503 / RESOURCE_EXHAUSTED before any work.
    rest_api_timeout_in_ms: longest a REST predict may take from its body being read to its
      answer (gRPC callers set their own deadline); past it the caller gets 504 and a request
      still queued is dropped.
    """

    max_rows: int | None = None
    max_history_events: int | None = None
    max_tensor_elements: int | None = None
    max_pending_requests: int | None = None
    rest_api_timeout_in_ms: int | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            require(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                      and value >= 1), ConfigError,
                    f"{field.name} must be a positive integer, got {value!r}")

    def over(self, fallback: "RequestLimits") -> "RequestLimits":
        """These limits where set, ``fallback``'s elsewhere."""
        return RequestLimits(**{f.name: (getattr(fallback, f.name) if getattr(self, f.name) is None
                                         else getattr(self, f.name))
                                for f in dataclasses.fields(self)})


# What a limit is when neither a flag nor the model sets it. Rows: a batch the size of the
# engine's largest bucket is rare; 4,096 rows of features stay well under a gigabyte.
# Elements: 4M per input (32 MB of int64). Pending: enough for an open loop of a few hundred
# requests/s at 100 ms each, few enough that a refused request learns it at once.
DEFAULT_LIMITS = RequestLimits(max_rows=4096, max_tensor_elements=1 << 22,
                               max_pending_requests=512, rest_api_timeout_in_ms=30_000)


@dataclasses.dataclass(frozen=True)
class SSLConfig:
    """TF Serving's ``SSLConfig`` (``--ssl_config_file``): PEM text, not file names.

    server_key / server_cert: the server's private key and certificate chain.
    custom_ca: CA certificates that client certificates must chain to.
    client_verify: require a client certificate signed by ``custom_ca``.
    """

    server_key: str
    server_cert: str
    custom_ca: str = ""
    client_verify: bool = False

    def __post_init__(self):
        require("PRIVATE KEY" in self.server_key, ConfigError,
                "ssl config: server_key must hold a PEM private key")
        require("CERTIFICATE" in self.server_cert, ConfigError,
                "ssl config: server_cert must hold a PEM certificate")
        require(not self.client_verify or "CERTIFICATE" in self.custom_ca, ConfigError,
                "ssl config: client_verify needs custom_ca, the CA that signs client "
                "certificates")

    def __repr__(self) -> str:  # never print the key
        return f"SSLConfig(client_verify={self.client_verify}, custom_ca={bool(self.custom_ca)})"


_SSL_STRING_FIELDS = ("server_key", "server_cert", "custom_ca")
_SSL_TOKEN = re.compile(r'\s*(\w+)\s*:\s*((?:"(?:[^"\\]|\\.)*"\s*)+|true|false)', re.S)


def _unquote(text: str) -> str:
    """The value of one or more adjacent text-proto string literals ("a" "b" -> "ab")."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', text, re.S)
    return "".join(codecs.escape_decode(p.encode("utf-8"))[0].decode("utf-8") for p in parts)


def parse_ssl_config(text: str) -> SSLConfig:
    """Reads TF Serving's SSLConfig text proto::

        server_key: "-----BEGIN PRIVATE KEY-----\\n..."
        server_cert: "-----BEGIN CERTIFICATE-----\\n..."
        custom_ca: "-----BEGIN CERTIFICATE-----\\n..."
        client_verify: true

    Strings may use escapes (``\\n``) or run over several lines; an unknown or malformed
    field is an error."""
    body = re.sub(r"^\s*#[^\n]*", "", text, flags=re.M)
    values: dict[str, object] = {}
    consumed = 0
    for match in _SSL_TOKEN.finditer(body):
        require(not body[consumed:match.start()].strip(), ConfigError,
                f"ssl config: cannot parse {body[consumed:match.start()].strip()[:40]!r}")
        consumed = match.end()
        name, raw = match.group(1), match.group(2).strip()
        if name == "client_verify":
            require(raw in ("true", "false"), ConfigError,
                    f"ssl config: client_verify must be true or false, got {raw[:20]!r}")
            values[name] = raw == "true"
            continue
        require(name in _SSL_STRING_FIELDS, ConfigError,
                f"ssl config: unknown field {name!r}; known: "
                f"{', '.join(_SSL_STRING_FIELDS + ('client_verify',))}")
        require(raw.startswith('"'), ConfigError, f"ssl config: {name} must be a string")
        values[name] = _unquote(raw)
    require(not body[consumed:].strip(), ConfigError,
            f"ssl config: cannot parse {body[consumed:].strip()[:40]!r}")
    require("server_key" in values and "server_cert" in values, ConfigError,
            "ssl config: server_key and server_cert are required")
    return SSLConfig(**values)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Everything ``xgr serve`` needs; built from flags by the entry point or directly by tests.

    port / rest_api_port: 0 picks a free port (the bound ports are on the running server).
    bind_address: where both ports listen; loopback unless an operator opens it up.
    file_system_poll_wait_seconds: period of the version scan; 0 scans once at start.
    batching: None serves every request with its own model call.
    max_request_bytes: largest request body (REST) or message (gRPC).
    max_history_events, max_request_rows, max_tensor_elements, max_pending_requests,
      rest_api_timeout_in_ms: the request limits of ``RequestLimits``, as flags (None: the
      model's ``xgr_serving.json``, else ``DEFAULT_LIMITS``).
    rest_api_read_timeout_seconds: longest a client may take to send one request, headers and
      body, from its first byte; a slower one is answered 408 or closed.
    rest_api_idle_timeout_seconds: longest a keep-alive connection may sit idle.
    rest_api_max_connections: open REST connections; one more is answered 503 and closed.
    rest_api_num_threads: threads that decode REST bodies and run unbatched model calls.
    grpc_max_workers: threads that run gRPC calls (gRPC refuses calls beyond twice as many).
    ssl: TLS for both ports (None: plain text).
    shutdown_grace_seconds: longest a stop waits for requests already admitted, in total.
    warmup_batches: after the warm-up file, run its longest row at every power-of-two batch
      size up to ``max_batch_size``, and a keyed signature's row as a one-row hit
      (``warmup.warm_batch_sizes``): "auto" where a package of the version replays CUDA
      graphs, "all" always, "none" never.
    """

    model_name: str
    model_base_path: str
    port: int = 8500
    rest_api_port: int = 8501
    bind_address: str = "127.0.0.1"
    file_system_poll_wait_seconds: float = 1.0
    batching: BatchingConfig | None = None
    max_request_bytes: int = 16 * 1024 * 1024
    max_history_events: int | None = None
    max_request_rows: int | None = None
    max_tensor_elements: int | None = None
    max_pending_requests: int | None = None
    rest_api_timeout_in_ms: int | None = None
    rest_api_read_timeout_seconds: float = 10.0
    rest_api_idle_timeout_seconds: float = 75.0
    rest_api_max_connections: int = 1024
    rest_api_num_threads: int = 16
    grpc_max_workers: int = 16
    ssl: SSLConfig | None = None
    shutdown_grace_seconds: float = 10.0
    warmup_batches: str = "auto"

    def __post_init__(self):
        require(bool(self.model_name) and "/" not in self.model_name, ConfigError,
                f"model_name must be a non-empty name without '/', got {self.model_name!r}")
        require(bool(self.model_base_path), ConfigError, "model_base_path must be set")
        require(bool(self.bind_address), ConfigError, "bind_address must be set")
        for name in ("port", "rest_api_port"):
            value = getattr(self, name)
            require(0 <= value < 65536, ConfigError, f"{name} must be in [0, 65535], got {value}")
        # Finite too: an infinite wait overflows the timers of threads, asyncio and gRPC.
        for name in ("file_system_poll_wait_seconds", "shutdown_grace_seconds"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, ConfigError,
                    f"{name} must be a finite number >= 0, got {value}")
        for name in ("rest_api_read_timeout_seconds", "rest_api_idle_timeout_seconds"):
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0, ConfigError,
                    f"{name} must be a finite number > 0, got {value}")
        for name in ("max_request_bytes", "rest_api_max_connections", "rest_api_num_threads",
                     "grpc_max_workers"):
            require(getattr(self, name) >= 1, ConfigError,
                    f"{name} must be >= 1, got {getattr(self, name)}")
        require(self.warmup_batches in WARMUP_BATCH_MODES, ConfigError,
                f"warmup_batches must be one of {WARMUP_BATCH_MODES}, got "
                f"{self.warmup_batches!r}")
        self.limits  # noqa: B018  (validates the limit flags)

    @property
    def limits(self) -> RequestLimits:
        """The request limits the flags set (None where they leave it to the model)."""
        return RequestLimits(max_rows=self.max_request_rows,
                             max_history_events=self.max_history_events,
                             max_tensor_elements=self.max_tensor_elements,
                             max_pending_requests=self.max_pending_requests,
                             rest_api_timeout_in_ms=self.rest_api_timeout_in_ms)
