"""Probe: the engine package with and without the fused layer kernels, on the GPU, TF-free.

    python -m experiments.probe_layer_kernel_package tiny OUT      # the tiny preset's export
    python -m experiments.probe_layer_kernel_package shape OUT on|off  # qwen2-0.5b shape, 2 layers

``tiny`` exports the tiny preset with the layer kernels and writes the whole error if the
compile or its first run fails. ``shape`` exports a two-layer model of qwen2-0.5b's shape
(prompt 1024, beam 256) with the kernels on or off, runs the package at batch 8 under the
profiler and writes the GPU time per kernel: where a package with the kernels spends more
than one without them.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch


def _engine(preset_name: str, layers: int | None, items: int):
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
                  EngineConfig(attention_backend="triton", selection_backend="triton"))


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
    for _ in range(3):
        runner(*inputs)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        runner(*inputs)
    end.record()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        runner(*inputs)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
    (out / f"shape_{label}.txt").write_text(
        json.dumps({"export_s": seconds, "call_ms": start.elapsed_time(end) / 10}) + "\n"
        + table)


if __name__ == "__main__":
    where = Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    if sys.argv[1] == "tiny":
        tiny(where)
    else:
        shape(where, sys.argv[3] == "on")
