"""Why does Python's ``aoti_load_package`` crash on the GPU machine? One call, several answers.

On the H200 (torch 2.11) a fresh process that loads a CUDA AOTInductor package with
``torch._inductor.aoti_load_package`` ended in SIGSEGV, both for a plain MLP package and for the
attention-op package, while TorchCall's C++ loader ran CUDA packages there. This probe builds two
CUDA packages (a plain MLP, and the tiny engine with Triton attention through
``tests/torch_call/engine_package_child.py``), then loads each in fresh processes under
``faulthandler`` in several ways:

    cold         load first, CUDA untouched (what the tests and the benchmark did)
    cuda_first   initialise CUDA (a device tensor) before loading
    device_0     load with ``device_index=0`` before CUDA is touched
    no_isa_probe ``torch_engine.aoti_loading.load_package`` (no CPU-ISA probe builds)
    preload_libstdcxx  the same in ``torch_engine.aoti_loading.loader_environment()`` (the
                 compiler's ``libstdc++.so`` in ``LD_PRELOAD``), the fix for the crash in the
                 wrapper's ``std::regex``

Each built package's wrapper library is listed with ``ldd`` (which ``libstdc++`` it binds to).

and calls the loaded package on real inputs (the engine's answer must equal eager
``Engine.recommend``'s items). The first variant that crashes runs again under ``cuda-gdb`` for
a native backtrace. Prints a table and writes ``probe_aoti_loader.json`` under ``--out`` after
every step, and stops starting new steps at ``--deadline`` seconds, so a call cut off by its time
limit still returns what was learnt. Run it without a pipe (``| tail`` dies with the command and
takes the output with it).

    python -m experiments.probe_aoti_loader --out=$OUT
    python -m experiments.probe_aoti_loader --device=cpu     # rehearsal of the script on a CPU
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from absl import app, flags

from benchmarks import results_file as rf
from torch_engine.aoti_loading import loader_environment

ROOT = rf.ROOT
CHILD = ROOT / "tests" / "torch_call" / "engine_package_child.py"

flags.DEFINE_string("out", "/tmp/probe_aoti", "folder for probe_aoti_loader.json")
flags.DEFINE_string("work", "/tmp/probe_aoti_work", "scratch folder for the packages")
flags.DEFINE_string("device", "cuda", "cuda, or cpu to rehearse the script")
flags.DEFINE_integer("compile_timeout", 200, "seconds allowed for both package builds")
flags.DEFINE_integer("deadline", 260, "seconds after which no new step starts")
flags.DEFINE_integer("load_timeout", 45, "seconds allowed for one load-and-call child")
flags.DEFINE_list("kinds", ["mlp", "engine"], "packages to build and load")
flags.DEFINE_list("variants", ["cold", "cuda_first", "device_0", "no_isa_probe",
                                "preload_libstdcxx"], "ways to load each package")
FLAGS = flags.FLAGS

_COMPILE_MLP = textwrap.dedent("""
    import sys, torch
    dev = sys.argv[3]
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 16)).to(dev).eval()
    x = torch.randn(8, 64, device=dev)
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(net, (x,), dynamic_shapes=({0: batch},))
    torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[1])
    torch.save({"x": x.cpu(), "y": net(x).detach().cpu()}, sys.argv[2])
""")

_LOAD = textwrap.dedent("""
    import faulthandler, json, sys
    # A hang shows where it waits: every Python thread's stack every 10 s, on stderr.
    faulthandler.dump_traceback_later(10, repeat=True)
    print("importing torch", flush=True)
    import torch
    print("torch imported", flush=True)
    kind, variant, package, data_path, dev = sys.argv[1:]
    if variant == "cuda_first":
        torch.empty(1, device=dev)
    kwargs = {"device_index": 0} if variant == "device_0" else {}
    print("calling aoti_load_package", flush=True)
    if variant in ("no_isa_probe", "preload_libstdcxx"):
        from torch_engine.aoti_loading import load_package
        runner = load_package(package)
    else:
        runner = torch._inductor.aoti_load_package(package, **kwargs)
    print("loaded", flush=True)
    data = torch.load(data_path)
    with torch.no_grad():
        if kind == "mlp":
            got = runner(data["x"].to(dev))
            got = got[0] if isinstance(got, (list, tuple)) else got
            ok = torch.allclose(got.cpu(), data["y"], rtol=1e-3, atol=1e-3)
        else:
            items, scores = runner(*[t.to(dev) for t in data["inputs"]])
            ok = torch.equal(items.cpu(), data["items"])
    if dev != "cpu":
        torch.cuda.synchronize()
    print(json.dumps({"matches": bool(ok)}), flush=True)
""")


def _run(args: list[str], timeout: int, env: dict | None = None) -> dict:
    started = time.perf_counter()
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              env=env or os.environ.copy())
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as error:
        rc, out, err = "timeout", str(error.stdout or ""), str(error.stderr or "")
    return {"rc": rc, "seconds": round(time.perf_counter() - started, 1),
            "stdout": out[-1500:], "stderr": err[-3000:], "stdout_full": out[:200000]}


def _wrapper_ldd(package: Path, into: Path) -> dict:
    """``ldd`` of the package's shared libraries (extracted under ``into``)."""
    import zipfile
    out = {}
    with zipfile.ZipFile(package) as archive:
        for name in archive.namelist():
            if name.endswith(".so"):
                path = Path(archive.extract(name, into))
                out[name] = _run(["ldd", str(path)], 30)["stdout"][-1500:]
    return out


