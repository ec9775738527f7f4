"""End-to-end ``Engine.recommend`` on one GPU: latency, stages, beam widths, throughput, anchors.

    python -m benchmarks.bench_engine --out=benchmarks/results --tag=graphs

Random bf16 weights of a preset (made on the device), 3 levels x 256 codes, a 1M-item catalog
on 250K random code paths, top_k 300. Stages (``--stages``):

* ``main``: qwen2-0.5b, prompt 1024, W 256, batch 1 and 8 (and a ragged batch 8), whole
  ``recommend`` calls (input checks, one graph replay, results; synchronised wall time) for
  each selection backend, beside the eager engine (no CUDA graphs).
* ``breakdown``: device time of the replayed search and of prefill alone, kernel time per stage
  (``engine_analysis.stage_breakdown``), floors at the measured ceilings, and the selection
  kernel against the torch path on the same logits.
* ``sweep``: W in 64..1024 at batch 1 for both selection backends; peak device memory of one
  eager search against ``capacity.estimate_request``.
* ``throughput``: batches of 1..32 requests, then the simulated queue of
  ``engine_analysis.max_rate_at_p99`` (P99 <= 100 ms).
* ``large``: qwen3-1.7b, context 1000 at batch 1 and 8, context 5000 at batch 1; breakdowns
  at batch 1, context 1000 and 5000.
* ``kernels``: where a search's device time goes: its kernels grouped by stage and name
  (``engine_analysis.kernel_table``) for each of ``--kernel_cases`` (default qwen2-0.5b batch
  1 and the large preset at context 1000, batch 1); and each matrix product of a layer timed
  alone at the decode and prefill row counts (``engine_analysis.gemm_table``) against its
  bound.
* ``selection_ab``: the torch and the fused selection, one engine each, replayed in
  alternating rounds (graph device time and whole ``recommend`` calls) at qwen2-0.5b batch 1
  and 8 and the large preset at context 1000, batch 1.
* ``host``: where a whole ``recommend`` call spends its time beyond the graph's device time
  at batch 1 (qwen2-0.5b and the large preset at context 1000): host time of each step of a
  replayed call in ``recommend``'s order (argument checks, the graph lookup, the replay:
  input copies, the extent fill, the launch and the result clones; the verdict read), the
  device span from the call's start to its last result; beside them the first call of the
  process (kernel compilation, rules, memory check, warm-up and capture), the first call of
  another length bucket (what a new bucket costs a warm process), the eager path's input
  preparation and rules launch, and launch costs of single small ops.
* ``floor``: a search's matrix products alone (``engine_analysis.products_chain``) in one
  graph beside the whole search's graph and its target, power and SM clock sampled during
  each (``power_sampler``): what is left beyond them for attention and the rest.
* ``hf``: ``transformers`` ``generate(num_beams=W, prefix_allowed_tokens_fn=...)`` on the same
  weights and catalog: qwen2-0.5b batch 1, and qwen3-1.7b batch 1 context 1000 (one call).

Writes ``engine_<date>[_<tag>].json`` and prints a table per stage.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from absl import app, flags
from tqdm import tqdm

from benchmarks import engine_analysis as ea
from benchmarks.engine_analysis import sync, wall_ms as timed
from benchmarks import results_file as rf
from benchmarks.engine_anchor import hf_anchor
from benchmarks.engine_tables import print_tables
from benchmarks.power_sampler import PowerSampler
from torch_engine import beam_search as bs
from torch_engine import search as search_fns
from torch_engine.capacity import estimate_request
from torch_engine.catalog import Catalog
from torch_engine.checks import check_arguments
from torch_engine.config import EngineConfig, preset
from torch_engine.engine import Engine
from torch_engine.model import Model
from torch_engine.runner import rules_for
from xgr_common.layout import TokenLayout

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results", "folder for engine_<date>[_<tag>].json")
flags.DEFINE_string("tag", "", "suffix of the result file name")
flags.DEFINE_list("stages", ["main", "breakdown", "sweep", "throughput", "large", "hf"],
                  "stages to run")
flags.DEFINE_list("selections", ["torch", "triton"], "selection backends to compare")
flags.DEFINE_integer("repeats", 20, "timed calls per configuration")
flags.DEFINE_integer("items", 1_000_000, "catalog size")
flags.DEFINE_integer("paths", 250_000, "distinct code paths the items share")
flags.DEFINE_string("small", "qwen2-0.5b", "preset of main/breakdown/sweep/throughput/hf")
flags.DEFINE_string("large_preset", "qwen3-1.7b", "preset of the large stage")
flags.DEFINE_integer("prompt", 1024, "prompt tokens of the small-model stages")
flags.DEFINE_list("widths", ["64", "128", "256", "512", "1024"], "beam widths of the sweep")
flags.DEFINE_list("throughput_batches", ["1", "2", "4", "8", "16", "32"], "batch sizes")
flags.DEFINE_string("device", "cuda", "torch device (cpu: a smoke run of the script)")
flags.DEFINE_list("kernel_cases", ["small:1:1024", "large:1:1000"],
                  "kernels stage: model:batch:prompt per case, model 'small' (--small) or "
                  "'large' (--large_preset)")

LAYOUT = TokenLayout()
BEAM, TOP_K = 256, 300


def summary(name: str, batch: int, times: list[float], **extra) -> dict:
    med, p99 = statistics.median(times), float(np.percentile(times, 99))
    return {"system": name, "batch": batch, "median_ms": med, "p99_ms": p99,
            "median_ms_per_request": med / batch, "calls": len(times), **extra}


def random_model(name: str, device: torch.device) -> Model:
    """A preset with normal(0, 0.02) bf16 weights drawn on the device (seconds, not minutes,
    for billions of weights)."""
    with torch.device(device):
        model = Model(preset(name))
    model = model.to(torch.bfloat16).eval()
    model.init_weights(0)
    return model


def make_catalog() -> Catalog:
    return ea.random_catalog(FLAGS.items, FLAGS.paths, LAYOUT)


def prompts(batch: int, length: int, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(LAYOUT.code_base, LAYOUT.code_end, (batch, length), generator=gen)
    return tokens.to(device), torch.full((batch,), length, device=device)


def engine_for(model, catalog, selection: str | None = None, **config) -> Engine:
    """An engine with ``EngineConfig``'s defaults unless overridden."""
    if selection is not None:
        config["selection_backend"] = selection
    return Engine(model, catalog, EngineConfig(**config))


