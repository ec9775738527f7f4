"""End-to-end ``Engine.recommend`` on one GPU beside Hugging Face beam search on the same weights.

    python3 benchmarks/bench_engine.py --out=benchmarks/results

qwen2-0.5b shape with random bf16 weights, prompts of 1024 tokens, beam 256, 3 levels x 256
codes, a 1M-item catalog with random code paths, batch 1 and 8. For each attention backend
(plain torch, Triton kernels when importable) it times whole ``recommend`` calls (input checks,
prefill, decode, item expansion; synchronised; CUDA graphs unless the backend name ends in
"-eager"), a ragged batch, and eager prefill alone; the anchor is
``transformers`` ``generate(num_beams=256, max_new_tokens=3, prefix_allowed_tokens_fn=...)``
constrained to the same catalog (reported absent when transformers is missing).
Median and P99 per call and per request; writes ``engine_<date>.json`` and prints a table.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from absl import app, flags
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch_engine.catalog import Catalog  # noqa: E402
from torch_engine.config import EngineConfig  # noqa: E402
from torch_engine.engine import Engine  # noqa: E402
from torch_engine.inputs import check_inputs  # noqa: E402
from torch_engine.layout import TokenLayout  # noqa: E402
from torch_engine.model import Model  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results", "folder for engine_<date>.json")
flags.DEFINE_string("preset", "qwen2-0.5b", "model preset (random weights)")
flags.DEFINE_list("batches", ["1", "8"], "batch sizes")
flags.DEFINE_integer("prompt", 1024, "prompt tokens per request")
flags.DEFINE_integer("beam", 256, "beam width")
flags.DEFINE_integer("top_k", 300, "items returned per request")
flags.DEFINE_integer("items", 1_000_000, "catalog size")
flags.DEFINE_integer("paths", 250_000, "distinct code paths the items share (about 4 per path)")
flags.DEFINE_integer("repeats", 20, "timed engine calls per configuration")
flags.DEFINE_integer("hf_repeats", 3, "timed transformers calls per batch size")
flags.DEFINE_list("backends", ["torch", "triton", "torch-eager"],
                  "attention backends to time; '-eager' turns the decode CUDA graphs off")
flags.DEFINE_bool("hf", True, "time the transformers anchor")
flags.DEFINE_string("tag", "", "suffix of the result file name (engine_<date>_<tag>.json)")
flags.DEFINE_bool("ragged", True, "also time the largest batch with lengths drawn from "
                  "[prompt/2, prompt] (static packing computes the padding slots)")
flags.DEFINE_string("device", "cuda", "torch device (cpu only for a smoke run of the script)")

LAYOUT = TokenLayout()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int) -> list[float]:
    """Wall milliseconds of ``repeats`` synchronised calls after two warm-up calls."""
    for _ in range(2):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def summary(name: str, batch: int, times: list[float]) -> dict:
    med, p99 = statistics.median(times), percentile(times, 99)
    return {"system": name, "batch": batch, "median_ms": med, "p99_ms": p99,
            "median_ms_per_request": med / batch, "p99_ms_per_request": p99 / batch,
            "calls": len(times)}


def allowed_tokens_fn(catalog: Catalog, prompt: int):
    """``prefix_allowed_tokens_fn`` for transformers: walks the catalog's CSR on the host."""
    indptr = [t.cpu().numpy() for t in catalog.level_indptr]
    codes = [t.cpu().numpy() for t in catalog.level_codes]

    def allowed(_batch_id, input_ids):
        generated = input_ids[prompt:].tolist()
        prefix = 0
        for level, token in enumerate(generated):
            code = token - LAYOUT.level_range(level)[0]
            lo, hi = indptr[level][prefix], indptr[level][prefix + 1]
            prefix = lo + int(np.searchsorted(codes[level][lo:hi], code))
        level = len(generated)
        if level >= LAYOUT.levels:
            return [LAYOUT.eos_id]
        lo, hi = indptr[level][prefix], indptr[level][prefix + 1]
        return (codes[level][lo:hi] + LAYOUT.level_range(level)[0]).tolist()

    return allowed