def _run_watched(args: list[str], timeout: int, env: dict) -> dict:
    """``_run`` for a child that may hang: on timeout, before killing it, a native backtrace
    of all its threads from ``gdb -p`` (when gdb is installed), so the wait is located."""
    started = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    native = ""
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
        if shutil.which("gdb"):
            native = _run(["gdb", "-p", str(proc.pid), "-batch", "-ex",
                           "thread apply all bt 30"], 60)["stdout"]
        proc.kill()
        out, err = proc.communicate()
    return {"rc": rc, "seconds": round(time.perf_counter() - started, 1),
            "stdout": out[-1500:], "stderr": err[-6000:], "native_backtrace": native[-8000:]}


def main(argv: list[str]) -> int:
    del argv
    out, work, dev = Path(FLAGS.out), Path(FLAGS.work), FLAGS.device
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    (work / "engine").mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    py = [sys.executable, "-X", "faulthandler"]
    started = time.monotonic()

    def save() -> None:
        rf.write_json(out / "probe_aoti_loader.json", report)

    def time_left() -> float:
        return FLAGS.deadline - (time.monotonic() - started)

    # Both packages compile at once (the machine has 16 cores); the MLP's loads run while the
    # engine still compiles.
    target = "cuda:0" if dev == "cuda" else "cpu"
    builders = {
        "mlp": lambda: subprocess.Popen(
            py + ["-c", _COMPILE_MLP, str(work / "mlp.pt2"), str(work / "mlp_data.pt"), dev],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env),
        "engine": lambda: subprocess.Popen(
            py + [str(CHILD), "export", str(work / "engine"), target,
                  "triton" if dev == "cuda" else "torch"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)}
    procs = {name: builders[name]() for name in FLAGS.kinds}
    report: dict = {"device": dev, "builds": {}, "loads": [], "backtrace": None}
    crashed = None
    files = {"mlp": (work / "mlp.pt2", work / "mlp_data.pt"),
             "engine": (work / "engine" / "engine.pt2", work / "engine" / "eager.pt")}
    for name, proc in procs.items():
        package, data = files[name]
        try:
            budget = max(1.0, min(FLAGS.compile_timeout - (time.monotonic() - started),
                                  time_left()))
            _, stderr = proc.communicate(timeout=budget)
            report["builds"][name] = {"rc": proc.returncode, "stderr": stderr[-3000:]}
        except subprocess.TimeoutExpired:
            proc.kill()
            report["builds"][name] = {"rc": "timeout", "stderr": ""}
        report["builds"][name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"build {name}: rc={report['builds'][name]['rc']} "
              f"({report['builds'][name]['seconds']} s)", flush=True)
        if package.exists() and shutil.which("ldd"):
            report.setdefault("ldd", {})[name] = _wrapper_ldd(package, work / f"{name}_so")
        save()
        for variant in FLAGS.variants:
            if not package.exists() or time_left() < 10:
                break
            child_env = env
            if variant == "preload_libstdcxx":
                child_env = loader_environment(env)   # what the project's loaders use
                if child_env == env:
                    report["loads"].append({"kind": name, "variant": variant, "rc": "skipped",
                                            "seconds": 0, "stdout": "", "stderr": "no g++"})
                    continue
            result = _run_watched(py + ["-c", _LOAD, name, variant, str(package), str(data),
                                        dev], int(min(FLAGS.load_timeout, time_left())),
                                  child_env)
            result.update(kind=name, variant=variant)
            report["loads"].append(result)
            print(f"load {name:6s} {variant:10s} rc={result['rc']} "
                  f"{result['stdout'].strip().splitlines()[-1:] if result['stdout'] else ''}",
                  flush=True)
            if isinstance(result["rc"], int) and result["rc"] < 0 and crashed is None:
                crashed = (name, variant, package, data)
            save()
    if (work / "engine" / "export.json").exists():
        report["engine_export"] = json.loads((work / "engine" / "export.json").read_text())
        save()

    if crashed and shutil.which("cuda-gdb") and time_left() > 20:
        kind, variant, package, data = crashed
        script = work / "load.py"
        script.write_text(_LOAD)
        report["backtrace"] = _run(
            ["cuda-gdb", "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable,
             str(script), kind, variant, str(package), str(data), dev], int(time_left()), env)
        # The innermost frames say where it crashed: keep the backtrace's head, not its tail.
        frames = report["backtrace"].pop("stdout_full", "")
        report["backtrace"]["stdout"] = frames[frames.find("#0 "):][:6000] or frames[-6000:]
    save()

    print("\n| package | variant | rc | s | last line |\n| --- | --- | --- | --- | --- |")
    for row in report["loads"]:
        last = (row["stdout"].strip().splitlines() or row["stderr"].strip().splitlines()
                or [""])[-1][:70]
        print(f"| {row['kind']} | {row['variant']} | {row['rc']} | {row['seconds']} | {last} |")
    for row in report["loads"]:
        if row.get("native_backtrace") or row["rc"] != 0:
            print(f"\n== {row['kind']} {row['variant']} rc={row['rc']}: stderr tail\n"
                  + row["stderr"][-2500:])
            if row.get("native_backtrace"):
                print("-- native threads (gdb):\n" + row["native_backtrace"][-4000:])
    if report["backtrace"]:
        print("\nbacktrace (cuda-gdb):\n" + report["backtrace"]["stdout"][-2500:])
    return 0


if __name__ == "__main__":
    app.run(main)