def time_recommend(engine, tokens, lengths, width, name, **extra) -> dict:
    def call():
        return engine.recommend(tokens, lengths, beam_width=width, top_k=TOP_K)
    items, _ = call()
    with PowerSampler() as power:
        times = timed(call, FLAGS.repeats)
    row = summary(name, tokens.shape[0], times, **extra, power=power.summary())
    row["items_returned_min"] = int((items >= 0).sum(dim=1).min())
    return row


MAIN_VARIANTS = {
    "engine (defaults: whole-search graph, fused selection on CUDA)": {},
    "engine, torch selection": {"selection": "torch"},
    "engine, layer kernels off": {"layer_kernels": False},
    "engine eager (no graphs)": {"cuda_graphs": False},
}


def stage_main(model, catalog, device) -> list[dict]:
    rows = []
    for batch in (1, 8):
        tokens, lengths = prompts(batch, FLAGS.prompt, device)
        for name, config in MAIN_VARIANTS.items():
            engine = engine_for(model, catalog, **config)
            rows.append(time_recommend(engine, tokens, lengths, BEAM, name))
            del engine
        if batch == 8:
            ragged = torch.randint(FLAGS.prompt // 2, FLAGS.prompt + 1, (batch,),
                                   generator=torch.Generator().manual_seed(1)).to(device)
            rows.append(time_recommend(engine_for(model, catalog), tokens, ragged, BEAM,
                                       f"engine, ragged lengths {FLAGS.prompt // 2}.."
                                       f"{FLAGS.prompt}"))
    return rows


