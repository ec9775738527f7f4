"""Whether a gate/up product with SwiGLU in its epilogue beats the library product + ``silu_mul``.

    python -m experiments.probe_swiglu_product --swiglu_out=experiments/results

At prefill rows the MLP's elementwise step is large: ``silu_mul`` reads the ``[M, 2 I]`` gate/up
product and writes ``[M, I]`` (qwen3-1.7b at 8192 rows: ~335 MB, ~0.1 ms a layer, ~4 ms of a
batch-8 search). A product that applies the row scale and SwiGLU to its two float32
accumulators before it stores never writes the gate/up product at all. Triton 3.6's products
from pointer loads lost to cuBLAS by more than the launch they saved (``docs/notes/engine.md``,
"products with their epilogues"); this probe times a persistent product with whole tiles loaded
through TMA descriptors instead.

Per layer, in CUDA graphs over 8 layers of distinct weights (median device us per layer):

* ``library``: ``x @ W^T`` (cuBLAS) then ``layer_ops.silu_mul(gate_up, inputs=x)``;
* ``library_product``: the cuBLAS product alone (the bound a fused product has to approach);
* ``fused <tile>``: ``row_rstd`` (one small launch) then the fused product, per tile;
* ``fused_inloop <tile>``: the fused product summing the squares of its own x tiles.

Every variant is checked against float64 first. Writes ``swiglu_product_<date>.json``.
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
from torch_engine import reference as torch_reference
from torch_engine.kernels import layer_ops

FLAGS = flags.FLAGS
flags.DEFINE_string("swiglu_out", "experiments/results", "folder for swiglu_product_<date>.json")
flags.DEFINE_list("rows", ["256", "1024", "2048", "5120", "8192"], "product rows")
flags.DEFINE_list("models", ["qwen2-0.5b", "qwen3-1.7b"], "hidden / intermediate sizes")
flags.DEFINE_integer("layers", 8, "distinct weight sets per replay")

SHAPES = {"qwen2-0.5b": (896, 4864), "qwen3-1.7b": (2048, 6144)}
EPS = 1e-6
# (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps): BLOCK_N activation columns = 2 x BLOCK_N
# product columns (gate and up), so 128 x 128 is the library's 128 x 256 tile.
TILES = [(128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 64, 64, 4, 4), (128, 64, 64, 5, 8),
         (64, 128, 64, 4, 4), (64, 64, 64, 6, 4)]


@triton.jit
def _row_rstd_kernel(x_ptr, out_ptr, rows, hidden, eps, BLOCK_R: tl.constexpr,
                     HIDDEN_P2: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, HIDDEN_P2)
    ok = (r[:, None] < rows) & (cols[None, :] < hidden)
    x = tl.load(x_ptr + r[:, None].to(tl.int64) * hidden + cols[None, :], mask=ok,
                other=0.0).to(tl.float32)
    tl.store(out_ptr + r, tl.rsqrt(tl.sum(x * x, axis=1) / hidden + eps), mask=r < rows)


def row_rstd(x: torch.Tensor) -> torch.Tensor:
    rows, hidden = x.shape
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    block_r = 4
    _row_rstd_kernel[(triton.cdiv(rows, block_r),)](
        x, out, rows, hidden, EPS, BLOCK_R=block_r, HIDDEN_P2=triton.next_power_of_2(hidden),
        num_warps=4)
    return out


@triton.jit
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Row and column tile of a persistent step, GROUP_M row tiles at a time (L2 reuse)."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % size_m, (tile % per_group) // size_m


@triton.jit
def _swiglu_product_kernel(x_desc, gate_desc, up_desc, out_desc, rstd_ptr, M, I, K, eps,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, INLOOP: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(I, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
        om = pid_m * BLOCK_M
        on = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for step in range(steps):
            ok = step * BLOCK_K
            a = x_desc.load([om, ok])
            acc_g = tl.dot(a, gate_desc.load([on, ok]).T, acc_g)
            acc_u = tl.dot(a, up_desc.load([on, ok]).T, acc_u)
            if INLOOP:
                a32 = a.to(tl.float32)
                squares += tl.sum(a32 * a32, axis=1)
        if INLOOP:
            scale = tl.rsqrt(squares / K + eps)
        else:
            rows = om + tl.arange(0, BLOCK_M)
            scale = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        gate = acc_g * scale[:, None]
        up = acc_u * scale[:, None]
        out_desc.store([om, on], (gate / (1.0 + tl.exp(-gate)) * up).to(out_desc.dtype))


def swiglu_product(x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor | None, tile,
                   programs: int) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor
    block_m, block_n, block_k, stages, warps = tile
    rows, hidden = x.shape
    inter = w.shape[0] // 2
    out = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(rows, block_m) * triton.cdiv(inter, block_n)
    grid = min(programs, tiles)
    _swiglu_product_kernel[(grid,)](
        TensorDescriptor.from_tensor(x, [block_m, block_k]),
        TensorDescriptor.from_tensor(w[:inter], [block_n, block_k]),
        TensorDescriptor.from_tensor(w[inter:], [block_n, block_k]),
        TensorDescriptor.from_tensor(out, [block_m, block_n]),
        rstd if rstd is not None else out, rows, inter, hidden, EPS,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, PROGRAMS=grid,
        INLOOP=rstd is None, num_stages=stages, num_warps=warps)
    return out


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return torch_reference.silu_mul(x64 @ w.double().t(), inputs=x64, input_eps=EPS)


def per_layer_us(fn, layers: int) -> float:
    return statistics.median(ea.device_ms(ea.capture(fn).replay)) * 1e3 / layers


def main(argv: list[str]) -> None:
    del argv
    device = torch.device("cuda")
    programs = torch.cuda.get_device_properties(device).multi_processor_count
    rows_out = []
    for model in FLAGS.models:
        hidden, inter = SHAPES[model]
        gen = torch.Generator(device=device).manual_seed(0)
        weights = [torch.randn(2 * inter, hidden, device=device, dtype=torch.bfloat16,
                               generator=gen) * hidden ** -0.5 for _ in range(FLAGS.layers)]
        for rows in map(int, FLAGS.rows):
            x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16, generator=gen)
            want = reference(x, weights[0])
            row = {"model": model, "rows": rows, "hidden": hidden, "inter": inter, "us": {},
                   "rel_err": {}}
            row["us"]["library"] = per_layer_us(
                lambda: [layer_ops.silu_mul(x @ w.t(), inputs=x) for w in weights], FLAGS.layers)
            row["us"]["library_product"] = per_layer_us(
                lambda: [x @ w.t() for w in weights], FLAGS.layers)
            row["rel_err"]["library"] = float(
                (layer_ops.silu_mul(x @ weights[0].t(), inputs=x).double() - want).norm()
                / want.norm())
            for tile in TILES:
                for inloop in (False, True):
                    name = ("fused_inloop " if inloop else "fused ") + "x".join(map(str, tile))

                    def fused(w, tile=tile, inloop=inloop):
                        return swiglu_product(x, w, None if inloop else row_rstd(x), tile,
                                              programs)
                    try:
                        got = fused(weights[0])
                        row["rel_err"][name] = float((got.double() - want).norm() / want.norm())
                        row["us"][name] = per_layer_us(lambda: [fused(w) for w in weights],
                                                       FLAGS.layers)
                    except Exception as err:  # a tile that does not fit: reported, not fatal
                        row["us"][name] = f"{type(err).__name__}: {err}"[:160]
            timed = {k: v for k, v in row["us"].items() if isinstance(v, float)}
            best = min((k for k in timed if k.startswith("fused")), key=timed.get, default=None)
            row["best_fused"] = best
            if best:
                row["best_over_library"] = timed[best] / timed["library"]
            rows_out.append(row)
            print(json.dumps({k: row[k] for k in ("model", "rows", "best_fused")}),
                  {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row["us"].items()},
                  flush=True)
    result = {"date": rf.utc_now(), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "triton": triton.__version__, "rows": rows_out}
    path = rf.write_result(FLAGS.swiglu_out, "swiglu_product", result)
    print(f"wrote {path}")
    print("| model | rows | library us | product alone | best fused | fused / library |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows_out:
        best = r.get("best_fused")
        print(f"| {r['model']} | {r['rows']} | {r['us']['library']:.1f} | "
              f"{r['us']['library_product']:.1f} | {best}: "
              f"{r['us'][best]:.1f} | {r.get('best_over_library', float('nan')):.3f} |")


if __name__ == "__main__":
    app.run(main)
