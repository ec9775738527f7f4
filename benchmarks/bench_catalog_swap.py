"""A catalog swap through ``xgr serve`` under load: what a daily catalog refresh costs.

    python -m benchmarks.bench_catalog_swap --preset=qwen2-0.5b --device=cuda:0 --items=1000000

1. A team's files for a random-weight preset (checkpoint with its ``xgr_model.json``, catalog,
   feature-graph weights), exported with ``--catalog_headroom`` (the one compile).
2. A new catalog: ``--churn`` of the items retired, as many new ones added on served paths;
   exported with ``--engine_from`` (no compile): the seconds it takes.
3. ``xgr serve`` on version 1 with ``--clients`` REST clients; version 2 is moved in (one
   rename) mid-run. Reported: seconds from the rename to version 2 serving, failed requests,
   latency before and after, the server's memory (GPU by ``nvidia-smi``, else its resident
   set) before, at the peak of the swap and after, and whether any answer after the swap
   holds a retired item.
Prints a table and writes ``results/catalog_swap_<date>_<label>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.gpu_sampler import GpuSampler
from benchmarks.serve_process import ROOT, child_env, start_server, stop_server
from benchmarks.team_files import write_team_files

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "tiny", "Random-weight model preset.")
flags.DEFINE_string("device", "cpu", "The engine's device: cpu or cuda[:i].")
flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"], "Engine dtype (default: "
                  "the device's).")
flags.DEFINE_integer("items", 3000, "Catalog items.")
flags.DEFINE_integer("users", 64, "Users of the synthetic world (the clients' requests).")
flags.DEFINE_integer("history_events", 40, "History events per user.")
flags.DEFINE_integer("keep_last", 50, "History items kept per prompt.")
flags.DEFINE_integer("beam_width", 16, "Beam width.")
flags.DEFINE_integer("top_k", 12, "Items the engine returns.")
flags.DEFINE_integer("max_batch", 64, "Largest batch the package accepts.")
flags.DEFINE_float("headroom", 1.2, "--catalog_headroom of the first export.")
flags.DEFINE_float("churn", 0.01, "Share of the items retired (and as many added).")
flags.DEFINE_integer("clients", 4, "Concurrent REST clients.")
flags.DEFINE_float("before_seconds", 10.0, "Load before version 2 appears.")
flags.DEFINE_float("after_seconds", 10.0, "Load after version 2 serves.")
flags.DEFINE_float("swap_limit", 300.0, "Seconds version 2 may take to serve.")
flags.DEFINE_string("work", None, "Working folder (default: a temporary one, removed).")
flags.DEFINE_string("label", "cpu", "Device label of the result file.")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "benchmarks", "results"), "Result folder.")


def team_files(folder: Path, world) -> dict[str, Path]:
    """A random-weight ``--preset`` as a team would hand it over, over the world's catalog."""
    from xgr_common.prompt_spec import PromptSpec
    from torch_engine.config import preset

    spec = PromptSpec(model_hidden=preset(FLAGS.preset).hidden_size, keep_last=FLAGS.keep_last,
                      window_seconds=3650 * 86400)
    return write_team_files(folder, FLAGS.preset, spec, world.item_ids, world.item_codes)