def ceilings(device) -> dict[str, float]:
    """bf16 matrix rate (8192^3, random data) and device copy bandwidth (read + write)."""
    if device.type != "cuda":
        return {"matmul_tflops": float("nan"), "copy_tbps": float("nan")}
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    mm = statistics.median(ea.device_ms(lambda: a @ b, 10))
    src = torch.randn(1 << 30, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    cp = statistics.median(ea.device_ms(lambda: dst.copy_(src), 10))
    return {"matmul_tflops": 2 * 8192 ** 3 / mm / 1e9,
            "copy_tbps": 2 * src.numel() * src.element_size() / cp / 1e9}


def selection_alone(catalog, batch: int, device) -> dict[str, float]:
    """Level-1 selection on the same random logits: fused kernel vs constrain + rank."""
    gen = torch.Generator(device=device).manual_seed(2)
    logits = torch.randn(batch, BEAM, LAYOUT.codebook_size, device=device, generator=gen)
    scores = torch.randn(batch, BEAM, device=device, generator=gen)
    prefixes = torch.randint(0, catalog.num_prefixes[1], (batch, BEAM), device=device,
                             generator=gen)
    fused = lambda: bs.select_fused(logits, scores, prefixes, catalog, 1, BEAM, None)  # noqa

    def torch_path():
        logp, child = bs.constrain(logits, prefixes, catalog, 1)
        return bs.rank(scores, logp, child, BEAM)
    return {"triton_ms": statistics.median(ea.device_ms(fused)),
            "torch_ms": statistics.median(ea.device_ms(torch_path))}


def checked_batch(engine, tokens, lengths, width: int = BEAM):
    """The checked arguments for ``engine.runner.run`` (which pads them to its bucket when it
    replays a whole-search graph) and the sanitised batch an eager search runs on (the eager
    path's input preparation); the verdict is not read."""
    args = check_arguments(engine.limits, tokens, lengths, None, width, TOP_K, None, None)
    batch, _ = search_fns.sanitise(args.token_ids, args.lengths, None, None, None,
                                   engine.model.config.vocab_size,
                                   rules_for(args.token_ids.device))
    return args, batch.to(engine.device)


def eager_search(engine, batch, width: int = BEAM):
    """The search functions on a sanitised batch, eagerly, with ``engine``'s tables."""
    return search_fns.search(engine.model, engine.catalog, batch, width, TOP_K,
                             engine.options, engine.runner.exclusions)


def breakdown_row(model, catalog, device, ceil, batch: int, prompt: int,
                  selection: str | None = None) -> dict:
    """One shape: device time of the replayed search and of prefill alone, host time of the
    input preparation (``checked_batch``: the argument checks and the value rules) and of the
    replay call (``runner.run``), kernel time per stage, floors."""
    tokens, lengths = prompts(batch, prompt, device)
    graphed = engine_for(model, catalog, selection)
    eager = engine_for(model, catalog, selection, cuda_graphs=False, static_shapes=True)

    args, checked = checked_batch(graphed, tokens, lengths)
    with torch.no_grad():
        search = ea.device_ms(lambda: graphed.runner.run(args, BEAM, TOP_K))
        replay_wall = timed(lambda: graphed.runner.run(args, BEAM, TOP_K), FLAGS.repeats)
        check_wall = timed(lambda: checked_batch(graphed, tokens, lengths), FLAGS.repeats)
        graph = ea.capture(lambda: search_fns.prefill(eager.model, eager.catalog, checked,
                                                      eager.options, eager.runner.exclusions))
        prefill = statistics.median(ea.device_ms(graph.replay))
    del graph
    stages = ea.stage_breakdown(eager, checked, BEAM, TOP_K)
    total = statistics.median(search)
    other = total - sum(stages[k] for k in ("prefill", "decode attention", "selection",
                                            "item expansion"))
    floor = ea.floors(model.config, batch, prompt, BEAM, LAYOUT.levels,
                      ceil["matmul_tflops"], ceil["copy_tbps"])
    return {"system": f"breakdown {model.config.architecture} prompt {prompt}, "
                      f"{graphed.options.selection} selection", "batch": batch,
            "search_graph_ms": total, "prefill_graph_ms": prefill,
            "replay_wall_ms": statistics.median(replay_wall),
            "prepare_inputs_wall_ms": statistics.median(check_wall),
            "kernel_ms": stages, "other_ms": other, "floor_ms": floor,
            "roofline_fraction": floor["total_ms"] / total,
            "prefill_roofline_fraction": floor["prefill_ms"] / prefill}


def stage_breakdown(model, catalog, device, ceil) -> list[dict]:
    rows = []
    for batch in (1, 8):
        for selection in ("torch", "triton"):
            rows.append(breakdown_row(model, catalog, device, ceil, batch, FLAGS.prompt,
                                      selection))
        engine = engine_for(model, catalog)
        rows.append({"system": "selection alone (level 1)", "batch": batch,
                     **selection_alone(engine.catalog, batch, device)})
    return rows


def stage_sweep(model, catalog, device) -> list[dict]:
    rows = []
    tokens, lengths = prompts(1, FLAGS.prompt, device)
    for width in tqdm([int(w) for w in FLAGS.widths], desc="beam widths"):
        for selection in FLAGS.selections:
            engine = engine_for(model, catalog, selection)
            eager = engine_for(model, catalog, selection, cuda_graphs=False, static_shapes=True)
            _, checked = checked_batch(eager, tokens, lengths, width)
            estimate = estimate_request(model.config, 2, 1, FLAGS.prompt, FLAGS.prompt, width,
                                        TOP_K, LAYOUT.levels, LAYOUT.codebook_size, 1,
                                        eager.options.attention, eager.options.selection)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                eager_search(eager, checked, width)
            peak = torch.cuda.max_memory_allocated() - base
            row = time_recommend(engine, tokens, lengths, width,
                                 f"W {width}, {selection} selection", beam=width,
                                 measured_peak_bytes=peak, estimate_bytes=estimate.total)
            row["estimate_covers_peak"] = estimate.total >= peak
            rows.append(row)
            del engine
            torch.cuda.empty_cache()
    return rows


def stage_throughput(model, catalog, device) -> list[dict]:
    engine = engine_for(model, catalog)
    rows, service = [], {}
    for batch in tqdm([int(b) for b in FLAGS.throughput_batches], desc="batch sizes"):
        tokens, lengths = prompts(batch, FLAGS.prompt, device, seed=batch)
        times = timed(lambda: engine.recommend(tokens, lengths, beam_width=BEAM, top_k=TOP_K),
                      FLAGS.repeats)
        rows.append(summary("throughput batch", batch, times,
                            requests_per_s=batch * 1e3 / statistics.median(times)))
        service[batch] = times
    best = ea.max_rate_at_p99(service, 100.0)
    rows.append({"system": "simulated queue, P99 <= 100 ms", **best})
    return rows


def stage_selection_ab(small, large, catalog, device) -> list[dict]:
    """The two selection backends side by side: one engine each per shape, their
    whole-search graphs replayed in alternating rounds (device time), then whole
    ``recommend`` calls alternating (wall time), so drift between machines and over the run
    falls on both alike."""
    rows = []
    for model, batch, prompt in ((small, 1, FLAGS.prompt), (small, 8, FLAGS.prompt),
                                 (large, 1, 1000)):
        tokens, lengths = prompts(batch, prompt, device)
        engines = {name: engine_for(model, catalog, name) for name in ("torch", "triton")}
        for engine in engines.values():
            engine.recommend(tokens, lengths, beam_width=BEAM, top_k=TOP_K)   # capture
        args, _ = checked_batch(engines["torch"], tokens, lengths)
        graph = {name: [] for name in engines}
        wall = {name: [] for name in engines}
        with torch.no_grad():
            for _ in range(6):
                for name, engine in engines.items():
                    graph[name] += ea.device_ms(
                        lambda e=engine: e.runner.run(args, BEAM, TOP_K), 10)
                    wall[name] += timed(lambda e=engine: e.recommend(
                        tokens, lengths, beam_width=BEAM, top_k=TOP_K), 5)
        row = {"system": f"selection A/B, {model.config.architecture} prompt {prompt}",
               "batch": batch, "rounds": 6}
        for name in engines:
            row[f"{name}_graph_ms"] = statistics.median(graph[name])
            row[f"{name}_recommend_ms"] = statistics.median(wall[name])
        rows.append(row)
        del engines
    return rows


def _host_us(fn, repeats: int = 200) -> float:
    """Median host microseconds of ``fn`` (synchronised between calls, not inside them)."""
    out = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - start) / 1e3)
    sync()
    return statistics.median(out)


