"""``xgr catalog build`` at scale: residual k-means in torch on a given device beside faiss's
residual quantiser (faiss-cpu) on the same rows, end to end from an ``.npy`` file.

    python -m benchmarks.bench_catalog_build --items=1000000 --dim=64 --device=cpu
    python -m benchmarks.bench_catalog_build --items=10000000 --dim=256 --device=cuda \\
        --nofaiss --tag=h200          # the GPU machine has no faiss

The items are a Gaussian mixture (``--clusters`` centres, unit noise) with one in a thousand
an exact copy of another (the collisions a catalog of near-duplicates has), written as an
``.npy``; ``xgr_catalog.build_catalog`` then reads it, fits and encodes every row, caps the
paths, writes the catalog file and its report, and (``--faiss``) fits and encodes the same rows
with faiss's ``ResidualQuantizer`` (plain k-means per level, greedy encoding: the same
algorithm). Prints a table and writes ``catalog_build_<date>[_<tag>].json``; on stderr the
build's tqdm bars (``--noprogress`` leaves them out) and each stage's seconds as it ends, so a
long run's log shows where it is.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from absl import app, flags

from benchmarks import results_file as rf

FLAGS = flags.FLAGS
flags.DEFINE_integer("items", 1_000_000, "catalog items")
flags.DEFINE_integer("dim", 64, "embedding width")
flags.DEFINE_integer("clusters", 4096, "centres of the Gaussian mixture the items come from")
flags.DEFINE_integer("levels", 3, "code levels")
flags.DEFINE_integer("codebook_size", 256, "codes per level")
flags.DEFINE_integer("iterations", 20, "Lloyd iterations per level (faiss's niter too)")
flags.DEFINE_integer("train_sample", None, "rows both fit on (default: all)")
flags.DEFINE_integer("max_items_per_path", 16, "the cap on items per path")
flags.DEFINE_string("device", "cpu", "where ours runs: cpu, cuda, cuda:N")
flags.DEFINE_bool("progress", True, "the build's tqdm bars on stderr")
flags.DEFINE_bool("faiss", True, "also run faiss's residual quantiser (needs faiss-cpu)")
flags.DEFINE_string("out", "benchmarks/results", "folder for catalog_build_<date>.json")
flags.DEFINE_string("tag", "", "suffix of the result file name")
flags.DEFINE_string("work_dir", None, "where the .npy and the catalog go (default: a temp folder)")
flags.DEFINE_integer("threads", None, "CPU threads of torch and faiss (default: theirs, all "
                     "cores); 1 compares the two per core on a machine other work shares")


def make_items(count: int, dim: int, clusters: int, device: str) -> np.ndarray:
    """float32 [count, dim]: a seeded Gaussian mixture, 0.1% of rows copies of others."""
    gen = torch.Generator(device=device).manual_seed(0)
    centres = torch.randn((clusters, dim), generator=gen, device=device) * 3.0
    out = np.empty((count, dim), dtype=np.float32)
    step = 1 << 20
    for start in range(0, count, step):
        rows = min(step, count - start)
        which = torch.randint(clusters, (rows,), generator=gen, device=device)
        block = centres[which] + torch.randn((rows, dim), generator=gen, device=device)
        out[start:start + rows] = block.cpu().numpy()
    rng = np.random.default_rng(1)
    copies = rng.integers(0, count, count // 1000)
    out[copies] = out[rng.integers(0, count, copies.shape[0])]
    return out


def main(argv: list[str]) -> None:
    del argv
    from xgr_catalog import CatalogBuildConfig, build_catalog

    # build_catalog logs each stage's seconds at INFO; absl's handler puts them on stderr.
    logging.getLogger("xgr_catalog").setLevel(logging.INFO)
    if FLAGS.threads:
        torch.set_num_threads(FLAGS.threads)
        if FLAGS.faiss:
            import faiss

            faiss.omp_set_num_threads(FLAGS.threads)
    load_before = os.getloadavg()
    if FLAGS.work_dir:
        Path(FLAGS.work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xgr_bench_catalog_build_",
                                     dir=FLAGS.work_dir) as work:
        source = Path(work) / "items.npy"
        start = time.perf_counter()
        np.save(source, make_items(FLAGS.items, FLAGS.dim, FLAGS.clusters,
                                   "cuda" if FLAGS.device.startswith("cuda") else "cpu"))
        make_s = time.perf_counter() - start
        config = CatalogBuildConfig(
            embeddings=str(source), out=str(Path(work) / "catalog.parquet"),
            levels=FLAGS.levels, codebook_size=FLAGS.codebook_size,
            iterations=FLAGS.iterations, train_sample=FLAGS.train_sample,
            max_items_per_path=FLAGS.max_items_per_path, device=FLAGS.device,
            faiss=FLAGS.faiss, progress=FLAGS.progress)
        start = time.perf_counter()
        report = build_catalog(config)
        build_s = time.perf_counter() - start
    print(report.summary())
    result = {"date": rf.utc_now(), "cpu_count": os.cpu_count(),
              "torch_threads": torch.get_num_threads(),
              # other work on the machine slows both sides: the 1/5/15-minute load averages
              "load_average": {"before": load_before, "after": os.getloadavg()},
              "items": FLAGS.items, "dim": FLAGS.dim,
              "clusters": FLAGS.clusters, "data_s": make_s, "build_s": build_s,
              "build_s_without_faiss": build_s - report.timings.get("faiss", 0.0),
              "config": {name: getattr(config, name) for name in (
                  "levels", "codebook_size", "iterations", "train_sample",
                  "max_items_per_path", "candidates", "beam_width", "top_k", "device", "seed",
                  "chunk", "faiss_beam")},
              "report": {key: value for key, value in report.to_json().items()
                         if key not in ("catalog", "report_json", "plot", "plot_note")}}
    for use in result["report"]["code_use"]:
        del use["counts"]
    if FLAGS.faiss:
        import faiss

        result["versions"] = {"faiss-cpu": faiss.__version__}
    path = rf.write_result(FLAGS.out, "catalog_build", result, tag=FLAGS.tag, indent=2)
    print_table(report, build_s)
    print(f"wrote {path}")


def print_table(report, build_s: float) -> None:
    variance = report.variance
    print(f"\n{report.items} items x {report.dim} dims -> {report.levels} levels x "
          f"{report.codebook_size} codes, {report.iterations} iterations, fitted on "
          f"{report.train_rows} rows")
    print(f"{'':28s} {'fit s':>8s} {'encode s':>9s}  {'error / variance after each level':36s}"
          f" {'paths':>9s} {'most':>5s}")
    relative = lambda errors: " ".join(f"{e / variance:.4f}" for e in errors)  # noqa: E731
    print(f"{'ours (torch, ' + report.device + ')':28s} {report.timings['fit']:8.1f} "
          f"{report.timings['encode']:9.1f}  {relative(report.errors):36s} "
          f"{'':>9s} {report.collisions['max_items_per_path_before']:5d}")
    print(f"{'  after the cap of ' + str(report.collisions['cap']):28s} "
          f"{report.timings['cap']:8.1f} {'':9s}  {relative([report.error_after_cap]):36s} "
          f"{report.paths['paths']:9d} {report.paths['max_items_per_path']:5d}")
    if report.faiss is not None:
        faiss = report.faiss
        print(f"{'faiss ResidualQuantizer':28s} {faiss['train_s']:8.1f} "
              f"{faiss['encode_s']:9.1f}  {relative(faiss['errors']):36s} "
              f"{faiss['num_paths']:9d} {faiss['max_items_per_path']:5d}")
    ours = build_s - report.timings.get("faiss", 0.0)
    print(f"ours end to end (read, fit, encode, cap, write, report): {ours:.1f} s")


if __name__ == "__main__":
    app.run(main)
