"""Tensor parallelism: one search's latency on 1, 2 and 4 GPUs, and the all-reduce's share.

    python -m benchmarks.bench_tensor_parallel --worlds=1,2,4          # qwen2-7b shape, NCCL
    python -m benchmarks.bench_tensor_parallel --device=cpu --preset=tiny --worlds=1,2 \\
        --prompt=64 --beam=8 --top_k=10 --items=2000 --paths=2000 --repeats=3   # gloo smoke

For each world size, that many worker processes (one per GPU with NCCL; gloo on the CPU), NVLink
multicast off. Each draws the preset's random weights (bf16 on GPUs, float32 on the CPU; seed 0,
so every rank holds the same model), keeps its slice (``shard_model``; world 1 keeps the whole
model: the single-GPU engine) and builds an ``Engine`` over the same random catalog (defaults:
on CUDA the whole search, all-reduces included, is one captured graph per shape). Every rank
runs ``Engine.recommend`` on the same item-causal prompts (``--batch`` rows of ``--prompt``
tokens, beam ``--beam``, top_k ``--top_k``) in lockstep, a barrier before each call; rank 0
times them (median of ``--repeats`` after warm-up). Then one profiled call of eager engines
(graphs off, so every kernel is seen): the device time of the kernels, and the share of it the
all-reduces take (NCCL's kernels; on the CPU the gloo operators' own time).

Checked: every rank returns the same items; world N's items against world 1's (equal within
the tolerance table's ranked-list rule at 16 bits: counted). Writes
``tensor_parallel_<date>[_<tag>].json`` and prints a table.
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from absl import app, flags

from benchmarks import engine_analysis as ea
from benchmarks import results_file as rf
from xgr_common.layout import TokenLayout
from xgr_common.multi_gpu import NO_MULTICAST

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "qwen2-7b", "Random-weight model preset.")
flags.DEFINE_list("worlds", ["1", "2", "4"], "Tensor-parallel world sizes to time.")
flags.DEFINE_enum("device", "cuda", ["cuda", "cpu"], "cuda: one GPU per rank (NCCL); cpu: "
                  "a smoke run of the script (gloo).")
flags.DEFINE_integer("prompt", 1024, "Prompt tokens per row.")
flags.DEFINE_integer("batch", 1, "Rows per call.")
flags.DEFINE_integer("beam", 256, "Beam width.")
flags.DEFINE_integer("top_k", 300, "Items returned.")
flags.DEFINE_integer("items", 1_000_000, "Catalog items.")
flags.DEFINE_integer("paths", 250_000, "Distinct code paths the items share.")
flags.DEFINE_integer("repeats", 20, "Timed calls per world.")
flags.DEFINE_bool("cuda_graphs", True, "Replay the search as CUDA graphs (the engine's "
                  "default); off: every call eager.")
flags.DEFINE_string("out", "benchmarks/results", "Folder of the JSON result.")
flags.DEFINE_string("tag", "", "Suffix of the result file name.")

LAYOUT = TokenLayout()
ITEM = 4                  # tokens per item: ITEM_START and 3 codes


@dataclass(frozen=True)
class Case:
    """What every rank of one world runs (the flags, passed to spawned processes)."""

    preset: str
    world: int
    device: str
    prompt: int
    batch: int
    beam: int
    top_k: int
    items: int
    paths: int
    repeats: int
    cuda_graphs: bool
    port: int
    out: str


def prompts(case: Case, device: torch.device):
    """``case.batch`` item-causal prompts of ``case.prompt`` tokens (seeded: every rank and
    every world the same), the last token opening the generated item."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(LAYOUT.code_base, LAYOUT.code_end, (case.batch, case.prompt),
                           generator=gen)
    columns = torch.arange(case.prompt)
    tokens[:, columns % ITEM == 0] = LAYOUT.item_start_id
    tokens[:, 0] = LAYOUT.bos_id
    segments = (columns // ITEM).to(torch.int32).repeat(case.batch, 1)
    lengths = torch.full((case.batch,), case.prompt)
    return tokens.to(device), lengths.to(device), segments.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allreduce_share(prof, cuda: bool) -> tuple[float, float]:
    """(all kernels' microseconds, the all-reduces' microseconds) of a profiled call: the
    device's kernel events on CUDA (host operators left out: their device time repeats their
    kernels'), the operators' own time on the CPU."""
    total = reduce = 0.0
    if cuda:
        for event in prof.events():
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = event.time_range.elapsed_us()
            total += us
            name = event.name.lower()
            reduce += us if "nccl" in name and "allreduce" in name.replace("_", "") else 0.0
        return total, reduce
    for event in prof.key_averages():
        us = event.self_cpu_time_total
        total += us
        reduce += us if ("all_reduce" in event.key or "allreduce" in event.key) else 0.0
    return total, reduce


def worker(rank: int, case: Case) -> None:
    """One rank of one world (see the module docstring); rank 0 writes ``case.out``."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from torch_engine.config import EngineConfig, preset
    from torch_engine.engine import Engine
    from torch_engine.model import Model
    from torch_engine.tensor_parallel import shard_model

    os.environ.update(NO_MULTICAST)
    cuda = case.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"tcp://127.0.0.1:{case.port}", rank=rank,
                            world_size=case.world, timeout=datetime.timedelta(minutes=10),
                            **({"device_id": device} if cuda else {}))
    try:
        dtype = torch.bfloat16 if cuda else torch.float32
        started = time.perf_counter()
        with torch.device(device):
            whole = Model(preset(case.preset))
        whole = whole.to(dtype).eval()
        whole.init_weights(0)
        model = whole if case.world == 1 else shard_model(whole, rank, case.world)
        del whole
        if cuda:
            torch.cuda.empty_cache()
        load_s = time.perf_counter() - started
        catalog = ea.random_catalog(case.items, min(case.paths, case.items), LAYOUT)
        tokens, lengths, segments = prompts(case, device)
        engine = Engine(model, catalog, EngineConfig(cuda_graphs=case.cuda_graphs))

        def call(which: Engine = engine):
            return which.recommend(tokens, lengths, segments, beam_width=case.beam,
                                   top_k=case.top_k)

        items, scores = call()
        call()
        times = []
        for _ in range(case.repeats):
            dist.barrier()
            _sync(device)
            start = time.perf_counter()
            call()
            _sync(device)
            times.append((time.perf_counter() - start) * 1e3)
        gathered = [torch.empty_like(items) for _ in range(case.world)]
        dist.all_gather(gathered, items)
        same_on_ranks = all(torch.equal(g, items) for g in gathered)

        eager = Engine(model, catalog, EngineConfig(cuda_graphs=False))
        call(eager)
        _sync(device)
        dist.barrier()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            call(eager)
            _sync(device)
        total_us, reduce_us = _allreduce_share(prof, cuda)
        if rank == 0:
            torch.save({
                "world": case.world, "times_ms": times, "load_s": load_s,
                "items": items.cpu(), "scores": scores.float().cpu(),
                "same_items_on_every_rank": same_on_ranks,
                "eager_kernels_ms": total_us / 1e3, "allreduce_ms": reduce_us / 1e3,
                "memory_gib": (torch.cuda.max_memory_allocated(device) / 2**30
                               if cuda else None),
                "heads_per_rank": model.config.num_heads,
                "kv_heads_per_rank": model.config.num_kv_heads}, case.out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_world(world: int, work: Path) -> dict:
    import torch.multiprocessing as mp

    case = Case(FLAGS.preset, world, FLAGS.device, FLAGS.prompt, FLAGS.batch, FLAGS.beam,
                FLAGS.top_k, FLAGS.items, FLAGS.paths, FLAGS.repeats, FLAGS.cuda_graphs,
                _free_port(), str(work / f"world{world}.pt"))
    print(f"world {world}: starting {world} rank(s) ...", flush=True)
    mp.start_processes(worker, args=(case,), nprocs=world, start_method="spawn")
    return torch.load(case.out)


def compare(items: torch.Tensor, base: torch.Tensor) -> dict:
    """How far world N's items are from world 1's: rows equal item by item, and the share of
    world 1's items that world N also returns."""
    rows_equal = int(sum(torch.equal(a, b) for a, b in zip(items, base)))
    overlap = [len(np.intersect1d(a[a >= 0].numpy(), b[b >= 0].numpy())) / max(int((b >= 0).sum()), 1)
               for a, b in zip(items, base)]
    return {"rows_equal": rows_equal, "rows": int(items.shape[0]),
            "overlap": float(np.mean(overlap))}


def main(argv: list[str]) -> None:
    del argv
    os.environ.update(NO_MULTICAST)
    worlds = sorted({int(w) for w in FLAGS.worlds})
    if FLAGS.device == "cuda":
        have = torch.cuda.device_count()
        if worlds[-1] > have:
            raise app.UsageError(f"--worlds asks for {worlds[-1]} GPUs; this host has {have}")
    work = Path(tempfile.mkdtemp(prefix="xgr_tp_"))
    rows, base = [], None
    for world in worlds:
        got = run_world(world, work)
        median = statistics.median(got["times_ms"])
        row = {"world": world, "median_ms": median,
               "p90_ms": float(np.percentile(got["times_ms"], 90)),
               "load_s": got["load_s"], "memory_gib": got["memory_gib"],
               "heads_per_rank": got["heads_per_rank"],
               "kv_heads_per_rank": got["kv_heads_per_rank"],
               "same_items_on_every_rank": got["same_items_on_every_rank"],
               "eager_kernels_ms": got["eager_kernels_ms"],
               "allreduce_ms": got["allreduce_ms"],
               "allreduce_share": got["allreduce_ms"] / max(got["eager_kernels_ms"], 1e-9)}
        if base is None:
            base = got
        row["speedup_over_first"] = statistics.median(base["times_ms"]) / median
        row["items_against_first"] = compare(got["items"], base["items"])
        rows.append(row)
    print(f"\n{FLAGS.preset}, prompt {FLAGS.prompt}, beam {FLAGS.beam}, batch {FLAGS.batch}, "
          f"top_k {FLAGS.top_k}, {FLAGS.device}, graphs {'on' if FLAGS.cuda_graphs else 'off'}")
    print(f"{'world':>6}{'median':>10}{'p90':>10}{'speedup':>9}{'all-reduce':>12}"
          f"{'share':>7}{'same':>6}{'overlap':>9}")
    for r in rows:
        print(f"{r['world']:>6}{r['median_ms']:>8.2f}ms{r['p90_ms']:>8.2f}ms"
              f"{r['speedup_over_first']:>9.2f}{r['allreduce_ms']:>10.2f}ms"
              f"{r['allreduce_share']:>7.0%}{'yes' if r['same_items_on_every_rank'] else 'NO':>6}"
              f"{r['items_against_first']['overlap']:>9.3f}")
    path = rf.write_result(FLAGS.out, "tensor_parallel", {
        "date": rf.utc_now(), "preset": FLAGS.preset, "device": FLAGS.device,
        "prompt": FLAGS.prompt, "batch": FLAGS.batch, "beam_width": FLAGS.beam,
        "top_k": FLAGS.top_k, "items": FLAGS.items, "paths": FLAGS.paths,
        "repeats": FLAGS.repeats, "cuda_graphs": FLAGS.cuda_graphs,
        "environment": dict(NO_MULTICAST), "rows": rows}, FLAGS.tag)
    print(f"wrote {path}")
    if not all(r["same_items_on_every_rank"] for r in rows):
        raise SystemExit("ranks of one world returned different items")


if __name__ == "__main__":
    app.run(main)
