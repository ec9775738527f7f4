"""Probe: where an engine package's AOTInductor compile hits an illegal memory access (GPU).

    python -m experiments.probe_export_fault OUT NAME LAYERS ITEMS CAPACITY KERNELS

Exports ``Engine.recommend`` of a qwen2-0.5b-shaped model (``LAYERS`` layers, ``ITEMS``
items, bf16, Triton attention and selection, beam 256, top_k 300) with the catalog padded to
its size x 1.2 when ``CAPACITY`` is 1, the layer kernels ``off``, ``on`` or ``only-<op>``
(``experiments.probe_layer_kernel_package``'s variants). Before the compile, the exported
program runs eagerly on its example inputs (does the traced program itself fault?); the
compile then runs as ``xgr export`` runs it (``xgr_export.inductor_first_pass``: a
synchronisation after every kernel of Inductor's first, Python pass). On
a failure the generated code around every frame of the traceback that lies in Inductor's
generated modules is written to ``NAME.fault.txt``, with the modules themselves under
``NAME.generated/``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from pathlib import Path

import torch


def _frames(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield from traceback.extract_tb(error.__traceback__)
        error = error.__cause__ or error.__context__


def _fault_report(error: BaseException, out: Path, name: str) -> None:
    lines = [traceback.format_exc()[-8000:], ""]
    generated = out / f"{name}.generated"
    for frame in _frames(error):
        path = Path(frame.filename)
        if "torchinductor" not in str(path) or not path.exists():
            continue
        generated.mkdir(exist_ok=True)
        shutil.copy(path, generated / path.name)
        source = path.read_text().splitlines()
        start = max(frame.lineno - 40, 0)
        lines.append(f"==== {path}:{frame.lineno} in {frame.name}")
        lines += [f"{'>>' if i + 1 == frame.lineno else '  '} {i + 1:6d} {source[i]}"
                  for i in range(start, min(frame.lineno + 5, len(source)))]
    (out / f"{name}.fault.txt").write_text("\n".join(lines))


def main(out: Path, name: str, layers: int, items: int, capacity: bool, kernels: str) -> None:
    from experiments import probe_layer_kernel_package as variants
    from torch_engine.catalog import CatalogSize
    from torch_engine.kernels import layer_ops
    from xgr_export import torch_package
    from xgr_export.engine_package import EngineExportConfig, export_engine

    ops = variants._kernels_of(kernels)
    if ops is not None:
        for op, attribute in variants.OPS.items():
            if op not in ops:
                setattr(layer_ops, attribute, variants.STAND_INS[op])
    engine = variants._engine("qwen2-0.5b", layers, items)
    spec = variants._spec(engine)
    report = {"name": name, "layers": layers, "items": items, "capacity": capacity,
              "kernels": kernels, "torch": torch.__version__}
    compile_aoti = torch_package.package_aoti

    def checked_compile(program, *args, **kwargs):
        inputs = program.example_inputs[0]
        try:
            with torch.no_grad():
                program.module()(*inputs)
            torch.cuda.synchronize()
            report["eager_program"] = "ran"
        except Exception:  # the probe reports whatever failed
            report["eager_program"] = traceback.format_exc()[-3000:]
            raise
        return compile_aoti(program, *args, **kwargs)

    torch_package.package_aoti = checked_compile
    size = (CatalogSize.with_headroom(engine.catalog.size, 1.2, spec.layout.codebook_size)
            if capacity else None)
    started = time.perf_counter()
    try:
        export_engine(engine, spec, out / f"{name}.pt2",
                      EngineExportConfig(256, 300, max_batch=16, device="cuda"),
                      layer_kernels=ops is not None, capacity=size)
        report["compiled"] = True
    except Exception as error:  # the probe reports whatever failed
        report["compiled"] = False
        report["error"] = f"{type(error).__name__}: {str(error)[:2000]}"
        _fault_report(error, out, name)
    report["seconds"] = round(time.perf_counter() - started, 1)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "eager_program"})[:3000],
          flush=True)


if __name__ == "__main__":
    where = Path(sys.argv[1])
    where.mkdir(parents=True, exist_ok=True)
    main(where, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1",
         sys.argv[6])
