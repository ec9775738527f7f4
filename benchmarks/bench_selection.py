"""One beam-search level's constrained selection on the GPU: the fused ``xgr::constrained_topk``
against the engine's plain-torch path (``constrain`` + ``rank``/``keep_all``), per level, batch
and beam width, on the engine benchmark's catalog (1M items on 250K random 3 x 256 code paths).

Each configuration is captured in a CUDA graph of ``--inner`` selections and replayed, so the
figures are device time per selection as the engine's whole-search graph pays it (no host
launch cost). Rows:

* ``fused`` / ``fused, streamed``: the kernel with its selects' keys held in registers
  (``RESIDENT_KEYS``) and streamed through blocks once per radix pass (``resident_keys=0``,
  the kernel before register residency);
* level 0 also ``fused, all W beams``: the select over every beam, of which only the first
  (the prompt) is live, as the engine ran level 0 before it scored ceil(W / C) beams;
* ``torch``: ``constrain`` + ``rank`` (``keep_all`` where every prefix fits the beam).

Prints a table and writes ``results/selection_<date>[_<tag>].json``. Needs CUDA.

    python -m benchmarks.bench_selection --out=benchmarks/results [--widths=256,1024]
"""

from __future__ import annotations

import statistics

import torch
import triton
from absl import app, flags
from tqdm import tqdm

from benchmarks import engine_analysis as ea
from benchmarks import results_file as rf
from torch_engine import beam_search as bs
from torch_engine.catalog import Catalog
from torch_engine.kernels.constrained_topk import (RESIDENT_KEYS,
                                                   launch_constrained_topk)
from xgr_common.layout import TokenLayout

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results", "folder for selection_<date>[_<tag>].json")
flags.DEFINE_string("tag", "", "suffix of the result file name")
flags.DEFINE_list("batches", ["1", "8"], "requests per selection")
flags.DEFINE_list("widths", ["256", "1024"], "beam widths")
flags.DEFINE_integer("items", 1_000_000, "catalog size")
flags.DEFINE_integer("paths", 250_000, "distinct code paths the items share")
flags.DEFINE_integer("inner", 10, "selections per captured graph")
flags.DEFINE_integer("repeats", 30, "graph replays timed per configuration")

LAYOUT = TokenLayout(codebook_size=256)


def level_inputs(catalog: Catalog, level: int, batch: int, width: int, device):
    """bf16 logits ``[B, W, C]``, float32 scores (descending, as a previous level leaves them)
    and live prefixes of ``level``; level 0: one live beam (the prompt) and W - 1 dead ones,
    with the prompt's logits broadcast over the beams as the engine passes them."""
    gen = torch.Generator(device=device).manual_seed(level * 100 + batch)
    size = LAYOUT.codebook_size
    if level == 0:
        logits = torch.randn((batch, 1, size), generator=gen, device=device)
        logits = logits.to(torch.bfloat16).expand(batch, width, size)
        scores = torch.full((batch, width), float("-inf"), device=device)
        scores[:, 0] = 0.0
        prefixes = torch.zeros((batch, width), dtype=torch.int64, device=device)
        return logits, scores, prefixes
    logits = torch.randn((batch, width, size), generator=gen, device=device).to(torch.bfloat16)
    scores = torch.randn((batch, width), generator=gen, device=device).sort(
        dim=1, descending=True).values - 2.0 * level
    prefixes = torch.randint(0, catalog.num_prefixes[level], (batch, width), generator=gen,
                             device=device)
    return logits, scores, prefixes


def per_call_us(fn) -> float:
    """Device microseconds of one ``fn()`` inside a replayed graph of ``--inner`` calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(FLAGS.inner):
            fn()
    times = ea.device_ms(graph.replay, FLAGS.repeats)
    del graph
    return statistics.median(times) * 1e3 / FLAGS.inner


def systems(catalog: Catalog, level: int, width: int, inputs, blocked):
    """(name, callable) of each way of selecting one level."""
    logits, scores, prefixes = inputs
    indptr, codes = catalog.level_indptr[level], catalog.level_codes[level]
    size = LAYOUT.codebook_size
    scored = width if level else -(-width // size)

    def fused(beams: int, resident: int):
        return lambda: launch_constrained_topk(
            logits[:, :beams], scores[:, :beams], prefixes[:, :beams], indptr, codes, width,
            blocked, resident_keys=resident)

    def torch_path():
        logp, child = bs.constrain(logits, prefixes, catalog, level)
        if catalog.num_prefixes[level + 1] <= width:
            return bs.keep_all(scores, logp, catalog, level, width)
        return bs.rank(scores, logp, child, width)
    out = [("fused", fused(scored, RESIDENT_KEYS)), ("fused, streamed", fused(scored, 0))]
    if level == 0:
        out.append(("fused, all W beams, streamed", fused(width, 0)))
    out.append(("torch", torch_path))
    return out


def main(argv: list[str]) -> None:
    del argv
    device = torch.device("cuda")
    # The catalog of bench_engine.py (same builder, seed and sizes).
    catalog = ea.random_catalog(FLAGS.items, FLAGS.paths, LAYOUT).to(device)
    rows = []
    cases = [(level, int(batch), int(width)) for level in range(LAYOUT.levels)
             for batch in FLAGS.batches for width in FLAGS.widths]
    for level, batch, width in tqdm(cases, desc="selection cases"):
        inputs = level_inputs(catalog, level, batch, width, device)
        # The engine always passes the exhausted prefixes; none here (one padding column).
        blocked = torch.full((batch, 1), catalog.num_prefixes[level + 1], dtype=torch.int64,
                             device=device)
        results, case_rows = {}, {}
        for name, fn in systems(catalog, level, width, inputs, blocked):
            results[name] = fn()
            case_rows[name] = {"level": level, "batch": batch, "width": width, "system": name,
                               "us": per_call_us(fn)}
            rows.append(case_rows[name])
        # Every fused variant must select exactly what the streamed kernel selects.
        for name in ("fused", "fused, all W beams, streamed"):
            if name in results:
                case_rows[name]["same_as_streamed"] = all(
                    torch.equal(a, b) for a, b in zip(results[name], results["fused, streamed"]))
    result = {"date": rf.utc_now(),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "triton": triton.__version__, "codebook": LAYOUT.codebook_size,
              "items": FLAGS.items, "paths": FLAGS.paths, "inner": FLAGS.inner,
              "repeats": FLAGS.repeats, "resident_keys": RESIDENT_KEYS, "rows": rows}
    path = rf.write_result(FLAGS.out, "selection", result, FLAGS.tag)
    print(f"{'level':>5} {'batch':>5} {'W':>5}  {'system':<30} {'us':>8}  same")
    for row in rows:
        print(f"{row['level']:>5} {row['batch']:>5} {row['width']:>5}  {row['system']:<30} "
              f"{row['us']:8.1f}  {row.get('same_as_streamed', '')}")
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