def _first_call_ms(engine, tokens, lengths) -> float:
    """Wall milliseconds of one synchronised ``recommend`` call (the first of its shape)."""
    sync()
    began = time.perf_counter()
    engine.recommend(tokens, lengths, beam_width=BEAM, top_k=TOP_K)
    sync()
    return (time.perf_counter() - began) * 1e3


def host_steps(engine, tokens, lengths, repeats: int) -> dict[str, float]:
    """Median host microseconds of each step of a replayed ``recommend`` (same order and
    calls), the whole call's wall time and the device span from its first launch to its last
    result."""
    steps: dict[str, list[float]] = {}
    runner = engine.runner
    names = ("event record", "check_arguments", "replay (lookup, copies, fill, launch, clones)",
             "event record 2", "verdict read")
    for _ in range(repeats + 2):
        sync()
        marks = [time.perf_counter_ns()]
        first = torch.cuda.Event(enable_timing=True)
        last = torch.cuda.Event(enable_timing=True)
        first.record()
        marks.append(time.perf_counter_ns())
        args = check_arguments(engine.limits, tokens, lengths, None, BEAM, TOP_K, None, None)
        marks.append(time.perf_counter_ns())
        with torch.no_grad():
            assert runner.holds(runner.shape(args), BEAM, TOP_K)
            held = runner.run(args, BEAM, TOP_K)
        marks.append(time.perf_counter_ns())
        last.record()
        marks.append(time.perf_counter_ns())
        held[2].raise_if_invalid()
        marks.append(time.perf_counter_ns())
        assert held[0].shape[0] >= tokens.shape[0]
        for name, a, b in zip(names, marks, marks[1:]):
            steps.setdefault(name, []).append((b - a) / 1e3)
        steps.setdefault("wall", []).append((marks[-1] - marks[0]) / 1e3)
        steps.setdefault("device span", []).append(first.elapsed_time(last) * 1e3)
    return {f"{name}_us": statistics.median(values[2:]) for name, values in steps.items()}


