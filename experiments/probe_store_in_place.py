"""Probe: does compiled code write a miss's KV into the pool in place, with this torch?

A served cached package writes each miss's prompt KV into the prompt-KV pool, an input of its
program. Inductor turns that functional write back into an in-place one only under its
reinplacing rule; otherwise it allocates a copy of the whole pool. The rule differs between
torch versions for a write into a *view* of an input. This compiles two stores with
``torch.compile`` (the same passes as AOTInductor) and reports each call's peak device memory
beside the pool's size, and whether both wrote the same pages:

- ``view``: ``pool.view(-1, Hkv, D).index_copy_`` (the store before it was changed);
- ``pool``: ``CachedPrefix.store``, an ``index_put_`` into the pool itself.

    python3 -m experiments.probe_store_in_place [--out result.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from torch_engine.kv_cache import CachedPrefix, SharedKV

LAYERS, PAGES, PAGE_TOKENS, KV_HEADS, HEAD_DIM, SUFFIX = 4, 4096, 64, 8, 128, 512


def store_into_view(pool: torch.Tensor, packed: torch.Tensor, slots: torch.Tensor) -> None:
    stride = pool.shape[2] * pool.shape[3]
    kv = packed.flatten(0, 2)
    base = torch.arange(pool.shape[0] * 2, device=slots.device) * stride
    flat = (base[:, None] + slots[None, :]).reshape(-1)
    pool.view(-1, *pool.shape[4:]).index_copy_(0, flat, kv)


def store_into_pool(pool: torch.Tensor, packed: torch.Tensor, slots: torch.Tensor) -> None:
    CachedPrefix(pool=pool, block_table=slots[None, :1].int(), lengths=slots[:1],
                 longest=None).store(SharedKV(keys=[], values=[], packed=packed), slots)


def measure(store, pool: torch.Tensor, packed: torch.Tensor, slots: torch.Tensor) -> dict:
    compiled = torch.compile(store, fullgraph=True)
    compiled(pool, packed, slots)                 # compiles
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    compiled(pool, packed, slots)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    return {"extra_bytes": int(extra), "pool_bytes": pool.numel() * pool.element_size(),
            "copies_the_pool": bool(extra >= pool.numel() * pool.element_size() // 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (LAYERS, 2, PAGES + 1, PAGE_TOKENS, KV_HEADS, HEAD_DIM)
    packed = torch.randn(LAYERS, 2, SUFFIX, KV_HEADS, HEAD_DIM, device=device,
                         dtype=torch.bfloat16, generator=gen)
    slots = torch.randperm((PAGES + 1) * PAGE_TOKENS, device=device, generator=gen)[:SUFFIX]
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "pool_shape": list(shape)}
    pools = {}
    for name, store in (("view", store_into_view), ("pool", store_into_pool)):
        pool = torch.zeros(shape, device=device, dtype=torch.bfloat16)
        result[name] = measure(store, pool, packed, slots)
        pools[name] = pool
        print(name, result[name], flush=True)
    result["same_pages"] = bool(torch.equal(pools["view"], pools["pool"]))
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as stream:
            json.dump(result, stream, indent=1)


if __name__ == "__main__":
    main()
