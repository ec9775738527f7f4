"""Hand-off cost of the DLPack bridge on the CPU, beside the NumPy route and a plain copy.

For float32 tensors of 4 KB, 4 MB and 400 MB, times one hand-off each way:

* ``bridge``: ``bridge.dlpack.to_torch`` / ``to_tf`` (zero-copy; checked by data pointers);
* ``numpy``: ``torch.from_numpy(x.numpy())`` / ``tf.convert_to_tensor(t.numpy())``, the usual
  route (TF copies on ``.numpy()`` resp. on ``convert_to_tensor``);
* ``copy``: one plain ``clone()`` of the same bytes, the floor of any copying route.

Each timing is the median over many repeats (fewer for the copying routes at 400 MB). Prints a
table and writes ``benchmarks/results/bridge_<date>.json``. Target: a bridge hand-off at most
20 us and flat in size (400 MB over 4 KB at most 1.5x).

    python -m benchmarks.bench_bridge [--repeats=2000] [--output_dir=benchmarks/results]
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
import torch
from absl import app, flags
from tqdm import tqdm

from benchmarks import results_file as rf
from bridge.dlpack import tf_data_pointer, to_tf, to_torch

FLAGS = flags.DEFINE_integer("repeats", 2000, "timed repeats per zero-copy case")
COPY_BYTES = flags.DEFINE_integer("copy_repeat_bytes", 2_000_000_000,
                                  "bytes moved per copying case: repeats = this / size "
                                  "(at least 5, at most --repeats)")
OUTPUT_DIR = flags.DEFINE_string("output_dir", str(Path(__file__).parent / "results"),
                                 "where the JSON result goes")

SIZES = {"4KB": 4 * 1024, "4MB": 4 * 1024 ** 2, "400MB": 400 * 1024 ** 2}
TARGET_US = 20.0
TARGET_FLATNESS = 1.5


def median_us(fn, repeats: int, warmup: int = 20) -> float:
    """Median wall time of ``fn()`` in microseconds; the result is freed outside the timing."""
    for _ in range(min(warmup, repeats)):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        out = fn()
        samples.append(time.perf_counter_ns() - start)
        del out
    return statistics.median(samples) / 1e3


def measure(size_name: str, nbytes: int, repeats: int, copy_bytes: int) -> dict:
    elements = nbytes // 4
    x = tf.random.uniform([elements], dtype=tf.float32)
    t = torch.rand(elements, dtype=torch.float32)
    # Prove the bridge rows are hand-offs, not copies, before timing them.
    assert to_torch(x).data_ptr() == tf_data_pointer(x), "to_torch copied"
    assert tf_data_pointer(to_tf(t)) == t.data_ptr(), "to_tf copied"
    copy_repeats = max(5, min(repeats, copy_bytes // nbytes))
    cases = {
        ("tf_to_torch", "bridge"): (lambda: to_torch(x), repeats),
        ("tf_to_torch", "numpy"): (lambda: torch.from_numpy(x.numpy()), copy_repeats),
        ("torch_to_tf", "bridge"): (lambda: to_tf(t), repeats),
        ("torch_to_tf", "numpy"): (lambda: tf.convert_to_tensor(t.numpy()), copy_repeats),
        ("copy", "torch_clone"): (lambda: t.clone(), copy_repeats),
    }
    return {f"{direction}/{route}": median_us(fn, n)
            for (direction, route), (fn, n) in cases.items()}


def environment() -> dict:
    return {"machine": platform.node(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "tensorflow": tf.__version__, "torch": torch.__version__, "numpy": np.__version__,
            "load_average": os.getloadavg()}


def summarise(medians: dict[str, dict[str, float]]) -> dict:
    small, large = medians["4KB"], medians["400MB"]
    ratios = {}
    for direction in ("tf_to_torch", "torch_to_tf"):
        key = f"{direction}/bridge"
        ratios[f"{direction}_flatness_400MB_over_4KB"] = large[key] / small[key]
        for size, row in medians.items():
            ratios[f"{direction}_numpy_over_bridge_{size}"] = row[f"{direction}/numpy"] / row[key]
    worst = max(row[f"{d}/bridge"] for row in medians.values()
                for d in ("tf_to_torch", "torch_to_tf"))
    flat = max(ratios["tf_to_torch_flatness_400MB_over_4KB"],
               ratios["torch_to_tf_flatness_400MB_over_4KB"])
    target = {"max_us": TARGET_US, "max_flatness": TARGET_FLATNESS, "worst_bridge_us": worst,
              "worst_flatness": flat, "met": worst <= TARGET_US and flat <= TARGET_FLATNESS}
    return {"ratios": ratios, "target": target}


def table(medians: dict[str, dict[str, float]]) -> str:
    columns = list(next(iter(medians.values())))
    head = f"{'size':>6} | " + " | ".join(f"{c:>20}" for c in columns)
    rows = [f"{size:>6} | " + " | ".join(f"{row[c]:>17.1f} us" for c in columns)
            for size, row in medians.items()]
    return "\n".join([head, "-" * len(head), *rows])


def main(argv: list[str]) -> None:
    del argv
    medians = {name: measure(name, nbytes, FLAGS.value, COPY_BYTES.value)
               for name, nbytes in tqdm(SIZES.items(), desc="sizes")}
    summary = summarise(medians)
    print(table(medians))
    print(f"target: bridge <= {TARGET_US} us and 400MB/4KB <= {TARGET_FLATNESS}x -> "
          f"worst {summary['target']['worst_bridge_us']:.1f} us, flatness "
          f"{summary['target']['worst_flatness']:.2f}x: "
          f"{'met' if summary['target']['met'] else 'NOT met'}")
    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"benchmark": "bridge", "date": now.isoformat(timespec="seconds"),
              "environment": environment(), "dtype": "float32",
              "sizes_bytes": SIZES, "repeats": FLAGS.value, "statistic": "median",
              "unit": "us", "medians_us": medians, **summary}
    print(f"wrote {rf.write_result(OUTPUT_DIR.value, 'bridge', result, indent=2)}")


if __name__ == "__main__":
    app.run(main)
