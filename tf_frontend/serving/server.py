"""The model server: version manager + REST + gRPC + metrics, with a graceful stop.

    server = ModelServer(ServerConfig(model_name="recs", model_base_path="/models/recs",
                                      port=0, rest_api_port=0))
    server.start()          # loads the newest version, then listens
    server.grpc_port, server.rest_port
    server.stop()           # stop accepting, finish in-flight requests, unload
"""

from __future__ import annotations

import importlib
import logging
import time

import tensorflow as tf

from xgr_common.errors import ConfigError, OpLibraryError
from tf_frontend.serving.config import ServerConfig
from tf_frontend.serving.grpc_service import make_grpc_server
from tf_frontend.serving.metrics import ServerMetrics
from tf_frontend.serving.model_manager import ModelManager
from tf_frontend.serving.rest import RestServer
from tf_frontend.serving.tls import rest_ssl_context

LOG = logging.getLogger("xgr.serving")


def load_op_libraries(paths: tuple[str, ...] = ()) -> list[str]:
    """Registers custom ops before any SavedModel loads: the project's ``custom_ops`` package
    when it is importable, plus any extra ``.so`` op libraries; returns what was loaded."""
    loaded = []
    try:
        importlib.import_module("custom_ops")
        loaded.append("custom_ops")
    except (ImportError, OpLibraryError) as e:
        # Models without the project's ops still serve; one that needs them fails to load
        # with TF's "Op type not registered" in its version status.
        LOG.warning("custom_ops not loaded; serving without project ops", extra={"error": str(e)})
    for path in paths:
        try:
            tf.load_op_library(path)
        except (tf.errors.NotFoundError, OSError) as e:
            raise OpLibraryError(f"cannot load op library {path}: {e}") from e
        loaded.append(path)
    return loaded


class ModelServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = ServerMetrics(config.model_name)
        self.manager = ModelManager(config, observe_batch=self.metrics.observe_batch,
                                    observe_drop=self.metrics.observe_drop,
                                    observe_pending=self.metrics.observe_pending)
        # Built before anything listens: a bad key pair is a start-up error, not a late one.
        self._rest_ssl = rest_ssl_context(config.ssl) if config.ssl is not None else None
        self._rest: RestServer | None = None
        self._grpc = None
        self.grpc_port = self.rest_port = 0

    def start(self) -> None:
        self.manager.start()
        host = self.config.bind_address
        try:
            self._grpc, self.grpc_port = make_grpc_server(
                self.manager, self.metrics, f"{host}:{self.config.port}",
                self.config.grpc_max_workers, self.config.max_request_bytes, self.config.ssl)
        except ConfigError:
            self.manager.stop(time.monotonic())
            raise
        self._grpc.start()
        self._rest = RestServer(self.config, self.manager, self.metrics, self._rest_ssl)
        try:
            self.rest_port = self._rest.start()
        except OSError as e:   # the port is taken or the address is not this host's
            self._rest.stop(time.monotonic())
            self._grpc.stop(0)
            self.manager.stop(time.monotonic())
            raise ConfigError(f"cannot bind the REST port at {host}:{self.config.rest_api_port}: "
                              f"{e.strerror or e}") from e
        LOG.info("serving", extra={"model": self.config.model_name, "grpc_port": self.grpc_port,
                                   "rest_api_port": self.rest_port, "bind_address": host,
                                   "tls": self.config.ssl is not None,
                                   "client_verify": bool(self.config.ssl and
                                                         self.config.ssl.client_verify),
                                   "batching": self.config.batching is not None})

    def stop(self) -> None:
        """Stops accepting on both ports, lets requests already admitted finish, then unloads;
        all of it within one ``shutdown_grace_seconds``, whatever the clients do."""
        grace = self.config.shutdown_grace_seconds
        started = time.monotonic()
        deadline = started + grace
        LOG.info("shutting down", extra={"grace_seconds": grace})
        seconds = {}
        grpc_done = self._grpc.stop(grace) if self._grpc is not None else None
        if self._rest is not None:
            self._rest.stop(deadline)
        seconds["rest"] = time.monotonic() - started
        if grpc_done is not None:
            grpc_done.wait(max(0.0, deadline - time.monotonic()))
        seconds["grpc"] = time.monotonic() - started
        self.manager.stop(deadline)
        seconds["unload"] = time.monotonic() - started
        # Where the grace went, for an operator whose stops run long.
        LOG.info("stopped", extra={f"{k}_done_after_seconds": round(v, 3) for k, v in seconds.items()})
