"""What programmatic dependent launch saves between the kernels of a captured graph.

    python -m experiments.probe_dependent_launch --launch_out=experiments/results

A search replays ~800 graph nodes at batch 1, most of them short, and the graph spends ~0.45 ms
between them (``docs/notes/engine.md``). A kernel launched with programmatic dependent launch (PDL,
sm_90+) may be scheduled before its predecessor has finished; its ``griddepcontrol.wait`` (first
statement) then holds its threads until the predecessor's writes are visible, so only the
launch latency overlaps, never the work. This probe measures that saving on the device, in
CUDA graphs of chains shaped like a decode layer at 256 rows (median device microseconds per
replay of 20):

* ``triton_chain``: 192 launches of one elementwise kernel (silu-mul of 256 x 4864), each
  reading the previous output;
* ``layer_chain``: 48 times gate/up product (cuBLAS) -> silu-mul (Triton) -> down product
  (cuBLAS), the Triton launch plain or dependent.

Variants: ``plain``; ``wait`` (dependent launch, the wait first); ``wait_trigger`` (also
``griddepcontrol.launch_dependents`` right after the wait, so a dependent successor may be
scheduled while this kernel still runs). Writes ``dependent_launch_<date>.json``.
"""

from __future__ import annotations

import json
import statistics

import torch
import triton
import triton.language as tl
from absl import app, flags

from benchmarks import engine_analysis as ea
from benchmarks import results_file as rf

FLAGS = flags.FLAGS
flags.DEFINE_string("launch_out", "experiments/results", "folder for dependent_launch_<date>.json")

ROWS, HIDDEN, INTER = 256, 896, 4864


@triton.jit
def _silu_mul_probe(gu_ptr, out_ptr, size, BLOCK: tl.constexpr, WAIT: tl.constexpr,
                    TRIGGER: tl.constexpr):
    if WAIT:
        tl.extra.cuda.gdc_wait()
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < size
    gate = tl.load(gu_ptr + row * 2 * size + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * size + size + cols, mask=ok, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * size + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor, variant: str) -> torch.Tensor:
    size = out.shape[-1]
    block = 2048
    _silu_mul_probe[(out.shape[0], triton.cdiv(size, block))](
        gate_up, out, size, BLOCK=block, WAIT=variant != "plain",
        TRIGGER=variant == "wait_trigger", num_warps=4, launch_pdl=variant != "plain")
    return out


def triton_chain(variant: str, device) -> float:
    # Ping-pong buffers: each launch reads the one the previous launch wrote.
    a = torch.randn(ROWS, 2 * INTER, device=device, dtype=torch.bfloat16)
    b = torch.empty(ROWS, 2 * INTER, device=device, dtype=torch.bfloat16)

    def chain():
        for i in range(96):
            silu_mul(a, b[:, :INTER], variant)
            silu_mul(b, a[:, :INTER], variant)
    return statistics.median(ea.device_ms(ea.capture(chain).replay)) * 1e3


def layer_chain(variant: str, device) -> float:
    x = torch.randn(ROWS, HIDDEN, device=device, dtype=torch.bfloat16) * 0.05
    w_gu = torch.randn(2 * INTER, HIDDEN, device=device, dtype=torch.bfloat16) * 0.02
    w_down = torch.randn(HIDDEN, INTER, device=device, dtype=torch.bfloat16) * 0.02
    act = torch.empty(ROWS, INTER, device=device, dtype=torch.bfloat16)

    def chain():
        h = x
        for _ in range(48):
            h = silu_mul(h @ w_gu.t(), act, variant) @ w_down.t()
    return statistics.median(ea.device_ms(ea.capture(chain).replay)) * 1e3


def main(argv: list[str]) -> None:
    del argv
    device = torch.device("cuda")
    rows = []
    for name, fn, launches in (("triton_chain", triton_chain, 192),
                               ("layer_chain", layer_chain, 48)):
        times = {v: fn(v, device) for v in ("plain", "wait", "wait_trigger")}
        times.update({f"{v}_again": fn(v, device) for v in ("plain", "wait", "wait_trigger")})
        row = {"chain": name, "dependent_launches": launches, "us": times,
               "saved_us_per_launch": {
                   v: (min(times["plain"], times["plain_again"])
                       - min(times[v], times[f"{v}_again"])) / launches
                   for v in ("wait", "wait_trigger")}}
        rows.append(row)
        print(json.dumps(row))
    result = {"date": rf.utc_now(),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "triton": triton.__version__, "rows": rows}
    path = rf.write_result(FLAGS.launch_out, "dependent_launch", result)
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
