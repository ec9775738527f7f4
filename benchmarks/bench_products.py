"""A decode step's output and down projections: library products against split-depth ones.

    python3 benchmarks/bench_products.py --out=benchmarks/results

At decode a layer's output projection is followed by the residual add and the post-attention
RMSNorm, and its down projection by the residual add and the next layer's input RMSNorm. Each
block is timed as the engine runs it:

* ``library``: ``F.linear`` then ``layer_ops.add_rms_norm`` (output projection); ``addmm_``
  with the residual as beta = 1 then ``layer_ops.rms_norm`` (down projection), the engine's
  path with ``EngineConfig.splitk_rows = 0``; also with cuBLASLt preferred;
* ``split``: ``splitk_products.product_partials`` then ``add_partials`` with the norm, for a
  grid of tiles and splits (the default tile marked).

Blocks of 8 layers' distinct weights (so the weights come from memory, not L2) replayed in one
CUDA graph, median of 10 replays, microseconds per block, bf16. Writes
``products_<date>[_<tag>].json`` and prints a table.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.engine_analysis import capture, device_ms  # noqa: E402
from torch_engine.config import preset  # noqa: E402
from torch_engine.kernels import layer_ops  # noqa: E402
from torch_engine.kernels import splitk_products as sk  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results", "folder for products_<date>[_<tag>].json")
flags.DEFINE_string("tag", "", "suffix of the result file name")
flags.DEFINE_list("presets", ["qwen2-0.5b", "qwen3-1.7b"], "model shapes")
flags.DEFINE_list("rows", ["256", "2048"], "rows per product (batch x beams)")
flags.DEFINE_integer("layers", 8, "distinct weight sets per replay")

EPS = 1e-6


def _time_us(fn, layers: int) -> float:
    graph = capture(fn)
    per_block = float(np.median(device_ms(graph.replay, 10))) * 1e3 / layers
    del graph
    return per_block


def _configs(rows: int, cols: int, depth: int, device) -> list[sk.SplitKConfig]:
    default = sk.splitk_config_for(rows, cols, depth, device)
    grid = [default]
    for bm, bn, bk, stages, factor in itertools.product((64, 128), (64, 128), (64, 128),
                                                        (3, 4), (0.5, 1, 2)):
        tiles = -(-rows // bm) * -(-cols // bn)
        splits = max(1, min(depth // (2 * bk),
                            round(factor * torch.cuda.get_device_properties(device)
                                  .multi_processor_count / tiles)))
        warps = 8 if bm == 128 else 4
        config = sk.SplitKConfig(bm, bn, bk, splits, warps, stages)
        if config not in grid and not (bm == 128 and bk == 128 and stages == 4):
            grid.append(config)
    return grid


def block_rows(name: str, rows: int, device) -> list[dict]:
    cfg = preset(name)
    hidden, attn_width, inter = cfg.hidden_size, cfg.num_heads * cfg.head_dim, \
        cfg.intermediate_size
    layers = FLAGS.layers
    dt = torch.bfloat16
    out = []
    for block, depth in (("o_proj + add_rms_norm", attn_width),
                         ("down_proj + add + next rms_norm", inter)):
        xs = torch.randn(rows, depth, device=device, dtype=dt)
        weights = [torch.randn(hidden, depth, device=device, dtype=dt) * 0.02
                   for _ in range(layers)]
        residual = torch.randn(rows, hidden, device=device, dtype=dt)
        norm_w = torch.rand(hidden, device=device, dtype=dt) + 0.5
        if block.startswith("o_proj"):
            def library():
                for w in weights:
                    layer_ops.add_rms_norm(residual, F.linear(xs, w), norm_w, EPS)
        else:
            acc = residual.clone()

            def library():
                for w in weights:
                    acc.addmm_(xs, w.t())
                    layer_ops.rms_norm(acc, norm_w, EPS)
        timings = {"library": _time_us(library, layers)}
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            timings["library, cuBLASLt preferred"] = _time_us(library, layers)
        finally:
            torch.backends.cuda.preferred_blas_library("cublas")
        splits = {}
        default = sk.splitk_config_for(rows, hidden, depth, device)
        for config in _configs(rows, hidden, depth, device):
            def split():
                for w in weights:
                    sk.add_partials(residual, sk.product_partials(xs, w, config), norm_w, EPS)
            try:
                splits[config] = _time_us(split, layers)
            except Exception as err:  # a tile that does not fit (shared memory) is skipped
                print(f"skipped {config}: {type(err).__name__}", flush=True)
        best = min(splits, key=splits.get)
        flops = 2 * rows * hidden * depth
        row = {"preset": name, "rows": rows, "block": block, "out_features": hidden,
               "in_features": depth, **{f"{k}_us": v for k, v in timings.items()},
               "split_default_us": splits.get(default), "split_default": vars(default),
               "split_best_us": splits[best], "split_best": vars(best),
               "split_grid": [{**vars(k), "us": v} for k, v in splits.items()],
               "best_over_library": splits[best] / timings["library"],
               "default_over_library": (splits[default] / timings["library"]
                                        if default in splits else None),
               "product_tflops_at_best": flops / splits[best] / 1e6}
        print(f"{name:12s} rows {rows:5d} {block:34s} library {timings['library']:7.2f} us  "
              f"Lt {timings['library, cuBLASLt preferred']:7.2f}  split default "
              f"{row['split_default_us'] or float('nan'):7.2f}  best {splits[best]:7.2f} "
              f"({best.block_m}x{best.block_n}x{best.block_k} s{best.splits} "
              f"st{best.num_stages})", flush=True)
        out.append(row)
    return out


def main(argv: list[str]) -> None:
    del argv
    device = torch.device("cuda")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "dtype": "bfloat16",
              "layers_per_replay": FLAGS.layers, "blocks": []}
    for name in FLAGS.presets:
        for rows in (int(r) for r in FLAGS.rows):
            result["blocks"] += block_rows(name, rows, device)
    os.makedirs(FLAGS.out, exist_ok=True)
    suffix = f"_{FLAGS.tag}" if FLAGS.tag else ""
    path = os.path.join(FLAGS.out, f"products_{datetime.date.today().isoformat()}{suffix}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