def next_catalog(world, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``--churn`` of the items retired and as many new ids added on the paths of kept items;
    returns (retired ids, added ids)."""
    from xgr_checkpoint.catalog_file import write_catalog

    rng = np.random.default_rng(1)
    ids, codes = world.item_ids, world.item_codes
    count = max(1, int(len(ids) * FLAGS.churn))
    retired = rng.choice(ids, count, replace=False)
    keep = ~np.isin(ids, retired)
    added = np.arange(count, dtype=np.int64) + ids.max() + 1
    donors = rng.choice(np.flatnonzero(keep), count, replace=False)
    write_catalog(path, np.concatenate([ids[keep], added]),
                  np.concatenate([codes[keep], codes[donors]]))
    return retired, added


def export(files: dict, out: Path, *extra: str) -> tuple[dict, float]:
    """``xgr export`` in a child process: its report and its wall seconds."""
    report = out.parent / f"{out.name}.report.json"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "xgr_cli.main", "export", f"--model={files['model']}",
         f"--catalog={files['catalog']}", f"--feature_graph={files['feature_graph']}",
         f"--out={out}", f"--device={FLAGS.device}", f"--beam_width={FLAGS.beam_width}",
         f"--top_k={FLAGS.top_k}", f"--top_n={FLAGS.top_k}", f"--max_batch={FLAGS.max_batch}",
         "--cache_dir=", "--verify_requests=4", f"--report_json={report}",
         *([f"--dtype={FLAGS.dtype}"] if FLAGS.dtype else []), *extra],
        cwd=ROOT, env=child_env(TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"xgr export failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(report.read_text()), seconds


class Clients:
    """``--clients`` threads sending one request each in a loop: (time, seconds, status,
    item ids) per answer."""

    def __init__(self, port: int, bodies: list[bytes]):
        self.records: list[tuple[float, float, int, np.ndarray | None]] = []
        self._port, self._bodies, self._stop = port, bodies, threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(FLAGS.clients)]

    def __enter__(self) -> "Clients":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _run(self, index: int) -> None:
        url = f"http://127.0.0.1:{self._port}/v1/models/recs:predict"
        turn = index
        while not self._stop.is_set():
            body = self._bodies[turn % len(self._bodies)]
            turn += FLAGS.clients
            started = time.perf_counter()
            request = urllib.request.Request(url, data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    items = np.asarray(json.loads(response.read())["outputs"]["item_ids"])
                    status = response.status
            except urllib.error.HTTPError as error:
                items, status = None, error.code
            except OSError:
                items, status = None, 0
            self.records.append((time.monotonic(), time.perf_counter() - started, status, items))


def serving_version(port: int) -> int | None:
    """The highest AVAILABLE version of ``recs``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/recs", timeout=30) as reply:
        states = json.loads(reply.read())["model_version_status"]
    available = [int(v["version"]) for v in states if v["state"] == "AVAILABLE"]
    return max(available) if available else None


def resident_mib(pid: int) -> float:
    """The process's resident set (MiB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def latency(records, start: float, end: float) -> dict:
    """P50 / P99 (ms) and count of the answers inside [start, end)."""
    seconds = [s for t, s, status, _ in records if start <= t < end and status == 200]
    if not seconds:
        return {"requests": 0, "p50_ms": None, "p99_ms": None}
    return {"requests": len(seconds), "p50_ms": float(np.percentile(seconds, 50) * 1e3),
            "p99_ms": float(np.percentile(seconds, 99) * 1e3)}


def _pair(window: dict) -> str:
    if window["p50_ms"] is None:
        return "no answers"
    return f"{window['p50_ms']:.1f} / {window['p99_ms']:.1f}"


def main(argv: list[str]) -> None:
    del argv
    # torch before TensorFlow: torch imported after TF crashes in its own import on the GPU
    # host (tf_frontend loads Triton first, not torch).
    import torch_engine.model  # noqa: F401
    from tf_frontend.feature_graph import features_from_world
    from xgr_world.synthetic import WorldConfig, make_world

    work = Path(FLAGS.work or tempfile.mkdtemp(prefix="xgr_catalog_swap_"))
    base, staged = work / "models" / "recs", work / "staged"
    base.mkdir(parents=True, exist_ok=True)
    staged.mkdir(exist_ok=True)
    world = make_world(WorldConfig(num_items=FLAGS.items, num_users=FLAGS.users,
                                   history_events=FLAGS.history_events, seed=0))
    files = team_files(work / "team", world)
    print(f"exporting version 1 ({FLAGS.preset}, {FLAGS.items:,} items, headroom "
          f"{FLAGS.headroom}) ...", flush=True)
    first, first_seconds = export(files, staged / "1", f"--catalog_headroom={FLAGS.headroom}")
    os.rename(staged / "1", base / "1")
    retired, added = next_catalog(world, work / "team" / "catalog_2.parquet")
    print("exporting version 2 (the new catalog, --engine_from) ...", flush=True)
    second, second_seconds = export({**files, "catalog": work / "team" / "catalog_2.parquet"},
                                    staged / "2", f"--engine_from={base / '1'}")

    bodies = []
    for start in range(0, FLAGS.users, 4):
        features = features_from_world(world, slice(start, start + 4))
        bodies.append(json.dumps({"inputs": {
            k: ([x.decode() for x in v.numpy()] if k == "country" else v.numpy().tolist())
            for k, v in features.items()}}).encode())
    process, _, rest_port = start_server(str(base), str(work / "server.log"), 16, 2000, 0.2)
    memory = []   # (time, MiB) of the server's resident set
    try:
        with GpuSampler() as gpu, Clients(rest_port, bodies) as clients:
            sampling = threading.Event()

            def sample():
                while not sampling.is_set():
                    memory.append((time.monotonic(), resident_mib(process.pid)))
                    time.sleep(0.2)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            time.sleep(FLAGS.before_seconds)
            appeared = time.monotonic()
            os.rename(staged / "2", base / "2")
            swap = None
            while time.monotonic() - appeared < FLAGS.swap_limit:
                if serving_version(rest_port) == 2:
                    swap = time.monotonic() - appeared
                    break
                time.sleep(0.1)
            served = time.monotonic()
            time.sleep(FLAGS.after_seconds)
            ended = time.monotonic()
            sampling.set()
        exit_code = stop_server(process)
    finally:
        if process.poll() is None:
            process.kill()
    records = clients.records
    failed = sum(1 for _, _, status, _ in records if status != 200)
    late = [items for t, _, status, items in records if status == 200 and t >= served + 1.0]
    retired_after = int(sum(np.isin(items, retired).sum() for items in late))
    start = records[0][0] if records else appeared

    def memory_of(lo, hi):
        values = [m for t, m in memory if lo <= t < hi]
        return max(values) if values else None

    gpu_before, gpu_swap, gpu_after = (gpu.window(start, appeared), gpu.window(appeared, served),
                                       gpu.window(served + 1.0, ended))
    result = ({
        "benchmark": "catalog_swap", "preset": FLAGS.preset, "device": FLAGS.device,
        "dtype": first["dtype"], "items": FLAGS.items, "churn": FLAGS.churn,
        "beam_width": FLAGS.beam_width, "top_k": FLAGS.top_k, "capacity": first["capacity"],
        "first_export_seconds": first_seconds, "first_package_seconds": first["package_seconds"],
        "catalog_export_seconds": second_seconds,
        "catalog_tables_seconds": second["package_seconds"],
        "package_shared": second["package_shared"], "verify_ok": second["verify"]["ok"],
        "swap_seconds": swap, "requests": len(records), "failed": failed,
        "retired_items_after_swap": retired_after,
        "before": latency(records, start, appeared), "after": latency(records, served + 1.0, ended),
        "server_rss_mib": {"before": memory_of(start, appeared),
                           "swap": memory_of(appeared, served + 1.0),
                           "after": memory_of(served + 1.0, ended)},
        "gpu": {"before": gpu_before, "swap": gpu_swap, "after": gpu_after}
        if gpu.available else None,
        "server_exit": exit_code})
    path = rf.write_result(FLAGS.out_dir, "catalog_swap", result, tag=FLAGS.label)
    rows = [("first export (compile) s", f"{first_seconds:.1f}"),
            ("catalog version export s", f"{second_seconds:.1f} (tables "
                                         f"{second['package_seconds']:.1f})"),
            ("package shared", str(second["package_shared"])),
            ("swap: rename -> serving s", "never" if swap is None else f"{swap:.2f}"),
            ("requests / failed", f"{len(records)} / {failed}"),
            ("P50 / P99 ms before", _pair(result["before"])),
            ("P50 / P99 ms after", _pair(result["after"])),
            ("server RSS MiB before / swap / after",
             " / ".join(f"{v:.0f}" if v else "-" for v in result["server_rss_mib"].values())),
            ("GPU MiB before / swap / after", "no GPU" if not gpu.available else " / ".join(
                f"{w['gpu_memory_max_mib']:.0f}" if w else "-" for w in (gpu_before, gpu_swap,
                                                                    gpu_after))),
            ("retired items answered after the swap", str(retired_after))]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    print(f"result: {path}")
    if not FLAGS.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
