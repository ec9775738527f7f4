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
import threading

import tensorflow as tf

from xgr_common.errors import OpLibraryError
from tf_frontend.serving.config import ServerConfig
from tf_frontend.serving.grpc_service import make_grpc_server
from tf_frontend.serving.metrics import ServerMetrics
from tf_frontend.serving.model_manager import ModelManager
from tf_frontend.serving.rest import RestServer

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
        self.manager = ModelManager(config, observe_batch=self.metrics.observe_batch)
        self._rest: RestServer | None = None
        self._rest_thread: threading.Thread | None = None
        self._grpc = None
        self.grpc_port = self.rest_port = 0

    def start(self) -> None:
        self.manager.start()
        host = self.config.bind_address
        self._grpc, self.grpc_port = make_grpc_server(
            self.manager, self.metrics, f"{host}:{self.config.port}",
            self.config.grpc_max_workers, self.config.max_request_bytes,
            self.config.max_tensor_elements)
        self._grpc.start()
        self._rest = RestServer((host, self.config.rest_api_port), self.manager, self.metrics,
                                self.config.max_request_bytes)
        self.rest_port = self._rest.server_address[1]
        self._rest_thread = threading.Thread(target=self._rest.serve_forever, name="rest",
                                             daemon=True)
        self._rest_thread.start()
        LOG.info("serving", extra={"model": self.config.model_name, "grpc_port": self.grpc_port,
                                   "rest_api_port": self.rest_port,
                                   "batching": self.config.batching is not None})

    def stop(self) -> None:
        """Stops accepting, lets in-flight requests finish (up to the grace), then unloads."""
        grace = self.config.shutdown_grace_seconds
        LOG.info("shutting down", extra={"grace_seconds": grace})
        grpc_done = self._grpc.stop(grace) if self._grpc is not None else None
        if self._rest is not None:
            self._rest.shutdown()      # no new connections are taken
            self._rest.server_close()  # joins the handler threads of requests already read
        if grpc_done is not None:
            grpc_done.wait(grace)
        self.manager.stop()
        LOG.info("stopped")
