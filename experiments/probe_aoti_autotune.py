"""Probe: does AOTInductor's compile-time tuning block cause the illegal address of CUDA exports?

    python -m experiments.probe_aoti_autotune facts OUT
    python -m experiments.probe_aoti_autotune run OUT on-default,on-sample,on-two_pass,...

For CUDA, AOTInductor compiles and tunes every Triton kernel before it writes the package. By
default (``triton.autotune_at_compile_time``) it does so in one generated "tuning block" that
launches each kernel once on example arguments it makes up: random floats, integer tensors of
zeros, sizes from hints; the real example inputs are not used (``autotune_with_sample_inputs``
gives them to user-written kernels only). Kernels that index by data (lengths, positions,
CSR tables, exclusion ids) can then read outside their buffers. With the mode off the compile
takes two passes: a Python pass that runs the whole program on the real example inputs, then
the C++ pass.

``run`` exports the two-layer qwen2-0.5b-shaped engine of
``experiments.probe_layer_kernel_package`` (100k items, beam 256, top_k 300, bf16) once per
``VARIANT-MODE`` label, side by side in child processes, then loads and times each package
that compiled at batch 1 and 8 beside the eager engine. Variants: that probe's (``off``,
``on``, ``only-<op>``, ...). Modes:

* ``default``: Inductor's defaults on this torch;
* ``sample``: ``triton.autotune_with_sample_inputs`` (user kernels tuned on the real inputs);
* ``two_pass``: ``triton.autotune_at_compile_time`` off (the Python pass on the real inputs),
  what ``xgr export`` adopted (``xgr_export.inductor_first_pass``);
* ``traced``: the default, with the tuning block written to ``LABEL.tuning.py`` and a device
  synchronisation and a line on stderr after each of its launches, so a fault names its kernel.

``facts`` writes what this torch does by default and Inductor's analysis of the layer kernels
(which arguments each one reads and writes) to ``facts.json``.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

def _mode_patch(mode: str):
    import torch._inductor.config as inductor_config
    from xgr_export import inductor_first_pass

    if mode == "two_pass":    # what the export applies itself
        return contextlib.nullcontext()
    # The other modes drop the export's own setting.
    inductor_first_pass.REAL_INPUT_FIRST_PASS = {}
    if mode == "sample":
        return inductor_config.patch({"triton.autotune_with_sample_inputs": True})
    if mode == "traced":
        return _traced_tuning_block()
    return contextlib.nullcontext()


_LAUNCH = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*)\.run\(.*\)\s*$")


def _instrumented(code: str) -> str:
    lines = []
    for line in code.splitlines():
        lines.append(line)
        match = _LAUNCH.match(line)
        if match:
            indent, name = match.groups()
            lines.append(f"{indent}torch.cuda.synchronize(); "
                         f"print('tuning block ran {name}', file=sys.stderr, flush=True)")
    return "import sys, torch\n" + "\n".join(lines) + "\n"


@contextlib.contextmanager
def _traced_tuning_block():
    """While open, the code that Inductor's wrapper module executes (its tuning block) is
    written to a file and run from it, synchronised after every launch."""
    from torch._inductor.codegen import wrapper
    target = Path(os.environ["XGR_PROBE_TUNING_FILE"])

    def traced_exec(code, scope=None, *rest):
        if isinstance(code, str) and ".run(" in code:
            text = _instrumented(code)
            target.write_text(text)
            return builtins.exec(compile(text, str(target), "exec"), scope, *rest)
        return builtins.exec(code, scope, *rest)

    wrapper.exec = traced_exec
    try:
        yield
    finally:
        del wrapper.exec


def export_child(out: Path, label: str) -> None:
    """One ``VARIANT-MODE`` export: ``LABEL.pt2`` and ``LABEL.export.json``, or ``LABEL.err``."""
    from experiments import probe_layer_kernel_package as base
    from torch_engine.kernels import layer_ops

    variant, mode = label.rsplit("-", 1)
    kernels = base._kernels_of(variant)
    if kernels is not None:
        for name, attribute in base.OPS.items():
            if name not in kernels:
                setattr(layer_ops, attribute, base.STAND_INS[name])
    os.environ["XGR_PROBE_TUNING_FILE"] = str(out / f"{label}.tuning.py")
    engine = base._engine("qwen2-0.5b", 2, 100_000)
    try:
        with _mode_patch(mode):
            _, seconds = base._export(engine, 255, 256, 300, out / f"{label}.pt2",
                                      kernels is not None)
        (out / f"{label}.export.json").write_text(json.dumps({"export_s": seconds}))
    except Exception:  # the probe reports whatever failed
        (out / f"{label}.err").write_text(traceback.format_exc()[-30000:])


def facts(out: Path) -> dict:
    import torch._inductor.config as inductor_config
    import triton
    from torch._inductor import compile_fx
    from torch._higher_order_ops import triton_kernel_wrap as wrap
    from torch_engine.kernels import layer_ops as L

    found = {"torch": torch.__version__, "triton": triton.__version__,
             "autotune_at_compile_time": inductor_config.triton.autotune_at_compile_time,
             "has_autotune_with_sample_inputs":
                 hasattr(inductor_config.triton, "autotune_with_sample_inputs"),
             "env": os.environ.get("TORCHINDUCTOR_AUTOTUNE_AT_COMPILE_TIME")}
    if hasattr(compile_fx, "get_cpp_wrapper_config"):
        found["get_cpp_wrapper_config"] = inspect.getsource(compile_fx.get_cpp_wrapper_config)
    analyse = (getattr(wrap, "identify_accessed_tensors", None)
               or getattr(wrap, "identify_mutated_tensors", None))

    def t(dtype=torch.bfloat16):
        return torch.empty(16, dtype=dtype, device="cuda")
    cases = {
        "silu_mul": (L._silu_mul_kernel, dict(gu_ptr=t(), x_ptr=t(), out_ptr=t(), size=4864,
                                              hidden=896, eps=1e-6, BLOCK=4096, SCALE=True,
                                              HIDDEN_P2=1024)),
        "rms_norm": (L._rms_norm_kernel, dict(x_ptr=t(), w_ptr=t(), out_ptr=t(), size=896,
                                              eps=1e-6, BLOCK=1024)),
        "qkv_rotary": (L._qkv_rotary_kernel, dict(
            qkv_ptr=t(), x_ptr=t(), bias_ptr=t(), cos_ptr=t(), sin_ptr=t(), qn_ptr=t(),
            kn_ptr=t(), q_ptr=t(), k_ptr=t(), v_ptr=t(), width=100, hidden=896, in_eps=1e-6,
            eps=1e-6, s_qkv=1152, s_cos=64, s_q=896, s_kb=0, s_kw=128, s_vb=0, s_vw=128,
            HQ=14, HKV=2, D=64, HQ_P2=16, HKV_P2=2, NORM=False, SCALE=True, BIAS=True,
            HIDDEN_P2=1024)),
    }
    found["analysis"] = {}
    for name, (kernel, kwargs) in cases.items():
        try:
            args = inspect.signature(analyse).parameters
            result = (analyse(kernel, kwargs, {}) if len(args) >= 3
                      else analyse(kernel, kwargs))
            found["analysis"][name] = repr(result)[:2000]
        except Exception as err:  # the probe reports whatever failed
            found["analysis"][name] = f"error: {type(err).__name__}: {err}"[:2000]
    (out / "facts.json").write_text(json.dumps(found, indent=1))
    return found


def run(out: Path, labels: list[str]) -> None:
    started = time.perf_counter()
    print(json.dumps({k: v for k, v in facts(out).items() if k != "get_cpp_wrapper_config"},
                     indent=1), flush=True)
    children = {label: subprocess.Popen(
        [sys.executable, "-m", "experiments.probe_aoti_autotune", "export", str(out), label],
        stdout=open(out / f"{label}.log", "w"), stderr=subprocess.STDOUT) for label in labels}
    for label, child in children.items():
        child.wait()
        state = "compiled" if (out / f"{label}.pt2").exists() else "FAILED"
        print(f"{time.perf_counter() - started:7.1f} s  {label}: rc {child.returncode} {state}",
              flush=True)
    (out / "exports_done").write_text("\n".join(
        f"{label} {'ok' if (out / f'{label}.pt2').exists() else 'failed'}" for label in labels))
    # Python's loader of CUDA packages needs the loader environment from process start.
    from torch_engine.aoti_loading import loader_environment
    subprocess.run([sys.executable, "-m", "experiments.probe_aoti_autotune", "measure", str(out),
                    ",".join(labels)], env=loader_environment(), check=False)


def measure(out: Path, labels: list[str]) -> None:
    from experiments import probe_layer_kernel_package as base

    summary = base.measure(out, labels)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for name, row in summary["variants"].items():
        shown = {k: (v[-300:] if isinstance(v, str) else v) for k, v in row.items()
                 if k != "profile_b8"}
        print(name, shown, "gpu_ms b8", row.get("profile_b8", {}).get("gpu_ms"), flush=True)
    (out / "done").write_text("done\n")


if __name__ == "__main__":
    where = Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    if sys.argv[1] == "facts":
        print(json.dumps(facts(where), indent=1))
    elif sys.argv[1] == "export":
        export_child(where, sys.argv[3])
    elif sys.argv[1] == "measure":
        measure(where, sys.argv[3].split(","))
    else:
        run(where, sys.argv[3].split(","))
