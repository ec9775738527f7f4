"""``xgr serve``: serve a SavedModel over TF Serving's REST and gRPC APIs.

    xgr serve --model_name=recs --model_base_path=/models/recs --port=8500 --rest_api_port=8501 \
        --enable_batching --batching_parameters_file=batching.config

Both ports listen on ``--bind_address`` (default 127.0.0.1: loopback only, because the API has
no authentication and, without ``--ssl_config_file``, no encryption; give 0.0.0.0 or an
interface's address to serve other hosts). SIGTERM or Ctrl-C stops accepting, finishes the
requests already admitted within ``--shutdown_grace_seconds``, then exits 0; a stop that is still
under way a while past the grace is ended with exit code 3 and every thread's stack on stderr.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading

from absl import app, flags

from tf_frontend.serving.config import (DEFAULT_LIMITS, WARMUP_BATCH_MODES, BatchingConfig,
                                        ServerConfig, parse_batching_parameters,
                                        parse_ssl_config)
from xgr_common.errors import XgrError

FLAGS = flags.FLAGS
flags.DEFINE_string("model_name", "default", "Name of the served model (in URLs and ModelSpec).")
flags.DEFINE_string("model_base_path", None, "Directory holding numeric version directories.")
flags.DEFINE_integer("port", 8500, "gRPC port (0 picks a free one).")
flags.DEFINE_integer("rest_api_port", 8501, "REST port (0 picks a free one).")
flags.DEFINE_string("bind_address", "127.0.0.1",
                    "Address both ports listen on: 127.0.0.1 (the default) serves this host "
                    "only; 0.0.0.0 every interface.")
flags.DEFINE_string("ssl_config_file", None,
                    "TF Serving's SSLConfig text proto (server_key, server_cert, custom_ca, "
                    "client_verify): TLS on both ports, client certificates when client_verify.")
flags.DEFINE_float("file_system_poll_wait_seconds", 1.0,
                   "Period of the scan for new versions; 0 scans once at start.")
flags.DEFINE_bool("enable_batching", False, "Coalesce concurrent requests into one model call.")
flags.DEFINE_string("batching_parameters_file", None,
                    "BatchingParameters text proto; overrides the batching flags it sets.")
flags.DEFINE_integer("max_batch_size", BatchingConfig.max_batch_size, "Rows per model call.")
flags.DEFINE_integer("batch_timeout_micros", BatchingConfig.batch_timeout_micros,
                     "Longest a request waits for a batch to fill.")
flags.DEFINE_integer("max_enqueued_batches", BatchingConfig.max_enqueued_batches,
                     "Batch queue capacity in batches; beyond it requests are refused (503 / "
                     "RESOURCE_EXHAUSTED).")
flags.DEFINE_integer("num_batch_threads", BatchingConfig.num_batch_threads,
                     "Batches that may run at the same time.")
flags.DEFINE_integer("max_request_bytes", 16 * 1024 * 1024,
                     "Largest request body (REST) or message (gRPC).")
# The request limits: unset, each comes from the version's assets.extra/xgr_serving.json, else
# the default named in its help.
flags.DEFINE_integer("max_request_rows", None,
                     "Most rows one request may carry; default: the model's own (the engine's "
                     f"largest batch, from the export's xgr_serving.json), else "
                     f"{DEFAULT_LIMITS.max_rows}.")
flags.DEFINE_integer("max_tensor_elements", None,
                     "Most elements one input tensor may hold, checked on what a request "
                     f"declares before it is materialised; default: the model's, else "
                     f"{DEFAULT_LIMITS.max_tensor_elements}.")
flags.DEFINE_integer("max_history_events", None,
                     "Longest ragged history row; default: the model's own limit, if any.")
flags.DEFINE_integer("max_pending_requests", None,
                     "Requests one version admits at once (decoding, queued or running); one "
                     "more is refused at once with 503 / RESOURCE_EXHAUSTED. Default: the "
                     f"model's, else {DEFAULT_LIMITS.max_pending_requests}.")
flags.DEFINE_integer("rest_api_timeout_in_ms", None,
                     "Longest a REST predict may take once its body is read (504 past it; a "
                     "request still queued is dropped). gRPC callers set their own deadline. "
                     f"Default: the model's, else {DEFAULT_LIMITS.rest_api_timeout_in_ms}.")
flags.DEFINE_float("rest_api_read_timeout_seconds", 10.0,
                   "Longest a client may take to send one request's headers and body, from its "
                   "first byte (408 or closed past it).")
flags.DEFINE_float("rest_api_idle_timeout_seconds", 75.0,
                   "Longest a keep-alive REST connection may sit idle before it is closed.")
flags.DEFINE_integer("rest_api_max_connections", 1024,
                     "Open REST connections; one more is answered 503 and closed.")
flags.DEFINE_integer("rest_api_num_threads", 16,
                     "Threads that decode REST bodies and run unbatched model calls.")
flags.DEFINE_integer("grpc_max_threads", 16,
                     "Threads that run gRPC calls; calls beyond twice as many are refused "
                     "(RESOURCE_EXHAUSTED).")
flags.DEFINE_list("custom_op_libraries", [], "Extra TF op libraries (.so) to load first.")
flags.DEFINE_float("shutdown_grace_seconds", 10.0,
                   "Longest a stop waits, in total, for requests already admitted.")
flags.DEFINE_float("prompt_cache_gb", None,
                   "The prompt-KV cache of each engine package exported with --prompt_cache, in "
                   "GiB of its device's memory, allocated when the package loads (a model "
                   "version swap holds two for a moment; a catalog-only version shares its "
                   "package and cache). Unset: XGR_PROMPT_CACHE_BYTES, else 0.25 GiB.")
flags.DEFINE_float("prompt_cache_host_gb", None,
                   "The prompt cache's host tier beside each pool, in GiB of host memory "
                   "(pinned beside a GPU): entries the pool evicts are copied there and "
                   "copied back when their user returns. Unset: "
                   "XGR_PROMPT_CACHE_HOST_BYTES, else none.")
flags.DEFINE_integer("replicas", 1, "Serving processes behind one front (>= 2: one per GPU "
                     "with --replica_devices): each request goes to the replica that owns its "
                     "user key (header / metadata x-user-key; consistent hashing, so a user's "
                     "cached history stays on one GPU), the least loaded when that one is "
                     "saturated, never one drained after faults.")
flags.DEFINE_list("replica_devices", [], "With --replicas: the GPU of each replica "
                  "(CUDA_VISIBLE_DEVICES of its process), e.g. 0,1,2,3.")
flags.DEFINE_integer("replica_max_in_flight", 32, "With --replicas: requests at once a "
                     "replica takes before its users' requests go to the least loaded.")
flags.DEFINE_enum("warmup_batches", "auto", list(WARMUP_BATCH_MODES),
                  "After a version's warm-up file: run its longest row at every power-of-two "
                  "batch size up to --max_batch_size, so full-length traffic finds its CUDA "
                  "graphs captured. auto: where a package replays CUDA graphs.")
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


def _ssl():
    if not FLAGS.ssl_config_file:
        return None
    with open(FLAGS.ssl_config_file) as f:
        return parse_ssl_config(f.read())


def config_from_flags() -> ServerConfig:
    return ServerConfig(
        model_name=FLAGS.model_name, model_base_path=FLAGS.model_base_path, port=FLAGS.port,
        rest_api_port=FLAGS.rest_api_port, bind_address=FLAGS.bind_address,
        file_system_poll_wait_seconds=FLAGS.file_system_poll_wait_seconds,
        batching=_batching(), max_request_bytes=FLAGS.max_request_bytes,
        max_history_events=FLAGS.max_history_events, max_request_rows=FLAGS.max_request_rows,
        max_tensor_elements=FLAGS.max_tensor_elements,
        max_pending_requests=FLAGS.max_pending_requests,
        rest_api_timeout_in_ms=FLAGS.rest_api_timeout_in_ms,
        rest_api_read_timeout_seconds=FLAGS.rest_api_read_timeout_seconds,
        rest_api_idle_timeout_seconds=FLAGS.rest_api_idle_timeout_seconds,
        rest_api_max_connections=FLAGS.rest_api_max_connections,
        rest_api_num_threads=FLAGS.rest_api_num_threads,
        grpc_max_workers=FLAGS.grpc_max_threads, ssl=_ssl(),
        shutdown_grace_seconds=FLAGS.shutdown_grace_seconds,
        warmup_batches=FLAGS.warmup_batches)


def main(argv: list[str]) -> None:
    del argv
    import logging

    from tf_frontend.serving.json_logs import install_json_logging
    from tf_frontend.serving.scratch import claim_scratch_folder
    from tf_frontend.serving.server import ModelServer, load_op_libraries
    from tf_frontend.serving.shutdown import (EXIT_CLEAN, ShutdownWatchdog, leave,
                                              watchdog_seconds)

    install_json_logging(FLAGS.log_level)
    log = logging.getLogger("xgr.serving")
    try:
        config = config_from_flags()
    except (XgrError, OSError) as e:  # a bad flag or file: a message, not a traceback
        raise app.UsageError(str(e)) from e
    # Read by TorchCall's runtime when an engine package with a cache loads.
    for flag, variable in (("prompt_cache_gb", "XGR_PROMPT_CACHE_BYTES"),
                           ("prompt_cache_host_gb", "XGR_PROMPT_CACHE_HOST_BYTES")):
        gib = getattr(FLAGS, flag)
        if gib is not None:
            if not (math.isfinite(gib) and gib >= 0):
                raise app.UsageError(f"--{flag} must be a finite number >= 0 (GiB), got {gib}")
            os.environ[variable] = str(int(gib * (1 << 30)))
    # Before any engine package loads: its unpacked files go to this process's own folder,
    # and the folders of killed servers are removed.
    scratch, removed = claim_scratch_folder()
    log.info("scratch folder", extra={"path": str(scratch),
                                      "removed_stale": [str(p) for p in removed]})
    # Handlers before the first version loads: a SIGTERM during a long load still ends in a
    # clean stop (once the load is done) instead of killing the process.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if FLAGS.replicas > 1:
        return serve_replicas(config, stop, scratch, log)
    try:
        load_op_libraries(tuple(FLAGS.custom_op_libraries))
        server = ModelServer(config)
    except (XgrError, OSError) as e:
        raise app.UsageError(str(e)) from e
    try:
        server.start()
    except XgrError as e:   # a port taken, an address not this host's: a message, exit 1
        raise app.UsageError(str(e)) from e
    print(f"serving {FLAGS.model_name}: grpc port {server.grpc_port}, "
          f"rest port {server.rest_port}", flush=True)
    stop.wait()
    finished = ShutdownWatchdog(watchdog_seconds(FLAGS.shutdown_grace_seconds)).arm()
    server.stop()
    shutil.rmtree(scratch, ignore_errors=True)
    finished.set()
    leave(EXIT_CLEAN)


def serve_replicas(config, stop: threading.Event, scratch, log) -> None:
    """``--replicas N``: N serving processes (``tf_frontend.serving.replica_processes``)
    behind the routing front (``tf_frontend.serving.router``) on the public ports."""
    import sys

    from tf_frontend.serving.affinity import AffinityConfig, ReplicaSet
    from tf_frontend.serving.replica_processes import start_replicas, stop_replicas
    from tf_frontend.serving.router import Router, replicas_from
    from tf_frontend.serving.shutdown import EXIT_CLEAN, leave

    if FLAGS.ssl_config_file:
        raise app.UsageError("--replicas does not take --ssl_config_file: put TLS on the "
                             "balancer in front, or serve one replica per host")
    argv = sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "serve" else sys.argv[1:]
    try:
        replicas = start_replicas(argv, FLAGS.replicas, FLAGS.replica_devices,
                                  log_dir=str(scratch))
    except XgrError as e:
        raise app.UsageError(str(e)) from e
    router = Router(ReplicaSet(replicas_from((r.name, r.grpc_port, r.rest_port)
                                             for r in replicas),
                               AffinityConfig(max_in_flight=FLAGS.replica_max_in_flight)),
                    bind_address=config.bind_address, grpc_port=config.port,
                    rest_port=config.rest_api_port)
    try:
        router.start()
    except (OSError, RuntimeError) as e:
        stop_replicas(replicas, FLAGS.shutdown_grace_seconds)
        raise app.UsageError(f"cannot bind the front's ports: {e}") from e
    log.info("replicas serving behind the front",
             extra={"replicas": [{"name": r.name, "grpc_port": r.grpc_port,
                                  "rest_port": r.rest_port} for r in replicas],
                    "devices": FLAGS.replica_devices})
    print(f"serving {FLAGS.model_name}: grpc port {router.grpc_port}, "
          f"rest port {router.rest_port} ({len(replicas)} replicas)", flush=True)
    stop.wait()
    router.stop(FLAGS.shutdown_grace_seconds)
    codes = stop_replicas(replicas, FLAGS.shutdown_grace_seconds)
    log.info("replicas stopped", extra={"exit_codes": codes})
    shutil.rmtree(scratch, ignore_errors=True)
    leave(EXIT_CLEAN)


if __name__ == "__main__":
    app.run(main)
