"""Hand-offs that abort the whole process when done with raw DLPack, run in child processes.

One child runs every guarded case and prints one line per case; each test checks its line, so
a regression that aborts the child shows up as that case (and the ones after it) failing. Two
controls prove the hazards are real: the same hand-offs done with raw DLPack kill the child.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.child_env import child_env

# Heavy (child processes that are meant to abort): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]

GUARDED = textwrap.dedent("""
    import numpy as np, tensorflow as tf, torch
    from bridge.dlpack import to_tf, to_torch, tf_data_pointer
    from xgr_common.errors import BridgeError

    def rejected(name, make):
        try:
            to_torch(make())
        except BridgeError as error:
            print(name, "rejected", str(error).split(":")[1].strip(), flush=True)

    rejected("string", lambda: tf.constant(["us", "gb"]))
    rejected("resource", lambda: tf.Variable(1.0).handle)
    rejected("variant", lambda: tf.data.Dataset.range(3)._variant_tensor)

    base = torch.arange(257, dtype=torch.float32)
    x = to_tf(base[1:].reshape(16, 16))
    # Each of these aborted the process (Check failed: IsAligned()) on unaligned input.
    total = float(tf.reduce_sum(x))
    plus = float(tf.reduce_sum(x + 1.0))
    matmul = float(tf.reduce_sum(tf.matmul(x, x)))
    gathered = tf.gather(x, [0, 15]).numpy()
    expected = base[1:].reshape(16, 16).double()
    ok = (total == float(expected.sum()) and plus == total + 256
          and abs(matmul - float((expected @ expected).sum())) <= 1e-6 * abs(matmul)
          and (gathered == expected[[0, 15]].float().numpy()).all())
    print("unaligned", "ok" if ok else "wrong", tf_data_pointer(x) % 64, flush=True)

    array = np.arange(1, 65, dtype=np.float32)[1:]
    y = to_tf(torch.from_numpy(array))
    print("numpy_backed", "ok" if float(tf.reduce_sum(y)) == float(array.sum()) else "wrong",
          flush=True)
""")

RAW = {
    "string": "import tensorflow as tf, torch\n"
              "torch.from_dlpack(tf.constant(['us']))\nprint('survived')",
    "unaligned": "import tensorflow as tf, torch\n"
                 "x = tf.experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack("
                 "torch.arange(257.)[1:]))\nprint(float(tf.reduce_sum(x)))\nprint('survived')",
}


def _run(code: str) -> subprocess.CompletedProcess:
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)


@pytest.fixture(scope="module")
def guarded_lines() -> dict[str, list[str]]:
    result = _run(GUARDED)
    assert result.returncode == 0, f"child exited {result.returncode}:\n{result.stderr[-3000:]}"
    return {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()}


@pytest.mark.parametrize("dtype", ["string", "resource", "variant"])
def test_unexportable_tf_dtypes_raise_instead_of_aborting(guarded_lines, dtype):
    assert " ".join(guarded_lines[dtype]) == f"rejected a {dtype} tensor cannot cross the bridge"


def test_unaligned_torch_memory_survives_tf_kernels(guarded_lines):
    assert guarded_lines["unaligned"] == ["ok", "0"]


def test_numpy_backed_torch_memory_survives_tf_kernels(guarded_lines):
    assert guarded_lines["numpy_backed"] == ["ok"]


@pytest.mark.parametrize("case", RAW)
def test_raw_dlpack_really_aborts(case):
    """The control: without the bridge these hand-offs kill the process (so the guards matter)."""
    result = _run(RAW[case])
    assert result.returncode != 0 and "survived" not in result.stdout
    assert "Check failed" in result.stderr
