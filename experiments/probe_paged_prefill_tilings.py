"""Probe: which tiling of the paged prefill kernel is fastest at the engine's cache-hit shapes
(qwen2-0.5b 768 cached + 256 new, qwen3-1.7b 4,000 + 1,000; batch 1, bf16, both mask rules),
and what the rule in ``paged_attention.prefill_config`` picks. Each tiling is checked against
the float64 reference before it is timed, and timed as CUDA-graph replays (the engine
captures its searches; eager launches would time the host).

    python -m experiments.probe_paged_prefill_tilings [--out DIR]

Prints a table; writes ``paged_prefill_tilings.json`` into ``--out`` (default the current
folder). Needs a CUDA device.
"""

from __future__ import annotations

import json
import os

import torch
import triton.testing
from absl import app, flags

from torch_engine.kernels import paged_attention as kernels
from torch_engine.reference import paged_attention as reference
from xgr_common.layout import MaskMode

FLAGS = flags.FLAGS
flags.DEFINE_string("out", ".", "folder for paged_prefill_tilings.json")
SHAPES = {"qwen2-0.5b": (14, 2, 64, 768, 256), "qwen3-1.7b": (16, 8, 128, 4000, 1000)}
PAGE = 16
TILINGS = [kernels.PagedPrefillConfig(*tiling) for tiling in (
    (64, 64, 1, 4, 2), (32, 64, 1, 4, 2), (64, 64, 2, 8, 2), (32, 64, 2, 4, 2),
    (64, 64, 2, 8, 3), (16, 64, 8, 8, 2), (8, 64, 8, 4, 2))]


def world(hq: int, hkv: int, dim: int, cached: int, suffix: int) -> dict:
    """One request: its cached tokens on shuffled pages, a packed suffix of 3-token items."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    pages = -(-cached // PAGE)
    rand = lambda *shape: torch.randn(shape, generator=gen, device="cuda").bfloat16()  # noqa
    table = (torch.randperm(pages, generator=gen, device="cuda") + 1).int()[None, :]
    segments = torch.cat([torch.zeros(2), 1 + torch.arange(suffix - 2) // 3]).int().cuda()
    return dict(q=rand(suffix, hq, dim), k=rand(suffix, hkv, dim), v=rand(suffix, hkv, dim),
                cu_seqlens=torch.tensor([0, suffix], dtype=torch.int32, device="cuda"),
                segment_ids=segments, pool_k=rand(pages + 1, PAGE, hkv, dim),
                pool_v=rand(pages + 1, PAGE, hkv, dim), block_table=table,
                cached_lens=torch.tensor([cached], dtype=torch.int32, device="cuda"))


def main(argv: list[str]) -> None:
    del argv
    rows = []
    for name, (hq, hkv, dim, cached, suffix) in SHAPES.items():
        inputs = world(hq, hkv, dim, cached, suffix)
        chosen = kernels.prefill_config(1, suffix, hq // hkv, hkv, 2, torch.device("cuda"))
        shared = kernels.prefill_config(1, suffix, hq // hkv, hkv, 2, torch.device("cuda"),
                                        share_group=True)
        for mode in (MaskMode.CAUSAL, MaskMode.ITEM_CAUSAL):
            want = reference.paged_prefill_attention(
                **{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()},
                mode=mode)
            for tiling in TILINGS:
                if tiling.heads > 1 and tiling.heads < hq // hkv:
                    continue
                run = lambda: kernels.launch_paged_prefill(  # noqa: E731
                    **inputs, mode=mode, max_len=suffix, config=tiling)
                error = float((run().double() - want).abs().max())
                # Replayed from a CUDA graph, as the engine runs it: an eager launch through the
                # op's dispatch costs more host time than the kernel takes.
                us = triton.testing.do_bench_cudagraph(run, rep=200) * 1000
                mark = ("  <- rule" if tiling == chosen else "") + (
                    "  <- rule, group shared" if tiling == shared else "")
                rows.append(dict(shape=name, mode=mode.value, tiling=str(tiling), us=us,
                                 max_error=error, chosen=tiling == chosen,
                                 chosen_sharing=tiling == shared))
                print(f"{name:11s} {mode.value:12s} {us:8.1f} us  err {error:.4f}{mark}  "
                      f"{tiling}", flush=True)
    with open(os.path.join(FLAGS.out, "paged_prefill_tilings.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
