"""A CUDA package that keeps a prompt cache traces the paged attention kernels into its
program (each a ``torch.library.triton_op``, so AOTInductor embeds them) with the suffix
width, the block table and the pool's pages left dynamic: the runtime sizes them per call.
Traced on the CPU in a child with the Triton interpreter off (``trace_cached_child.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.child_env import ROOT, child_env


def test_the_cached_search_traces_the_paged_kernels():
    env = child_env()
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "export" /
                                               "trace_cached_child.py")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    traced = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"_paged_prefill_kernel", "_decode_partial_kernel"} <= set(traced["kernels"])
    assert traced["symbolic"] == {"suffix": True, "pages": True, "pool": True}
    assert traced["cache_line"][0].startswith("cache runtime=5 page_tokens=64")
    # Every runtime-sized dimension bounded: a pool of more than 2**31 elements (4 GiB in
    # bf16) must get 64-bit indexing, not the 32 bits its small example would choose.
    assert traced["unbounded"] == []
    # A miss's store writes into the pool input itself, which Inductor updates in place. A
    # write into a view of the pool is compiled (before torch 2.13, as on the GPU host) as
    # a copy of the whole pool: twice its memory, two passes over it per call.
    # Nothing reads the old pool after the write (the prefill's kernels read it before).
    [write] = traced["pool_writes"]
    assert (write["op"], write["onto"], write["reads_after"]) == \
        ("aten.index_put.default", "input", []), write
