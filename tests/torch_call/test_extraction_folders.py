"""A TF process that ran an AOTInductor package through TorchCall leaves no extraction folder.

Torch unpacks a ``.pt2`` package into a temporary folder and removes it only when its loader
is destroyed; TorchCall keeps loaders for the life of the process (its kernels may run until
the very end), so the op removes the folders itself when the process exits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.child_env import child_env

# Runs the package once, prints the folder its library is mapped from, exits normally.
_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    from custom_ops.torch_call import torch_call

    x = np.ones((2, 4), np.float32)
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    y, z = torch_call(sys.argv[1], [x, ids], [tf.float32, tf.int64])
    assert y.shape == (2, 3) and z.shape[0] == 2, (y.shape, z.shape)
    with open("/proc/self/maps") as maps:
        [library] = {line.split()[-1] for line in maps if line.rstrip().endswith(".wrapper.so")}
    print(library)
""")


def test_a_process_that_ran_a_package_leaves_no_extraction_folder(packages, tmp_path):
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(packages["two_heads_aoti"].path)],
        env=child_env(TMPDIR=str(temp_dir), TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    library = Path(done.stdout.split()[-1])
    assert library.name.endswith(".wrapper.so")
    assert not library.exists(), f"{library} outlived its process"
    # Where this torch honours TMPDIR the folder was made there: nothing may remain.
    left = sorted(str(p.relative_to(temp_dir)) for p in temp_dir.rglob("*"))
    assert left == [] or not str(library).startswith(str(temp_dir)), left
    assert not library.parent.exists()
