"""Probe: a spill and a restore as the host arena makes them (qwen3-1.7b geometry).

The prompt cache's host tier keeps evicted entries in host pages of the pool's geometry, in
chunks of 256 MiB pinned once (``custom_ops/cc/torch_call/torch/host_arena.h``). A spill is a
gather of the entry's pages into a page-major block on the device, then one device-to-host copy
per run of consecutive host pages; a restore copies the pages back into a device block and
scatters it into the pool. This times both for a 63-page entry (~460 MB in bf16) whose host
pages are consecutive and whose host pages are scattered (one copy per page).

    python3 -m experiments.probe_host_arena_copy
"""

from __future__ import annotations

import time

import torch

LAYERS, KV_HEADS, HEAD_DIM, PAGE_TOKENS = 28, 8, 128, 64
CHUNK_BYTES, CHUNKS, ENTRY_PAGES = 256 << 20, 4, 63


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    shape = (LAYERS, 2, PAGE_TOKENS, KV_HEADS, HEAD_DIM)
    pool = torch.randn(LAYERS, 2, 700, *shape[2:], dtype=torch.bfloat16, device="cuda")
    page = pool[:, :, 0].numel() * pool.element_size()
    per_chunk = CHUNK_BYTES // page
    chunks = [torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=True)
              for _ in range(CHUNKS)]
    views = [c[:per_chunk * page].view(torch.bfloat16).view(per_chunk, *shape) for c in chunks]
    index = torch.arange(ENTRY_PAGES, device="cuda")

    def runs(slots):
        start = 0
        while start < len(slots):
            chunk, first = divmod(slots[start], per_chunk)
            run = 1
            while (start + run < len(slots) and slots[start + run] == slots[start] + run
                   and first + run < per_chunk):
                run += 1
            yield start, views[chunk][first:first + run]
            start += run

    def spill(slots):
        gathered = pool.index_select(2, index).permute(2, 0, 1, 3, 4, 5).contiguous()
        for start, host in runs(slots):
            host.copy_(gathered[start:start + len(host)])

    def restore(slots):
        staged = torch.empty(len(slots), *shape, dtype=torch.bfloat16, device="cuda")
        for start, host in runs(slots):
            staged[start:start + len(host)].copy_(host)
        targets = torch.arange(100, 100 + len(slots), device="cuda")
        pool.index_copy_(2, targets, staged.permute(1, 2, 0, 3, 4, 5))

    print(f"page {page / 1e6:.2f} MB, {per_chunk} pages a chunk, entry {ENTRY_PAGES} pages")
    layouts = {"consecutive": list(range(ENTRY_PAGES)),
               "scattered": [(i * 7) % (CHUNKS * per_chunk) for i in range(ENTRY_PAGES)]}
    for name, slots in layouts.items():
        spills = [timed(lambda: spill(slots)) for _ in range(6)]
        restores = [timed(lambda: restore(slots)) for _ in range(4)]
        print(f"{name:12s} spill ms {[round(x, 2) for x in spills]} "
              f"restore ms {[round(x, 2) for x in restores]}")


if __name__ == "__main__":
    main()
