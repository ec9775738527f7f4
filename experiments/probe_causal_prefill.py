"""Plain causal prefill attention: the engine's Triton kernel against the library kernels it
could hand causal prompts to, on the packed layout the engine holds.

    python -m experiments.probe_causal_prefill --out=experiments/results

For causal prompts (no segment ids) the engine's prefill could call a library kernel instead
of its own segmented-mask kernel. This probe times, at the heads of qwen2-0.5b and qwen3-1.7b
and the engine's prefill shapes (batch 1 at 1000 / 5000 tokens, batch 8 x 1024):

* ``triton``: ``torch_engine.kernels.prefill_attention`` in causal mode on packed rows;
* ``flash_varlen``: ``aten._flash_attention_forward`` on the same packed rows (cumulative
  offsets, grouped KV heads, causal): the layout needs no copy;
* ``cudnn_varlen``: ``aten._cudnn_attention_forward`` on the same packed rows and offsets
  (cuDNN's ragged layout), where this torch has it;
* ``sdpa_gqa`` / ``sdpa_cudnn``: SDPA ``is_causal`` with ``enable_gqa`` on ``[B, H, L, D]`` views
  of uniform-length rows (default backend choice / cuDNN forced);
* ``sdpa_expanded``: SDPA ``is_causal`` on KV heads repeated to the query heads, contiguous
  (the yardstick of ``bench_attention.py``).

Each in a CUDA graph of 10 calls, median of 10 replays; the largest relative error against
the float32 SDPA result. Writes ``causal_prefill_<date>.json``.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from absl import app, flags

from benchmarks import engine_analysis as ea
from benchmarks import results_file as rf
from torch_engine.config import preset
from torch_engine.kernels.prefill_attention import prefill_attention
from xgr_common.layout import MaskMode

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "experiments/results", "folder for causal_prefill_<date>.json")
SHAPES = ((1, 1000), (1, 5000), (8, 1024))
REPEAT = 10


def timed_us(fn) -> float:
    graph = ea.capture(fn, REPEAT)
    return statistics.median(ea.device_ms(graph.replay, 10)) * 1e3 / REPEAT


def variants(q, k, v, batch: int, length: int):
    """name -> callable returning [T, Hq, D], on packed q [T, Hq, D], k, v [T, Hkv, D]."""
    device = q.device
    cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)
    segments = torch.zeros(q.shape[0], dtype=torch.int32, device=device)
    hq, hkv, dim = q.shape[1], k.shape[1], q.shape[2]
    group = hq // hkv

    def view(t):
        return t.view(batch, length, t.shape[1], dim).transpose(1, 2)

    def back(t):
        return t.transpose(1, 2).reshape(batch * length, hq, dim)

    kx = k.repeat_interleave(group, 1)
    vx = v.repeat_interleave(group, 1)
    qc, kc, vc = (view(t).contiguous() for t in (q, kx, vx))
    out = {
        "triton": lambda: prefill_attention(q, k, v, cu, segments, MaskMode.CAUSAL, None),
        "flash_varlen": lambda: torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, length, length, 0.0, True, False)[0],
        "cudnn_varlen": lambda: torch.ops.aten._cudnn_attention_forward(
            q, k, v, None, cu, cu, length, length, False, 0.0, True, False)[0],
        "sdpa_gqa": lambda: back(F.scaled_dot_product_attention(
            view(q), view(k), view(v), is_causal=True, enable_gqa=True)),
        "sdpa_expanded": lambda: back(F.scaled_dot_product_attention(qc, kc, vc,
                                                                     is_causal=True)),
    }

    def cudnn():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return back(F.scaled_dot_product_attention(view(q), view(k), view(v),
                                                       is_causal=True, enable_gqa=True))
    out["sdpa_cudnn"] = cudnn
    return out


def main(argv):
    del argv
    device = torch.device("cuda")
    rows = []
    for name in ("qwen2-0.5b", "qwen3-1.7b"):
        cfg = preset(name)
        for batch, length in SHAPES:
            gen = torch.Generator(device=device).manual_seed(batch * length)
            tokens = batch * length
            q, k, v = (torch.randn(tokens, h, cfg.head_dim, device=device, generator=gen,
                                   dtype=torch.bfloat16)
                       for h in (cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads))
            fns = variants(q, k, v, batch, length)
            want = fns["sdpa_expanded"]().float()
            row = {"heads": name, "batch": batch, "length": length}
            for variant, fn in fns.items():
                try:
                    got = fn().float()
                    err = float(((got - want).abs().max() / want.abs().max()))
                    row[variant] = {"us": timed_us(fn), "max_rel_err": err}
                except Exception as error:   # one failing library path must not hide others
                    row[variant] = {"failed": f"{type(error).__name__}: {error}"[:300]}
            rows.append(row)
            cells = ", ".join(f"{k} {v['us']:.1f}" if "us" in v else f"{k} failed"
                              for k, v in row.items() if isinstance(v, dict))
            print(f"{name} b{batch} L{length}: {cells}", flush=True)
    result = {"date": rf.utc_now(),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "dtype": "bfloat16", "calls_per_replay": REPEAT, "rows": rows}
    rf.write_result(FLAGS.out, "causal_prefill", result, indent=2)
    for row in rows:
        print(row)


if __name__ == "__main__":
    app.run(main)
