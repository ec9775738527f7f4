"""Probe: which tiling of the paged prefill kernel is fastest at the engine's cache-hit shapes
(qwen2-0.5b 768 cached + 256 new, qwen3-1.7b 4,000 + 1,000; batch 1, bf16, both mask rules),
for pages of 16 and 64 tokens (a page holding whole key tiles loads each tile with one page
index, through TMA when the tiling asks), and what the rule in
``paged_attention.prefill_config`` picks; then the paged decode (beam 256, the rule's split)
beside the contiguous decode over the same keys (and the paged kernel with none of them
cached). Each launch is checked against the float64 reference (float32 for the decode) before
it is timed, and timed as CUDA-graph replays (the engine captures its searches; eager
launches would time the host).

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

import dataclasses
import importlib
from torch_engine.kernels import paged_attention as kernels
from torch_engine.kernels.decode_attention import PagedPrefix
from torch_engine.kernels.decode_tiling import paged_config_for
from torch_engine.reference import paged_attention as reference
from xgr_common.layout import MaskMode

FLAGS = flags.FLAGS
flags.DEFINE_string("out", ".", "folder for paged_prefill_tilings.json")
flags.DEFINE_list("shapes", ["qwen2-0.5b", "qwen3-1.7b"], "which SHAPES to run")
flags.DEFINE_list("kernels", ["prefill", "decode"], "which kernels to time")
PAGES = (16, 64)
SHAPES = {"qwen2-0.5b": (14, 2, 64, 768, 256), "qwen3-1.7b": (16, 8, 128, 4000, 1000)}
WIDTH = 256
flags.DEFINE_list("pages", [str(p) for p in PAGES], "page sizes (tokens) to run")
flags.DEFINE_bool("all_tilings", False, "also the tilings the rule no longer picks")
# (block_m, block_n, heads, warps, stages, TMA, cached-page loop depth; None: the rule's).
# A depth equal to the kernel's stages is the compiler's split of it between the page index
# and the tile (the tile fetched one step ahead): the rule before page_stages.
TILINGS = [kernels.PagedPrefillConfig(*tiling[:5], tma=tiling[5], page_stages=tiling[6])
           for tiling in ((64, 64, 1, 4, 3, True, None), (64, 64, 1, 4, 3, True, 3),
                          (64, 64, 1, 4, 3, False, None), (64, 64, 1, 4, 2, True, None))]
EARLIER_TILINGS = [kernels.PagedPrefillConfig(*tiling[:5], tma=tiling[5]) for tiling in (
    (64, 64, 1, 4, 2, False), (32, 64, 1, 4, 2, False), (32, 64, 1, 4, 2, True),
    (64, 64, 2, 8, 2, True), (32, 64, 2, 4, 2, True), (16, 64, 8, 8, 2, False),
    (16, 64, 8, 8, 2, True), (8, 64, 8, 4, 2, True))]


def contiguous():
    """The contiguous decode's module (the package exports a function of the same name)."""
    return importlib.import_module("torch_engine.kernels.decode_attention")


