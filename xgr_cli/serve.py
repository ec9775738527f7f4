"""``xgr serve``: serve a SavedModel over TF Serving's REST and gRPC APIs.

    xgr serve --model_name=recs --model_base_path=/models/recs --port=8500 --rest_api_port=8501 \
        --enable_batching --batching_parameters_file=batching.config

SIGTERM or Ctrl-C stops accepting, finishes in-flight requests, then exits.
"""

from __future__ import annotations

import signal
import threading

from absl import app, flags

from tf_frontend.serving.config import BatchingConfig, ServerConfig, parse_batching_parameters
from xgr_common.errors import XgrError

FLAGS = flags.FLAGS
flags.DEFINE_string("model_name", "default", "Name of the served model (in URLs and ModelSpec).")
flags.DEFINE_string("model_base_path", None, "Directory holding numeric version directories.")
flags.DEFINE_integer("port", 8500, "gRPC port (0 picks a free one).")
flags.DEFINE_integer("rest_api_port", 8501, "REST port (0 picks a free one).")
flags.DEFINE_string("bind_address", "0.0.0.0", "Address both servers listen on.")
flags.DEFINE_float("file_system_poll_wait_seconds", 1.0,
                   "Period of the scan for new versions; 0 scans once at start.")
flags.DEFINE_bool("enable_batching", False, "Coalesce concurrent requests into one model call.")
flags.DEFINE_string("batching_parameters_file", None,
                    "BatchingParameters text proto; overrides the batching flags it sets.")
flags.DEFINE_integer("max_batch_size", BatchingConfig.max_batch_size, "Rows per model call.")
flags.DEFINE_integer("batch_timeout_micros", BatchingConfig.batch_timeout_micros,
                     "Longest a request waits for a batch to fill.")
flags.DEFINE_integer("max_enqueued_batches", BatchingConfig.max_enqueued_batches,
                     "Queue capacity in batches; beyond it requests are refused (503).")
flags.DEFINE_integer("num_batch_threads", BatchingConfig.num_batch_threads,
                     "Batches that may run at the same time.")
flags.DEFINE_integer("max_request_bytes", 16 * 1024 * 1024, "Largest accepted request body.")
flags.DEFINE_integer("max_request_rows", None,
                     "Most rows one request may carry; default: the model's own (the engine's "
                     "largest batch, from the export's xgr_serving.json).")
flags.DEFINE_integer("max_tensor_elements", 1 << 22,
                     "Most elements one gRPC input tensor may declare; checked before the "
                     "tensor is materialised.")
flags.DEFINE_integer("max_history_events", None,
                     "Longest ragged history row; default: the model's own limit, if any.")
flags.DEFINE_list("custom_op_libraries", [], "Extra TF op libraries (.so) to load first.")
flags.DEFINE_float("shutdown_grace_seconds", 10.0, "Longest wait for in-flight requests.")
flags.DEFINE_string("log_level", "INFO", "Level of the JSON logs on stderr.")
flags.mark_flag_as_required("model_base_path")


def _batching() -> BatchingConfig | None:
    if not FLAGS.enable_batching:
        return None
    config = BatchingConfig(max_batch_size=FLAGS.max_batch_size,
                            batch_timeout_micros=FLAGS.batch_timeout_micros,
                            max_enqueued_batches=FLAGS.max_enqueued_batches,
                            num_batch_threads=FLAGS.num_batch_threads)
    if FLAGS.batching_parameters_file:
        with open(FLAGS.batching_parameters_file) as f:
            config = parse_batching_parameters(f.read(), defaults=config)
    return config


def config_from_flags() -> ServerConfig:
    return ServerConfig(
        model_name=FLAGS.model_name, model_base_path=FLAGS.model_base_path, port=FLAGS.port,
        rest_api_port=FLAGS.rest_api_port, bind_address=FLAGS.bind_address,
        file_system_poll_wait_seconds=FLAGS.file_system_poll_wait_seconds,
        batching=_batching(), max_request_bytes=FLAGS.max_request_bytes,
        max_history_events=FLAGS.max_history_events, max_request_rows=FLAGS.max_request_rows,
        max_tensor_elements=FLAGS.max_tensor_elements,
        shutdown_grace_seconds=FLAGS.shutdown_grace_seconds)


def main(argv: list[str]) -> None:
    del argv
    from tf_frontend.serving.json_logs import install_json_logging
    from tf_frontend.serving.server import ModelServer, load_op_libraries

    install_json_logging(FLAGS.log_level)
    try:
        config = config_from_flags()
        load_op_libraries(tuple(FLAGS.custom_op_libraries))
    except (XgrError, OSError) as e:  # a bad flag or file: a message, not a traceback
        raise app.UsageError(str(e)) from e
    server = ModelServer(config)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    print(f"serving {FLAGS.model_name}: grpc port {server.grpc_port}, "
          f"rest port {server.rest_port}", flush=True)
    stop.wait()
    server.stop()


if __name__ == "__main__":
    app.run(main)
