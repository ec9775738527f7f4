"""Per-call cost of the TorchCall op, beside the same package from Python and the same MLP as a
native TF graph.

Model: ``[B, 64] -> Linear(64, 64) -> SiLU -> Linear(64, 16)``, float32, compiled once with
AOTInductor (cached in ``--cache_dir``). Each implementation is timed (median over repeats):

* ``eager``: one call from Python (TorchCall op / the package via ``aoti_load_package`` / TF ops);
* ``function``: one call of a ``tf.function`` holding the computation (TF's per-call floor is
  measured with a ``tf.function`` holding only ``tf.identity``);
* ``while_loop``: per iteration of a ``tf.while_loop`` of ``--loop`` steps inside one
  ``tf.function``, minus the loop's own per-iteration cost (an identity body);
* ``saved_model``: one call of the restored SavedModel's signature (floor: a saved identity).

TorchCall's own cost is its time minus the matching floor. Torch and TF both get one intra-op
thread, so the compute is comparable. Prints a table and writes
``benchmarks/results/torchcall_<date>.json``.

With ``--device=cuda``, the package is compiled for the GPU while TF stays on the CPU (as in
serving: string ops are CPU-only): every TorchCall moves its input to the GPU and the result
back, and the Python case does the same (``.to(device)`` ... ``.cpu()``). A second table times
the prompt hand-off alone: ``[64, 1024]`` int64 tokens TF CPU -> CUDA and ``[64, 300]`` int64
results CUDA -> TF through ``bridge.dlpack``, against a TorchCall round trip of the same sizes.
Writes ``torchcall_cuda_<date>.json``.

    python -m benchmarks.bench_torchcall [--repeats=300] [--loop=200] [--batches=8,1024]
                                         [--device=cuda]
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from absl import app, flags
from tqdm import tqdm

from benchmarks import results_file as rf
from torch_engine import aoti_loading
# xgr_export imports triton on import, before main() imports tensorflow (both carry LLVM).
from xgr_export import torch_package

ROOT = rf.ROOT
MODULE = "benchmarks.bench_torchcall"

REPEATS = flags.DEFINE_integer("repeats", 300, "timed calls per case (median reported)")
LOOP = flags.DEFINE_integer("loop", 200, "iterations of the tf.while_loop cases")
BATCHES = flags.DEFINE_list("batches", ["8", "1024"], "batch sizes")
CACHE = flags.DEFINE_string("cache_dir", str(ROOT / "build" / "torch_call_cache"),
                            "compiled AOTInductor packages by content hash")
OUTPUT = flags.DEFINE_string("output_dir", str(ROOT / "benchmarks" / "results"),
                             "where the JSON goes")
DEVICE = flags.DEFINE_string("device", "cpu", "where the package runs: cpu or cuda[:i]")
LOADER_TIMEOUT = flags.DEFINE_integer(
    "python_loader_timeout", 60, "seconds a child may take to load the CUDA package with "
    "Python's aoti_load_package before the Python column is dropped")
BUILD_ONLY = flags.DEFINE_string("build_only", None, "only compile the package to this path "
                                 "(the GPU run compiles in a child process)")
WIDTH, OUT = 64, 16
PROMPT, KEPT = (64, 1024), 300   # hand-off sizes: a batch of prompts in, top items out


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.SiLU(),
                               torch.nn.Linear(WIDTH, OUT)).eval()


def _median_us(fn, repeats: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


class KeepFirst(torch.nn.Module):
    """tokens int64 [B, L] -> tokens[:, :KEPT] + 1 (a new tensor: the copy back is real)."""

    def forward(self, tokens):
        return tokens[:, :KEPT] + 1


def bench_handoff(tf, device: str, tmp: Path) -> dict[str, float]:
    """The prompt hand-off between TF on the CPU and torch on ``device`` (microseconds)."""
    from bridge.dlpack import to_tf, to_torch
    from custom_ops.torch_call import torch_call

    tokens_np = np.random.default_rng(0).integers(0, 50_000, PROMPT).astype(np.int64)
    tokens = tf.constant(tokens_np)
    on_device = torch.from_numpy(tokens_np[:, :KEPT].copy()).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def to_device():
        to_torch(tokens, device)
        sync()

    package = torch_package.package_torchscript(
        KeepFirst(), (torch.from_numpy(tokens_np),), tmp / "keep_first.pt",
        {(0, 0): ("batch", 1, 4096), (0, 1): ("length", KEPT, 8192)}, device=device)
    path = str(package.path)
    got = torch_call(path, [tokens], [tf.int64])[0].numpy()
    np.testing.assert_array_equal(got, tokens_np[:, :KEPT] + 1)
    repeats = REPEATS.value
    return {
        "to_device_int64_64x1024": _median_us(to_device, repeats),
        "to_tf_int64_64x300": _median_us(lambda: to_tf(on_device.cpu()), repeats),
        "torchcall_roundtrip_64x1024_to_64x300": _median_us(
            lambda: torch_call(path, [tokens], [tf.int64]), repeats),
    }


class Implementations:
    """The three implementations of one MLP as TF-callable pieces."""

    def __init__(self, tf, module: torch.nn.Module, package_path: str):
        from custom_ops.torch_call import torch_call

        self.tf, self.path = tf, package_path
        w1, b1, w2, b2 = (p.detach().numpy() for p in module.parameters())
        self.w1, self.b1 = tf.constant(w1.T), tf.constant(b1)
        self.w2, self.b2 = tf.constant(w2.T), tf.constant(b2)
        self.torch_call = torch_call

    def torchcall(self, x):
        return self.torch_call(self.path, [x], [self.tf.float32], output_shapes=[[None, OUT]])[0]

    def native(self, x):
        tf = self.tf
        return tf.matmul(tf.nn.silu(tf.matmul(x, self.w1) + self.b1), self.w2) + self.b2


def _loop_function(tf, body, loop: int):
    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32)])
    def run(x):
        def step(i, acc):
            return i + 1, acc + tf.reduce_sum(body(x))
        return tf.while_loop(lambda i, _: i < loop, step, (tf.constant(0), tf.constant(0.0)))[1]
    return run


def _saved(tf, fn, path: Path):
    module = tf.Module()
    module.serve = tf.function(lambda x: {"y": fn(x)},
                               input_signature=[tf.TensorSpec([None, WIDTH], tf.float32)])
    tf.saved_model.save(module, str(path),
                        signatures={"serving_default": module.serve.get_concrete_function()})
    return tf.saved_model.load(str(path)).signatures["serving_default"]


def bench_batch(tf, impl: Implementations, loader, batch: int, tmp: Path) -> dict[str, float]:
    x_np = np.random.default_rng(batch).standard_normal((batch, WIDTH)).astype(np.float32)
    x, x_torch = tf.constant(x_np), torch.from_numpy(x_np)
    np.testing.assert_allclose(impl.torchcall(x).numpy(), impl.native(x).numpy(), atol=1e-4)
    identity = lambda v: tf.identity(v)  # noqa: E731
    fns = {"torchcall": impl.torchcall, "native": impl.native, "identity": identity}
    spec = [tf.TensorSpec([None, WIDTH], tf.float32)]
    traced = {k: tf.function(f, input_signature=spec) for k, f in fns.items()}
    loops = {k: _loop_function(tf, f, LOOP.value) for k, f in fns.items()}
    saved = {k: _saved(tf, f, tmp / f"{k}_{batch}") for k, f in fns.items()}
    cases = {
        "eager/torchcall": lambda: impl.torchcall(x),
        **({"eager/torch_python": lambda: loader(x_torch)} if loader else {}),
        "eager/native_tf": lambda: impl.native(x),
        **{f"function/{k}": (lambda f=f: f(x)) for k, f in traced.items()},
        **{f"saved_model/{k}": (lambda f=f: f(x=x)) for k, f in saved.items()},
    }
    result = {}
    for name, fn in tqdm(cases.items(), desc=f"batch {batch}", leave=False):
        result[name] = _median_us(fn, REPEATS.value)
    for name, fn in loops.items():  # per iteration
        result[f"while_loop/{name}"] = _median_us(lambda fn=fn: fn(x), max(REPEATS.value // 10, 5),
                                                  warmup=3) / LOOP.value
    result["own/function"] = result["function/torchcall"] - result["function/identity"]
    result["own/while_loop"] = result["while_loop/torchcall"] - result["while_loop/identity"]
    result["own/saved_model"] = result["saved_model/torchcall"] - result["saved_model/identity"]
    return result


def _table(results: dict[int, dict[str, float]]) -> str:
    names = list(next(iter(results.values())))
    rows = [["case (us per call)", *(f"batch {b}" for b in results)]]
    rows += [[n, *(f"{results[b][n]:.1f}" for b in results)] for n in names]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                               enumerate(zip(row, widths))) for row in rows)


def _child_env() -> dict:
    """This environment with the checkout importable (the child imports torch_engine)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _python_loader(path: Path, device: str):
    """``(callable, None)`` running the package from Python the way TorchCall does (host tensor
    in, host tensor out), or ``(None, reason)`` when Python's loader cannot load it here.

    On the H200, plain ``aoti_load_package`` of CUDA packages did not return within 40 s
    (Inductor's CPU-ISA probe builds, which ``torch_engine.aoti_loading.load_package`` skips)
    or ended the process with SIGSEGV (without the preloaded ``libstdc++`` that ``main``
    restarts this process with). A child still tries first, so a crash or a hang costs the
    Python column, not the benchmark."""
    if device != "cpu":
        try:
            probe = subprocess.run([sys.executable, "-c", "import sys; from torch_engine."
                                    "aoti_loading import load_package; load_package(sys.argv[1])",
                                    str(path)], capture_output=True, text=True,
                                   timeout=LOADER_TIMEOUT.value, env=_child_env())
        except subprocess.TimeoutExpired:
            return None, (f"torch._inductor.aoti_load_package did not return within "
                          f"{LOADER_TIMEOUT.value} s in a child")
        if probe.returncode != 0:
            return None, (f"torch._inductor.aoti_load_package failed in a child (rc "
                          f"{probe.returncode}): {probe.stderr.strip()[-300:]}")
    compiled = aoti_loading.load_package(path)
    if device == "cpu":
        return compiled, None
    return (lambda x: compiled(x.to(device)).cpu()), None


