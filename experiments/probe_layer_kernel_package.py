"""Probe: the engine package with and without the fused layer kernels, on the GPU, TF-free.

    python -m experiments.probe_layer_kernel_package tiny OUT      # the tiny preset's export
    python -m experiments.probe_layer_kernel_package shape OUT on|off  # qwen2-0.5b shape, 2 layers
    python -m experiments.probe_layer_kernel_package variants OUT off,on,none,only-qkv,...

``tiny`` exports the tiny preset with the layer kernels and writes the whole error if the
compile or its first run fails. ``shape`` exports a two-layer model of qwen2-0.5b's shape
(prompt 1024, beam 256) with the kernels on or off, runs the package at batch 8 under the
profiler and writes the GPU time per kernel: where a package with the kernels spends more
than one without them.

``variants`` bisects: every named variant is exported in a child process of its own, side by
side (``CUDA_LAUNCH_BLOCKING=1``, so a failing compile names its kernel), then each package
that compiled is timed and profiled at batch 1 and 8, one after another, beside the eager
engine (the same kernels launched by Python, graphs off and on). Variants:

* ``off``: the plain decoder layer (Inductor fuses its elementwise steps);
* ``on``: ``KernelLayer`` with all four layer ops;
* ``none``: ``KernelLayer`` with every layer op replaced by its torch reference (the
  structure of the kernel layer without its kernels);
* ``only-qkv``, ``only-silu``, ``only-rms``, ``only-cos``: ``KernelLayer`` with that one op
  as a kernel, the others as torch references.

Writes ``summary.json`` (per variant: export seconds or error, call ms, GPU ms per kernel),
``<variant>.txt`` profiler tables and ``<variant>.err`` for a failed export.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
import zipfile
from pathlib import Path

import numpy as np
import torch

OPS = {"qkv": "traced_qkv_rotary", "silu": "traced_silu_mul", "rms": "traced_rms_norm",
       "cos": "traced_rotary_cos_sin"}


def _engine(preset_name: str, layers: int | None, items: int, graphs: bool = True):
    from torch_engine.catalog import Catalog
    from torch_engine.config import EngineConfig, preset
    from torch_engine.engine import Engine
    from torch_engine.model import Model

    config = preset(preset_name)
    if layers is not None:
        config = config.replace(num_layers=layers)
    model = Model(config).to(device="cuda", dtype=torch.bfloat16)
    model.init_weights(0)
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(10 * items), size=items, replace=False).astype(np.int64)
    codes = rng.integers(0, 256 if layers else 8, (items, 3)).astype(np.int32)
    return Engine(model.eval(), Catalog.from_arrays(ids, codes),
                  EngineConfig(attention_backend="triton", selection_backend="triton",
                               cuda_graphs=graphs))


def _export(engine, keep_last: int, beams: int, top_k: int, out: Path, kernels: bool):
    from xgr_common.prompt_spec import PromptSpec
    from xgr_export.engine_package import EngineExportConfig, export_engine

    spec = PromptSpec(model_hidden=engine.model.config.hidden_size, keep_last=keep_last,
                      window_seconds=3650 * 86400)
    started = time.perf_counter()
    export_engine(engine, spec, out, EngineExportConfig(beams, top_k, max_batch=16,
                                                        device="cuda"),
                  layer_kernels=kernels)
    return spec, time.perf_counter() - started


def _spec(engine):
    from xgr_common.prompt_spec import PromptSpec
    return PromptSpec(model_hidden=engine.model.config.hidden_size, keep_last=255,
                      window_seconds=3650 * 86400)


# --------------------------------------------------------------- torch stand-ins for the ops
def _torch_qkv(qkv, cos, sin, inputs, bias, q_norm, k_norm, num_heads, num_kv_heads, eps,
               input_eps):
    from torch_engine.reference import layer_ops as ref
    q, k, v = ref.qkv_rotary(qkv, cos, sin, num_heads, num_kv_heads, q_norm, k_norm, eps,
                             inputs, input_eps, bias)
    return (q.to(qkv.dtype).contiguous(), k.to(qkv.dtype).contiguous(),
            v.to(qkv.dtype).contiguous())


def _torch_silu(gate_up, inputs, input_eps):
    from torch_engine.reference import layer_ops as ref
    return ref.silu_mul(gate_up, inputs, input_eps).to(gate_up.dtype)


def _torch_rms(x, weight, eps):
    wide = x.float()
    scale = torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (wide * scale * weight.float()).to(x.dtype)


def _torch_cos(positions, inv_freq, dtype, repeat=1):
    if repeat > 1:
        positions = positions[..., None].expand(*positions.shape, repeat)
    freqs = positions.float()[..., None] * inv_freq
    cos, sin = torch.cos(freqs), torch.sin(freqs)
    return (torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype))


STAND_INS = {"qkv": _torch_qkv, "silu": _torch_silu, "rms": _torch_rms, "cos": _torch_cos}


def _kernels_of(variant: str) -> set[str] | None:
    """The layer ops a variant runs as kernels; None for the plain layer."""
    if variant == "off":
        return None
    if variant == "on":
        return set(OPS)
    if variant == "none":
        return set()
    if variant.startswith("only-") and variant[5:] in OPS:
        return {variant[5:]}
    raise SystemExit(f"unknown variant {variant!r}")


def export_variant(out: Path, variant: str) -> None:
    """One variant's export (child process): ``<variant>.pt2`` or ``<variant>.err``."""
    from torch_engine.kernels import layer_ops
    kernels = _kernels_of(variant)
    if kernels is not None:
        for name, attribute in OPS.items():
            if name not in kernels:
                setattr(layer_ops, attribute, STAND_INS[name])
    engine = _engine("qwen2-0.5b", 2, 100_000)
    try:
        _, seconds = _export(engine, 255, 256, 300, out / f"{variant}.pt2", kernels is not None)
        (out / f"{variant}.export.json").write_text(json.dumps({"export_s": seconds}))
    except Exception:  # the probe reports whatever failed
        (out / f"{variant}.err").write_text(traceback.format_exc()[-30000:])


