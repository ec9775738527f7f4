"""The least a qwen3-1.7b search could take here with every lever the engine notes name.

    python -m experiments.probe_search_bound --bound_out=experiments/results

``bench_engine.py --stages=floor`` shows a search's matrix products alone at the board's
sustained power. This probe adds only the work a search cannot drop, each step in the fastest
form available on this machine, and times that chain in one CUDA graph:

* the products, as ``engine_analysis.products_chain`` issues them;
* prefill attention through SDPA's causal kernel (cuDNN) for the whole batch, as the
  engine's request-major static packing does;
* prefill's last layer and the decode steps through the xAttention decode kernel;
* SwiGLU as ``layer_ops.silu_mul``.

Left out, as if free:
* the q/k/v split, rotary and KV write (``qkv_rotary``);
* the input rules, the selection, the item expansion and the beam KV reorder.

So the time is a lower bound for the engine's search at these shapes. It is printed beside
the products alone and the case's target. Writes ``search_bound_<date>.json``.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
import triton
from absl import app, flags

from benchmarks import engine_analysis as ea
from benchmarks import results_file as rf
from torch_engine.config import preset
from torch_engine.kernels import layer_ops
from torch_engine.kernels.decode_attention import decode_attention
from xgr_common.buckets import round_up

FLAGS = flags.FLAGS
flags.DEFINE_string("bound_out", "experiments/results", "folder for search_bound_<date>.json")
flags.DEFINE_string("preset", "qwen3-1.7b", "model shapes")
flags.DEFINE_list("cases", ["8:1000:60", "1:5000:35", "1:1000:10"],
                  "batch:prompt tokens:target ms per case")
flags.DEFINE_integer("repeats", 20, "timed replays")

BEAM, LEVELS, LENGTH_BUCKET = 256, 3, 256


def attention_hooks(cfg, batch: int, prompt: int, width: int, device):
    """``after_qkv`` doing each pass's attention on random tensors of the engine's shapes."""
    hq, hkv, dim, layers = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    gen = torch.Generator(device=device).manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=gen)
    q = rand(batch, width, hq, dim)
    k, v = rand(batch, width, hkv, dim), rand(batch, width, hkv, dim)
    shared_k, shared_v = k.view(batch * width, hkv, dim), v.view(batch * width, hkv, dim)
    # Compact packing, as the engine's decode reads it: request b at b * prompt.
    cu = torch.arange(batch + 1, device=device, dtype=torch.int32) * prompt
    q_last = rand(batch, 1, hq, dim)
    q_beams = rand(batch, BEAM, hq, dim)
    beam_k, beam_v = (rand(batch, BEAM, LEVELS - 1, hkv, dim) for _ in range(2))
    none = rand(batch, 1, 1, hkv, dim)

    def after_qkv(i: int) -> None:
        if i < layers - 1:
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True, enable_gqa=True)
        elif i == layers - 1:
            decode_attention(q_last, shared_k, shared_v, cu, none, none, 0)
        else:
            step = 1 + (i - layers) // layers
            decode_attention(q_beams, shared_k, shared_v, cu, beam_k, beam_v, step)
    return after_qkv


def main(argv: list[str]) -> None:
    del argv
    device = torch.device("cuda")
    cfg = preset(FLAGS.preset)
    rows = []
    for case in FLAGS.cases:
        batch, prompt, target = case.split(":")
        batch, prompt, target = int(batch), int(prompt), float(target)
        width = round_up(prompt, LENGTH_BUCKET)
        shape = (cfg, batch, batch * width, BEAM, LEVELS, FLAGS.repeats, device)
        products, _, products_power = ea.time_products_chain(*shape)
        bound, _, bound_power = ea.time_products_chain(
            *shape, after_qkv=attention_hooks(cfg, batch, prompt, width, device),
            after_gate_up=lambda i, gate_up, x: layer_ops.silu_mul(gate_up, inputs=x))
        row = {"preset": FLAGS.preset, "batch": batch, "prompt": prompt, "bucket_width": width,
               "target_ms": target, "products_ms": products, "bound_ms": bound,
               "bound_over_target": bound / target, "products_power": products_power,
               "bound_power": bound_power}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"date": rf.utc_now(), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
    print(f"wrote {rf.write_result(FLAGS.bound_out, 'search_bound', result)}")
    print("| batch | prompt | products alone ms | lower bound ms | target ms | SM MHz (bound) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['prompt']} | {r['products_ms']:.2f} | {r['bound_ms']:.2f} | "
              f"{r['target_ms']:.0f} | {r['bound_power'].get('sm_clock_mhz', 'n/a')} |")


if __name__ == "__main__":
    app.run(main)