def hf_anchor(model: Model, catalog: Catalog, prompts: dict[int, torch.Tensor],
              device: torch.device) -> list[dict]:
    """transformers beam search on the same weights, or a note that it is absent."""
    try:
        import transformers
    except ImportError as err:
        return [{"system": "transformers", "absent": str(err)}]
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    hf = hf.to(device).eval()
    rows = []
    fn = allowed_tokens_fn(catalog, FLAGS.prompt)
    for batch, tokens in prompts.items():
        def call():
            with torch.no_grad():
                hf.generate(tokens, attention_mask=torch.ones_like(tokens),
                            num_beams=FLAGS.beam, max_new_tokens=LAYOUT.levels,
                            min_new_tokens=LAYOUT.levels, do_sample=False,
                            prefix_allowed_tokens_fn=fn, pad_token_id=LAYOUT.pad_id,
                            eos_token_id=LAYOUT.eos_id)
        try:
            rows.append(summary(f"transformers {transformers.__version__}", batch,
                                timed(call, FLAGS.hf_repeats)))
        except torch.cuda.OutOfMemoryError as err:
            rows.append({"system": "transformers", "batch": batch, "absent": f"OOM: {err}"[:200]})
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str]) -> None:
    del argv
    torch.manual_seed(0)
    device = torch.device(FLAGS.device)
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(FLAGS.items * 4), size=FLAGS.items, replace=False)
    paths = rng.integers(0, LAYOUT.codebook_size, (FLAGS.paths, LAYOUT.levels))
    codes = paths[rng.integers(0, FLAGS.paths, FLAGS.items)]
    start = time.perf_counter()
    catalog = Catalog.from_arrays(ids, codes, LAYOUT)
    build_s = time.perf_counter() - start
    model = Model.from_preset(FLAGS.preset, seed=0, dtype=torch.bfloat16, device=device)
    prompts = {int(b): torch.randint(LAYOUT.code_base, LAYOUT.code_end, (int(b), FLAGS.prompt),
                                     device=device) for b in FLAGS.batches}
    rows = []
    for backend in FLAGS.backends:
        try:
            engine = Engine(model, catalog, EngineConfig(
                attention_backend=backend.removesuffix("-eager"),
                cuda_graphs=not backend.endswith("-eager")))
        except ValueError as err:
            rows.append({"system": f"engine ({backend})", "absent": str(err)})
            continue
        cases = [(b, t, torch.full((b,), FLAGS.prompt, device=device), "")
                 for b, t in prompts.items()]
        if FLAGS.ragged:
            batch, tokens = max(prompts.items())
            lengths = torch.randint(FLAGS.prompt // 2, FLAGS.prompt + 1, (batch,), device=device)
            cases.append((batch, tokens, lengths, " ragged"))
        for batch, tokens, lengths, label in tqdm(cases, desc=f"engine {backend}"):
            def call():
                return engine.recommend(tokens, lengths, beam_width=FLAGS.beam, top_k=FLAGS.top_k)
            items, _ = call()
            row = summary(f"engine ({backend}){label}", batch, timed(call, FLAGS.repeats))
            row["items_returned_min"] = int((items >= 0).sum(dim=1).min())
            rows.append(row)
            checked = check_inputs(engine, tokens, lengths, None, FLAGS.beam, FLAGS.top_k,
                                   None, None)
            with torch.no_grad():
                rows.append(summary(f"engine ({backend}){label} eager prefill only", batch,
                                    timed(lambda: engine.prefill(checked), FLAGS.repeats)))
    if FLAGS.hf:
        rows += hf_anchor(model, catalog, prompts, device)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "preset": FLAGS.preset, "dtype": "bfloat16", "prompt": FLAGS.prompt,
        "beam": FLAGS.beam, "top_k": FLAGS.top_k, "levels": LAYOUT.levels,
        "codebook": LAYOUT.codebook_size, "items": FLAGS.items, "paths": FLAGS.paths,
        "catalog_build_s": build_s, "rows": rows,
    }
    os.makedirs(FLAGS.out, exist_ok=True)
    suffix = f"_{FLAGS.tag}" if FLAGS.tag else ""
    path = os.path.join(FLAGS.out, f"engine_{datetime.date.today().isoformat()}{suffix}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\n{'system':42s} {'batch':>5s} {'median ms':>10s} {'p99 ms':>9s} {'ms/request':>11s}")
    for row in rows:
        if "absent" in row:
            print(f"{row['system']:42s} {row.get('batch', ''):>5} absent: {row['absent'][:60]}")
        else:
            print(f"{row['system']:42s} {row['batch']:5d} {row['median_ms']:10.2f} "
                  f"{row['p99_ms']:9.2f} {row['median_ms_per_request']:11.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