def _timed(call, repeats: int = 20) -> float:
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def _profiled(call, out: Path, label: str) -> dict:
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    events = prof.key_averages()
    (out / f"{label}.txt").write_text(events.table(sort_by="cuda_time_total", row_limit=60))
    kernels = {}
    for event in events:
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total:
            kernels[event.key[:120]] = {"count": event.count, "us": round(total, 1)}
    gpu_ms = sum(k["us"] for k in kernels.values()) / 1000
    return {"gpu_ms": round(gpu_ms, 3), "kernels": kernels}


def _wrapper_sources(package: Path, out: Path, label: str) -> None:
    """The package's C++ wrapper and kernel metadata, for reading its launches."""
    with zipfile.ZipFile(package) as archive:
        names = archive.namelist()
        (out / f"{label}.files.txt").write_text("\n".join(names))
        for name in names:
            if name.endswith((".cpp", ".json")) and "/" in name:
                target = out / "src" / label / Path(name).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))


def measure(out: Path, variants: list[str]) -> dict:
    from torch_engine.aoti_loading import load_package
    from xgr_export.engine_package import example_inputs

    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "variants": {}}
    eager = _engine("qwen2-0.5b", 2, 100_000, graphs=False)
    graphed = _engine("qwen2-0.5b", 2, 100_000, graphs=True)
    spec = _spec(eager)
    for batch in (1, 8):
        inputs = [t.cuda() for t in example_inputs(eager, spec, batch=batch)]
        token_ids, lengths, segment_ids, embeds, exclude = inputs

        def run(engine=None):
            return lambda: engine.recommend(token_ids, lengths, segment_ids, 256, 300,
                                            prefix_embeds=embeds.to(torch.bfloat16),
                                            exclude_items=exclude)
        row = summary["variants"].setdefault("eager", {})
        row[f"b{batch}_ms"] = _timed(run(eager), 10)
        row[f"b{batch}_graphs_ms"] = _timed(run(graphed), 20)
        if batch == 8:
            row["profile_b8"] = _profiled(run(eager), out, "eager_b8")
        for variant in variants:
            row = summary["variants"].setdefault(variant, {})
            package = out / f"{variant}.pt2"
            if (out / f"{variant}.err").exists() or not package.exists():
                row["error"] = ((out / f"{variant}.err").read_text()[-3000:]
                                if (out / f"{variant}.err").exists() else "no package")
                continue
            if (out / f"{variant}.export.json").exists():
                row.update(json.loads((out / f"{variant}.export.json").read_text()))
            try:
                runner = load_package(package)
                row[f"b{batch}_ms"] = _timed(lambda: runner(*inputs))
                if batch == 8:
                    row["profile_b8"] = _profiled(lambda: runner(*inputs), out,
                                                  f"{variant}_b8")
                    _wrapper_sources(package, out, variant)
                del runner
            except Exception:  # the probe reports whatever failed
                row[f"b{batch}_error"] = traceback.format_exc()[-3000:]
            torch.cuda.empty_cache()
    return summary


def variants_run(out: Path, variants: list[str]) -> None:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    started = time.perf_counter()
    children = {v: subprocess.Popen([sys.executable, "-m", "experiments.probe_layer_kernel_package",
                                     "export", str(out), v], env=env,
                                    stdout=open(out / f"{v}.log", "w"), stderr=subprocess.STDOUT)
                for v in variants}
    for variant, child in children.items():
        child.wait()
        print(f"{time.perf_counter() - started:7.1f} s  export {variant}: rc {child.returncode}",
              flush=True)
    summary = measure(out, variants)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for name, row in summary["variants"].items():
        print(name, {k: v for k, v in row.items() if k != "profile_b8"},
              "gpu_ms b8", row.get("profile_b8", {}).get("gpu_ms"), flush=True)
    (out / "done").write_text("done\n")


def tiny(out: Path) -> None:
    engine = _engine("tiny", None, 2000)
    try:
        _export(engine, 40, 32, 24, out / "tiny.pt2", True)
        (out / "tiny.txt").write_text("exported\n")
    except Exception:  # the probe reports whatever failed
        (out / "tiny.txt").write_text(traceback.format_exc()[-20000:])


def shape(out: Path, kernels: bool) -> None:
    from torch_engine.aoti_loading import load_package
    from xgr_export.engine_package import example_inputs

    engine = _engine("qwen2-0.5b", 2, 100_000)
    label = "on" if kernels else "off"
    path = out / f"shape_{label}.pt2"
    spec, seconds = _export(engine, 255, 256, 300, path, kernels)
    runner = load_package(path)
    inputs = [t.cuda() for t in example_inputs(engine, spec, batch=8)]
    call_ms = _timed(lambda: runner(*inputs), 10)
    profile = _profiled(lambda: runner(*inputs), out, f"shape_{label}")
    (out / f"shape_{label}.json").write_text(
        json.dumps({"export_s": seconds, "call_ms": call_ms, "gpu_ms": profile["gpu_ms"]}))


if __name__ == "__main__":
    where = Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    if sys.argv[1] == "tiny":
        tiny(where)
    elif sys.argv[1] == "export":
        export_variant(where, sys.argv[3])
    elif sys.argv[1] == "variants":
        variants_run(where, sys.argv[3].split(","))
    else:
        shape(where, sys.argv[3] == "on")