def stage_host(small, large, catalog, device) -> list[dict]:
    """Host time of each step of a batch-1 ``recommend`` and of single launches."""
    if device.type != "cuda":
        return [{"system": "host steps", "absent": "needs CUDA graphs"}]
    rows = []
    tiny = torch.zeros(1, device=device)
    row = {"system": "launch costs (host us)",
           "torch_add_us": _host_us(lambda: tiny.add_(1)),
           "torch_full_us": _host_us(lambda: torch.full((1, 1), -1, device=device)),
           "torch_empty_us": _host_us(lambda: torch.empty((1, 1024), device=device)),
           "sync_us": _host_us(torch.cuda.synchronize)}
    rows.append(row)
    for model, prompt in ((small, FLAGS.prompt), (large, 1000)):
        tokens, lengths = prompts(1, prompt, device)
        engine = engine_for(model, catalog)
        first_call_ms = _first_call_ms(engine, tokens, lengths)    # compiles and captures
        # Another length bucket in the same process: its capture alone, kernels compiled.
        other = prompt - 300
        new_bucket_ms = _first_call_ms(engine, *prompts(1, other, device))
        args, _ = checked_batch(engine, tokens, lengths)
        exclude = torch.full((1, 1), -1, dtype=torch.int64, device=device)
        rules = rules_for(device)
        cfg = model.config
        with torch.no_grad():
            graph_ms = statistics.median(ea.device_ms(lambda: engine.runner.run(args, BEAM,
                                                                                TOP_K)))
            search_us = _host_us(lambda: engine.runner.run(args, BEAM, TOP_K))
        row = {"system": f"host steps {cfg.architecture} prompt {prompt}", "batch": 1,
               "graph_ms": graph_ms, "first_call_ms": first_call_ms,
               "new_bucket_ms": new_bucket_ms, "new_bucket_prompt": other,
               "eager_rules_launch_us": _host_us(lambda: rules(tokens, lengths, None, exclude,
                                                               cfg.vocab_size, 0, True)),
               "eager_prepare_inputs_us": _host_us(lambda: checked_batch(
                   engine, tokens, lengths)),
               "search_host_us": search_us,
               **host_steps(engine, tokens, lengths, FLAGS.repeats * 3)}
        row["wall_minus_graph_us"] = row["wall_us"] - graph_ms * 1e3
        rows.append(row)
    return rows


