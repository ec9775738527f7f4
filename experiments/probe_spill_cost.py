"""Probe: what one eviction into the prompt cache's host tier costs on the request path.

The served cache spills an evicted user's frozen part (qwen3-1.7b, 4,001 tokens: 63 pages of
64 tokens, ~460 MB in bf16) to pinned host memory before the request that evicted it runs.
This times each piece of that spill (the page gather on the device, a fresh pinned
allocation, the device-to-host copy) and the restore, for fresh allocations (a host tier that
is still filling) and for reused ones (a full tier dropping its oldest entry).

    python3 -m experiments.probe_spill_cost [--entries=8] [--out=experiments/results]
    python3 -m experiments.probe_spill_cost --register_threads=8   # the lever to compare

``--register_threads`` pins host memory by registering ordinary pages with that many threads
(``PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:N``)
instead of one ``cudaHostAlloc``: if the fresh allocation dominates a spill, this is the
setting ``xgr serve`` would give a server with a host tier.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
from absl import app, flags

flags.DEFINE_integer("entries", 8, "Entries spilled, then restored.")
flags.DEFINE_integer("entry_pages", 63, "Pages of one entry (64 tokens each).")
flags.DEFINE_integer("pool_pages", 600, "Pages of the device pool.")
flags.DEFINE_string("out", None, "Folder for the result JSON (none: printed only).")
flags.DEFINE_integer("register_threads", 0, "Pin by registering pages with this many threads "
                     "(0: the allocator's default, cudaHostAlloc).")
FLAGS = flags.FLAGS

LAYERS, KV_HEADS, HEAD_DIM, PAGE_TOKENS = 28, 8, 128, 64


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, (time.perf_counter() - start) * 1e3


def main(argv: list[str]) -> None:
    del argv
    args = FLAGS
    if args.register_threads:     # read when the host allocator is first used, below
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = (
            f"pinned_use_cuda_host_register:True,"
            f"pinned_num_register_threads:{args.register_threads}")
    pool = torch.zeros(LAYERS, 2, args.pool_pages, PAGE_TOKENS, KV_HEADS, HEAD_DIM,
                       dtype=torch.bfloat16, device="cuda")
    tokens = args.entry_pages * PAGE_TOKENS - 31
    rows = {"gather_ms": [], "pinned_alloc_fresh_ms": [], "d2h_ms": [], "pinned_alloc_reused_ms": [],
            "h2d_restore_ms": [], "pageable_alloc_ms": [], "d2h_pageable_ms": []}
    kept = []
    for entry in range(args.entries):
        pages = torch.arange(entry * args.entry_pages, (entry + 1) * args.entry_pages,
                             device="cuda") % args.pool_pages
        kv, ms = timed(lambda: pool.index_select(2, pages).flatten(2, 3).narrow(2, 0, tokens))
        rows["gather_ms"].append(ms)
        host, ms = timed(lambda: torch.empty(kv.shape, dtype=kv.dtype, pin_memory=True))
        rows["pinned_alloc_fresh_ms"].append(ms)
        _, ms = timed(lambda: host.copy_(kv))
        rows["d2h_ms"].append(ms)
        kept.append(host)
        plain, ms = timed(lambda: torch.empty(kv.shape, dtype=kv.dtype))
        rows["pageable_alloc_ms"].append(ms)
        _, ms = timed(lambda: plain.copy_(kv))
        rows["d2h_pageable_ms"].append(ms)
        del plain
    for host in kept:
        _, ms = timed(lambda: pool.narrow(2, 0, args.entry_pages).flatten(2, 3)
                      .narrow(2, 0, tokens).copy_(host))
        rows["h2d_restore_ms"].append(ms)
    kept.clear()   # back to the caching host allocator
    for _ in range(args.entries):
        host, ms = timed(lambda: torch.empty((LAYERS, 2, tokens, KV_HEADS, HEAD_DIM),
                                             dtype=torch.bfloat16, pin_memory=True))
        rows["pinned_alloc_reused_ms"].append(ms)
        kept.append(host)
    mb = LAYERS * 2 * tokens * KV_HEADS * HEAD_DIM * 2 / 1e6
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}: entry {tokens} tokens, "
          f"{mb:.0f} MB")
    print(f"{'step':<26}{'first':>10}{'median':>10}{'max':>10}")
    for name, values in rows.items():
        print(f"{name:<26}{values[0]:>10.2f}{statistics.median(values):>10.2f}{max(values):>10.2f}")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "register_threads": args.register_threads,
              "commit": os.environ.get("XGR_COMMIT"), "entry_mb": mb,
              "rows": {k: [round(v, 3) for v in vals] for k, vals in rows.items()}}
    print(json.dumps(result))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"spill_cost_register{args.register_threads}.json"
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    app.run(main)
