"""A package lives while a model version that ran it is loaded: unloading the last SavedModel
that holds it frees the package (and, on CUDA, its graphs and their memory) and removes its
extracted files. Folders left by a process that was killed are removed by the next process
that loads a package."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.child_env import child_env

# Saves a SavedModel calling the package (an asset), loads it, runs it, unloads it; prints
# what TorchCall holds and the extraction folder before and after.
_CHILD = textwrap.dedent("""
    import gc, json, os, sys
    import numpy as np
    import tensorflow as tf
    from custom_ops.torch_call import package_stats, torch_call

    package, out = sys.argv[1], sys.argv[2]

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.package = tf.saved_model.Asset(package)

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                      tf.TensorSpec([None, 3], tf.int64)])
        def serve(self, x, ids):
            return torch_call(self.package, [x, ids], [tf.float32, tf.int64])

    tf.saved_model.save(Model(), out)
    loaded = tf.saved_model.load(out)
    asset = os.path.join(out, "assets", os.path.basename(package))
    y, _ = loaded.serve(np.ones((2, 4), np.float32), np.zeros((2, 3), np.int64))
    with open("/proc/self/maps") as maps:
        [library] = {line.split()[-1] for line in maps if line.rstrip().endswith(".wrapper.so")}
    before = {"held": asset in package_stats(), "library": os.path.exists(library)}
    del loaded, y
    gc.collect()
    after = {"held": asset in package_stats(), "library": os.path.exists(library)}
    print(json.dumps({"before": before, "after": after}))
""")


def test_unloading_the_last_version_frees_its_package_and_files(packages, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(packages["two_heads_aoti"].path),
         str(tmp_path / "model")], env=child_env(TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] == {"held": True, "library": True}, out
    assert out["after"] == {"held": False, "library": False}, out


_LOAD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    from custom_ops.torch_call import torch_call

    torch_call(sys.argv[1], [np.ones((2, 4), np.float32), np.zeros((2, 3), np.int64)],
               [tf.float32, tf.int64])
""")


def test_folders_of_a_dead_process_are_removed_by_the_next_load(packages, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = temp / "tmpstale"
    (stale / "data").mkdir(parents=True)
    (stale / "xgr_torch_call.owner").write_text(f"{dead} 12345\n")
    mine = temp / "tmpalive"
    mine.mkdir()
    start = open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]
    (mine / "xgr_torch_call.owner").write_text(f"{__import__('os').getpid()} {start}\n")
    foreign = temp / "someone_elses"
    foreign.mkdir()
    done = subprocess.run([sys.executable, "-c", _LOAD, str(packages["two_heads_aoti"].path)],
                          env=child_env(TMPDIR=str(temp), TF_CPP_MIN_LOG_LEVEL="3"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not stale.exists()               # its process is gone
    assert mine.exists() and foreign.exists()  # a live owner's, and one without a mark