def stage_large(model, catalog, device, ceil) -> list[dict]:
    rows = []
    for batch, context in ((1, 1000), (8, 1000), (1, 5000)):
        tokens, lengths = prompts(batch, context, device)
        rows.append(time_recommend(engine_for(model, catalog), tokens, lengths, BEAM,
                                   f"{FLAGS.large_preset} context {context}", context=context))
    for context in (1000, 5000):
        try:
            rows.append(breakdown_row(model, catalog, device, ceil, 1, context))
        except Exception as err:  # the latencies above stay
            rows.append({"system": f"breakdown large, context {context}",
                         "failed": f"{type(err).__name__}: {err}"[:300]})
    return rows


# The floor stage's cases: (model, batch, prompt tokens, latency target in ms).
FLOOR_CASES = (("small", 1, 1024, 5.0), ("large", 1, 1000, 10.0), ("large", 8, 1000, 60.0),
               ("large", 1, 5000, 35.0))


def stage_floor(model_of, catalog, device, ceil) -> list[dict]:
    rows = []
    for which, batch, prompt, target in FLOOR_CASES:
        cfg = model_of(which).config
        graphed = engine_for(model_of(which), catalog)
        args, _ = checked_batch(graphed, *prompts(batch, prompt, device))
        with torch.no_grad():
            graphed.runner.run(args, BEAM, TOP_K)          # the capture, outside the samples
            with PowerSampler() as search_power:
                search = statistics.median(ea.device_ms(
                    lambda: graphed.runner.run(args, BEAM, TOP_K), FLAGS.repeats))
        bucket = graphed.runner.shape(args)
        graphed = None                      # its graphs and buffers go before the products'
        torch.cuda.empty_cache()
        tokens = bucket.rows * (bucket.soft + bucket.width)      # prefill rows, padding included
        products, chain_flops, products_power = ea.time_products_chain(
            cfg, bucket.rows, tokens, BEAM, LAYOUT.levels, FLAGS.repeats, device)
        rows.append({"system": f"floor {cfg.architecture} b{batch} prompt {prompt}",
                     "batch": batch, "prompt": prompt, "search_graph_ms": search,
                     "products_graph_ms": products,
                     "products_tflops": chain_flops / products / 1e9,
                     "products_share": products / search, "beyond_products_ms": search - products,
                     "target_ms": target, "target_left_after_products_ms": target - products,
                     "bucket_tokens": tokens, "ceiling_tflops": ceil["matmul_tflops"],
                     "search_power": search_power.summary(),
                     "products_power": products_power})
        print(rows[-1], flush=True)
    return rows