def build_package(path: Path, device: str) -> "torch_package.Package":
    """The MLP as an AOTInductor package for ``device`` at ``path`` (contract beside it)."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch_package.export_program(_mlp(), (torch.randn(8, WIDTH),), ({0: batch},),
                                           device)
    package = torch_package.package_aoti(program, path, device, cache_dir=CACHE.value)
    Path(f"{path}.json").write_text(json.dumps(package.to_json()))
    return package


def main(argv):
    del argv
    if BUILD_ONLY.value:
        build_package(Path(BUILD_ONLY.value), DEVICE.value)
        return
    device = DEVICE.value
    if device != "cpu" and not aoti_loading.preloaded():
        # The Python column loads the CUDA package in this process, which must start with the
        # compiler's libstdc++ preloaded (torch_engine.aoti_loading): start again with it.
        os.execve(sys.executable, [sys.executable, "-m", MODULE, *sys.argv[1:]],
                  aoti_loading.loader_environment(_child_env()))
    torch.set_num_threads(1)
    module = _mlp()
    with tempfile.TemporaryDirectory(prefix="bench_torchcall_") as tmp_name:
        tmp = Path(tmp_name)
        if device == "cpu":
            package = build_package(tmp / "mlp.pt2", device)
        else:
            # Compiled in a child, so the timed process holds no Inductor compile workers.
            subprocess.run([sys.executable, "-m", MODULE, f"--build_only={tmp / 'mlp.pt2'}",
                            f"--device={device}", f"--cache_dir={CACHE.value}"], check=True,
                           cwd=ROOT)
            package = torch_package.Package.from_json(
                json.loads((tmp / "mlp.pt2.json").read_text()))
        loader, skipped = _python_loader(package.path, device)
        module = module.cpu()

        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        impl = Implementations(tf, module, str(package.path))
        results = {int(b): bench_batch(tf, impl, loader, int(b), tmp) for b in BATCHES.value}
        handoff = bench_handoff(tf, device, tmp) if device != "cpu" else {}
    print(_table(results))
    if skipped:
        print(f"eager/torch_python not measured: {skipped}")
    if handoff:
        print(f"hand-off on {device} (us): " + ", ".join(f"{k} {v:.1f}"
                                                         for k, v in handoff.items()))
    record = {
        "benchmark": "torchcall", "date": datetime.datetime.now(datetime.UTC).isoformat(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "tensorflow": tf.__version__,
        "torch": torch.__version__, "model": f"MLP {WIDTH}-{WIDTH}-{OUT} float32",
        "device": device, "gpu": torch.cuda.get_device_name() if device != "cpu" else None,
        "repeats": REPEATS.value, "loop": LOOP.value, "median_us": results,
        "handoff_median_us": handoff, "torch_python_skipped": skipped,
    }
    prefix = "torchcall" if device == "cpu" else "torchcall_cuda"
    print(f"wrote {rf.write_result(OUTPUT.value, prefix, record)}")


if __name__ == "__main__":
    app.run(main)
