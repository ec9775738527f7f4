"""Probe: is a layer kernel slower as an AOTInductor package launches it, in isolation?

    python -m experiments.probe_user_kernel_package --out=DIR [--rows=256,985,1024,4096]

Inside the cached package the engine's ``_silu_mul_kernel`` took three times as long as in
the engine on the same rows. This probe takes the kernel out of the model: one MLP block at
qwen3-1.7b's width (``x @ W_gu.T``, ``xgr::silu_mul`` with the norm folded in, the down
product), the rows dynamic, compiled the way ``xgr export`` compiles a program
(``xgr_export.torch_package``'s Inductor settings). It times the eager block and the package
at each row count, and records for both sides each kernel's time and launch (grid, block,
registers), the ``@jit`` specialisations the engine's launch compiled (16-byte divisibility
marks) and the launch configs and argument attributes Inductor wrote for the package's
copy. If the isolated package is as fast as the eager block, the slowdown belongs to the
whole program (its inputs' layout or its rows), not to how AOTInductor launches a user
kernel.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from unittest import mock

import torch
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.engine_analysis import kernel_times, wall_ms
from experiments.generated_kernels import generated_origins, jit_specializations, \
    kernel_launches
from experiments.package_child import run_package_child
from torch_engine.kernels import layer_ops
from xgr_export.inductor_first_pass import cuda_first_pass
from xgr_export.inductor_int_arrays import int_arrays_keyed_by_buffer

FLAGS = flags.FLAGS
flags.DEFINE_list("rows", ["256", "985", "1024", "4096"], "Row counts timed.")
flags.DEFINE_integer("hidden", 2048, "Model width (qwen3-1.7b).")
flags.DEFINE_integer("intermediate", 6144, "MLP width (qwen3-1.7b).")
flags.DEFINE_integer("repeats", 50, "Timed calls per row count.")
flags.DEFINE_string("out", None, "Folder for the result JSON (none: printed only).")
flags.DEFINE_string("work", None, "Folder for the package (default: a temporary one).")

_CHILD = r"""
import json, statistics, sys
import torch
from benchmarks.engine_analysis import kernel_times, wall_ms
from experiments.generated_kernels import kernel_launches
from torch_engine.aoti_loading import load_package
package, inputs_path, out_path = sys.argv[1:]
a = torch.load(inputs_path)
run = load_package(package)
result = {}
with torch.no_grad():
    for rows, x in a["inputs"].items():
        x = x.cuda()
        args = (x, a["w_gu"].cuda(), a["w_down"].cuda())
        row = {"ms": statistics.median(wall_ms(lambda: run(*args), a["repeats"]))}
        row["kernels_us"] = kernel_times(lambda: run(*args))
        row["launches"] = kernel_launches(lambda: run(*args))
        out = run(*args)     # the block's one output, or a list holding it
        out = out[0] if isinstance(out, (list, tuple)) else out
        row["max_abs_vs_eager"] = float((out.float().cpu() - a["eager"][rows].float()).abs().max())
        result[rows] = row
json.dump(result, open(out_path, "w"))
"""


class MlpBlock(torch.nn.Module):
    """The MLP of one decoder layer with its norm folded into the gate/up product, as the
    engine's kernel layer computes it: the silu product by ``xgr::silu_mul``."""

    def forward(self, x, w_gu, w_down):
        gate_up = torch.nn.functional.linear(x, w_gu)
        return torch.nn.functional.linear(torch.ops.xgr.silu_mul(gate_up, x, 1e-6), w_down)


def compile_block(block, example, work: Path) -> Path:
    rows = torch.export.Dim("rows", min=2, max=8192)
    program = torch.export.export(block, example, dynamic_shapes=({0: rows}, None, None))
    path = work / "block.pt2"
    with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}), \
            int_arrays_keyed_by_buffer(), cuda_first_pass("cuda") as first_pass:
        torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                 inductor_configs=dict(first_pass))
    return path


def main(argv: list[str]) -> None:
    del argv
    torch.manual_seed(0)
    dtype = torch.bfloat16
    hidden, inter = FLAGS.hidden, FLAGS.intermediate
    w_gu = torch.randn(2 * inter, hidden, device="cuda", dtype=dtype) / hidden ** 0.5
    w_down = torch.randn(hidden, inter, device="cuda", dtype=dtype) / inter ** 0.5
    block = MlpBlock()
    inputs = {int(r): torch.randn(int(r), hidden, device="cuda", dtype=dtype)
              for r in FLAGS.rows}
    result = {"hidden": hidden, "intermediate": inter, "eager": {}, "package": {}}
    eager_out = {}
    with torch.no_grad():
        for rows, x in inputs.items():
            call = lambda: block(x, w_gu, w_down)   # noqa: E731
            eager_out[rows] = call().cpu()
            result["eager"][rows] = {
                "ms": statistics.median(wall_ms(call, FLAGS.repeats)),
                "kernels_us": kernel_times(call), "launches": kernel_launches(call)}
            print(f"eager rows {rows}: {result['eager'][rows]['ms']:.3f} ms", flush=True)
    result["jit_specializations"] = jit_specializations(
        {"_silu_mul_kernel": layer_ops._silu_mul_kernel})
    work = Path(FLAGS.work or tempfile.mkdtemp(prefix="probe_user_kernel_"))
    work.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        path = compile_block(block, (inputs[min(inputs)], w_gu, w_down), work)
    # The package's copy of the kernel: its launch configs and argument attributes.
    result["package_kernel"] = generated_origins(work / "inductor", ["_silu_mul_kernel"])
    child = run_package_child(_CHILD, path, {
        "inputs": {r: x.cpu() for r, x in inputs.items()}, "w_gu": w_gu.cpu(),
        "w_down": w_down.cpu(), "eager": eager_out, "repeats": FLAGS.repeats},
        work, timeout=600)
    if "child_error" in child:
        result["child_error"] = child["child_error"]
    else:
        result["package"] = {int(k): v for k, v in child.items()}
    print(f"\n{'rows':>6}{'eager ms':>10}{'package ms':>12}{'silu eager us':>15}"
          f"{'silu package us':>17}")
    for rows in inputs:
        eager, package = result["eager"][rows], result["package"].get(rows, {})

        def silu(side):
            return next((v for k, v in side.get("kernels_us", {}).items()
                         if "silu_mul_kernel" in k), float("nan"))
        print(f"{rows:>6}{eager['ms']:>10.3f}{package.get('ms', float('nan')):>12.3f}"
              f"{silu(eager):>15.1f}{silu(package):>17.1f}")
        for side, data in (("eager", eager), ("package", package)):
            launch = next((v for k, v in data.get("launches", {}).items()
                           if "silu_mul_kernel" in k), None)
            print(f"    {side} launch: {launch}")
    print("\nengine's specialisations:", json.dumps(result["jit_specializations"])[:800])
    print("package's kernel:", json.dumps(result["package_kernel"])[:800])
    if "child_error" in result:
        print("package child failed:\n" + result["child_error"])
    if FLAGS.out:
        # Stamped with the commit, machine and versions, as a benchmark's result is.
        print("wrote", rf.write_json(Path(FLAGS.out) / "user_kernel_package.json", result,
                                     default=str))


if __name__ == "__main__":
    app.run(main)