def stage_kernels(model_of, catalog, device, ceil) -> list[dict]:
    rows = []
    tabled = set()
    for case in FLAGS.kernel_cases:
        which, batch, prompt = case.split(":")
        batch, prompt = int(batch), int(prompt)
        model = model_of(which)
        name = model.config.architecture
        tokens, lengths = prompts(batch, prompt, device)
        eager = engine_for(model, catalog, cuda_graphs=False, static_shapes=True)
        _, checked = checked_batch(eager, tokens, lengths)
        for row in ea.kernel_table(eager, checked, BEAM, TOP_K):
            rows.append({"system": f"kernel {name} b{batch} prompt {prompt}", "batch": batch,
                         **row})
        del eager
        if which not in tabled:
            tabled.add(which)
            for row in ea.gemm_table(model.config, [BEAM, 8 * BEAM, prompt],
                                     ceil["matmul_tflops"], ceil["copy_tbps"], device):
                rows.append({"system": f"product {name}", **row})
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str]) -> None:
    del argv
    device = torch.device(FLAGS.device)
    start = time.perf_counter()
    catalog = make_catalog()
    result = {"date": rf.utc_now(),
              "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": "bfloat16", "prompt": FLAGS.prompt,
              "beam": BEAM, "top_k": TOP_K, "levels": LAYOUT.levels,
              "codebook": LAYOUT.codebook_size, "items": FLAGS.items, "paths": FLAGS.paths,
              "catalog_build_s": time.perf_counter() - start, "stages": {}}
    small = random_model(FLAGS.small, device)
    # The large preset's weights, made once for every stage that needs them.
    models = {"small": small}

    def model_of(which: str) -> Model:
        if which not in models:
            models[which] = random_model(FLAGS.large_preset, device)
        return models[which]
    ceil = ceilings(device)
    result["ceilings"] = ceil
    stages = result["stages"]
    runners = {"main": lambda: stage_main(small, catalog, device),
               "breakdown": lambda: stage_breakdown(small, catalog, device, ceil),
               "sweep": lambda: stage_sweep(small, catalog, device),
               "throughput": lambda: stage_throughput(small, catalog, device),
               "kernels": lambda: stage_kernels(model_of, catalog, device, ceil),
               "floor": lambda: stage_floor(model_of, catalog, device, ceil),
               "large": lambda: stage_large(model_of("large"), catalog, device, ceil),
               "host": lambda: stage_host(small, model_of("large"), catalog, device),
               "selection_ab": lambda: stage_selection_ab(small, model_of("large"), catalog,
                                                          device)}
    for name in FLAGS.stages:
        began = time.perf_counter()
        try:
            if name == "hf":
                stages[name] = hf_anchor(small, catalog, FLAGS.prompt, BEAM, [1], 3, device)
                if "large" in models:       # made by an earlier stage
                    stages[name] += hf_anchor(models["large"], catalog, 1000, BEAM, [1], 1,
                                              device, warmups=0)
            else:
                stages[name] = runners[name]()
        except Exception as err:  # one failed stage must not lose the others' numbers
            stages[name] = [{"system": name, "failed": f"{type(err).__name__}: {err}"[:500]}]
        print(f"stage {name}: {time.perf_counter() - began:.1f} s", flush=True)
        write(result)
    print_tables(result)


def write(result: dict) -> None:
    rf.write_result(FLAGS.out, "engine", result, FLAGS.tag, indent=2, default=float)


if __name__ == "__main__":
    app.run(main)
