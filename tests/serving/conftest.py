"""Fixtures of the serving tests: the history SavedModel and a batching server on loopback."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

pytest.importorskip("tensorflow", reason="the server needs TensorFlow")  # not on the GPU machine

from tf_frontend.serving.config import BatchingConfig  # noqa: E402
from tests.serving.helpers import save_history_model, start_server  # noqa: E402


@pytest.fixture(scope="session")
def model_base(tmp_path_factory) -> str:
    """``<base>/1`` (scale 1.0) of the history model; tests copy it to add versions."""
    base = tmp_path_factory.mktemp("models") / "recs"
    save_history_model(str(base / "1"), 1.0)
    return str(base)


@pytest.fixture(scope="module")
def server(model_base):
    """A batching server on loopback for the history model."""
    running = start_server(model_base, file_system_poll_wait_seconds=0,
                           batching=BatchingConfig(max_batch_size=16, batch_timeout_micros=20_000,
                                                   max_enqueued_batches=50, num_batch_threads=1),
                           max_request_bytes=64 * 1024, max_history_events=20)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def in_process(model_base):
    """Calls version 1's signature in this process: what the server must answer."""
    import tensorflow as tf

    loaded = tf.saved_model.load(os.path.join(model_base, "1"))

    def call(request: dict, signature: str = "serving_default") -> dict:
        outputs = loaded.signatures[signature](**{k: tf.constant(v) for k, v in request.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    return call
