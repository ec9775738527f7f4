"""Fixtures of the serving tests: the history SavedModel and a batching server on loopback."""

import os

import pytest

from xgr_common.serving_names import SERVING_SIGNATURE

# TensorFlow is imported inside the fixtures: on a machine without it (the GPU machine) the
# test modules here are skipped (tests/conftest.py), and this file must still import.


@pytest.fixture(scope="session")
def model_base(tmp_path_factory) -> str:
    """``<base>/1`` (scale 1.0) of the history model; tests copy it to add versions."""
    from tests.serving.helpers import save_history_model

    base = tmp_path_factory.mktemp("models") / "recs"
    save_history_model(str(base / "1"), 1.0)
    return str(base)


MAX_ROWS = 64   # rows one request may carry on the test server


@pytest.fixture(scope="module")
def server(model_base):
    """A batching server on loopback for the history model."""
    from tests.serving.helpers import start_server
    from tf_frontend.serving.config import BatchingConfig

    running = start_server(model_base, file_system_poll_wait_seconds=0,
                           batching=BatchingConfig(max_batch_size=16, batch_timeout_micros=20_000,
                                                   max_enqueued_batches=50, num_batch_threads=1),
                           max_request_bytes=64 * 1024, max_history_events=20,
                           max_request_rows=MAX_ROWS)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def in_process(model_base):
    """Calls version 1's signature in this process: what the server must answer."""
    import tensorflow as tf

    loaded = tf.saved_model.load(os.path.join(model_base, "1"))

    def call(request: dict, signature: str = SERVING_SIGNATURE) -> dict:
        outputs = loaded.signatures[signature](**{k: tf.constant(v) for k, v in request.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    return call


@pytest.fixture(scope="session")
def engine_models(tmp_path_factory) -> dict:
    """Export-like SavedModels (a TorchCall engine package and warm-up requests) of scale 1,
    2 and 4, by scale; tests deploy copies of them as versions."""
    from tests.serving.engine_model import save_engine_model

    root = tmp_path_factory.mktemp("engine_models")
    return {scale: save_engine_model(root / f"scale_{scale}", float(scale)) for scale in (1, 2, 4)}