def world(hq: int, hkv: int, dim: int, cached: int, suffix: int, page: int) -> dict:
    """One request: its cached tokens on shuffled pages, a packed suffix of 3-token items."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    pages = -(-cached // page)
    rand = lambda *shape: torch.randn(shape, generator=gen, device="cuda").bfloat16()  # noqa
    table = (torch.randperm(pages, generator=gen, device="cuda") + 1).int()[None, :]
    segments = torch.cat([torch.zeros(2), 1 + torch.arange(suffix - 2) // 3]).int().cuda()
    return dict(q=rand(suffix, hq, dim), k=rand(suffix, hkv, dim), v=rand(suffix, hkv, dim),
                cu_seqlens=torch.tensor([0, suffix], dtype=torch.int32, device="cuda"),
                segment_ids=segments, pool_k=rand(pages + 1, page, hkv, dim),
                pool_v=rand(pages + 1, page, hkv, dim), block_table=table,
                cached_lens=torch.tensor([cached], dtype=torch.int32, device="cuda"))


def timed(run, want) -> tuple[float, float]:
    """Microseconds a CUDA-graph replay and the largest error against ``want``."""
    error = float((run().double() - want).abs().max())
    return triton.testing.do_bench_cudagraph(run, rep=200) * 1000, error


def prefill_rows(name: str, shape: tuple, page: int) -> list[dict]:
    hq, hkv, dim, cached, suffix = shape
    inputs = world(hq, hkv, dim, cached, suffix, page)
    chosen = kernels.prefill_config(2)
    rows = []
    for mode in (MaskMode.CAUSAL, MaskMode.ITEM_CAUSAL):
        want = reference.paged_prefill_attention(
            **{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()},
            mode=mode)
        for tiling in TILINGS + (EARLIER_TILINGS if FLAGS.all_tilings else []):
            if tiling.heads > 1 and tiling.heads < hq // hkv:
                continue
            us, error = timed(lambda: kernels.launch_paged_prefill(  # noqa: B023
                **inputs, mode=mode, max_len=suffix, config=tiling), want)
            mark = "  <- rule" if tiling == chosen else ""
            rows.append(dict(kernel="prefill", shape=name, page=page, mode=mode.value,
                             tiling=str(tiling), us=us, max_error=error,
                             chosen=tiling == chosen))
            print(f"prefill {name:11s} page {page:3d} {mode.value:12s} {us:8.1f} us  "
                  f"err {error:.4f}{mark}  {tiling}", flush=True)
    return rows


def decode_rows(name: str, shape: tuple, page: int) -> list[dict]:
    """The paged decode at beam WIDTH (two own tokens a beam) beside the contiguous decode
    over the cached keys and the suffix laid end to end."""
    hq, hkv, dim, cached, suffix = shape
    inputs = world(hq, hkv, dim, cached, suffix, page)
    gen = torch.Generator(device="cuda").manual_seed(1)
    rand = lambda *s: torch.randn(s, generator=gen, device="cuda").bfloat16()  # noqa: E731
    q, beam_k, beam_v = rand(1, WIDTH, hq, dim), rand(1, WIDTH, 2, hkv, dim), rand(
        1, WIDTH, 2, hkv, dim)
    pages = dict(pool_k=inputs["pool_k"], pool_v=inputs["pool_v"],
                 block_table=inputs["block_table"], cached_lens=inputs["cached_lens"])
    # A float32 reference: in float64 the 1.7b shape's reference needs about 20 GiB at once.
    want = reference.paged_decode_attention(
        **{k: v.float() if v.is_floating_point() else v for k, v in dict(
            q=q, shared_k=inputs["k"], shared_v=inputs["v"], cu_seqlens=inputs["cu_seqlens"],
            beam_k=beam_k, beam_v=beam_v, **pages).items()}, num_own=2)
    table = inputs["block_table"][0].long()
    flat = lambda pool: pool[table].flatten(0, 1)[:cached]  # noqa: E731
    keys = torch.cat([flat(inputs["pool_k"]), inputs["k"]])
    values = torch.cat([flat(inputs["pool_v"]), inputs["v"]])
    whole = torch.tensor([0, cached + suffix], dtype=torch.int32, device="cuda")
    config = paged_config_for(1, WIDTH, hq // hkv, hkv, kernels.decode_keys(
        suffix, 1, inputs["block_table"].shape[1], page), dim, q.device)
    paged = PagedPrefix(**pages)
    # The paged kernel over the same keys, none of them cached: what its two-part structure
    # costs apart from reading pages.
    none_cached = dict(pages, cached_lens=torch.zeros_like(inputs["cached_lens"]))
    rows = []
    for kind, run in (
            ("contiguous", lambda: contiguous().decode_attention(q, keys, values, whole, beam_k,
                                                               beam_v, 2)),
            ("paged", lambda: kernels.paged_decode_attention(
                q, inputs["k"], inputs["v"], inputs["cu_seqlens"], **pages, beam_k=beam_k,
                beam_v=beam_v, num_own=2)),
            ("paged, none cached", lambda: kernels.paged_decode_attention(
                q, keys, values, whole, **none_cached, beam_k=beam_k, beam_v=beam_v,
                num_own=2)),
            ("paged, pointer loads", lambda: contiguous().launch_decode(
                q, inputs["k"], inputs["v"], inputs["cu_seqlens"], beam_k, beam_v, 2,
                dim ** -0.5, dataclasses.replace(config, tma=False), paged=paged)),
            ("paged, TMA loads", lambda: contiguous().launch_decode(
                q, inputs["k"], inputs["v"], inputs["cu_seqlens"], beam_k, beam_v, 2,
                dim ** -0.5, dataclasses.replace(config, tma=True), paged=paged)),
            # The page loop at the kernel's own depth: the tile fetched one step ahead.
            ("paged, page loop depth 3", lambda: contiguous().launch_decode(
                q, inputs["k"], inputs["v"], inputs["cu_seqlens"], beam_k, beam_v, 2,
                dim ** -0.5, dataclasses.replace(config, page_stages=config.num_stages),
                paged=paged))):
        us, error = timed(run, want)
        rows.append(dict(kernel=f"decode {kind}", shape=name, page=page, us=us,
                         max_error=error))
        print(f"decode  {name:11s} page {page:3d} {kind:20s} {us:8.1f} us  err {error:.4f}  "
              f"{config}", flush=True)
    return rows


def main(argv: list[str]) -> None:
    del argv
    rows = []
    for name in FLAGS.shapes:
        shape = SHAPES[name]
        for page in [int(p) for p in FLAGS.pages]:
            if "prefill" in FLAGS.kernels:
                rows += prefill_rows(name, shape, page)
            if "decode" in FLAGS.kernels:
                rows += decode_rows(name, shape, page)
    with open(os.path.join(FLAGS.out, "paged_prefill_tilings.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
