"""What ``bench_engine.py`` derives from its timings: floors, the per-stage breakdown of one
search, and the queue that turns per-batch latencies into requests per second at a P99 bound.

* ``floors``: the least time one search can take at the measured ceilings (bf16 matrix rate,
  copy bandwidth): each pass (prefill, each decode step) is bounded by its matrix work or by
  reading the weights and KV once, whichever is larger.
* ``stage_breakdown``: device time of each stage of one eager search (profiler kernel times
  grouped by the engine function that launched them) beside the replayed graph's total.
* ``products_chain`` / ``time_products_chain``: only the matrix products of one search (same
  shapes, order and residual adds; ``search_passes``), replayed in a CUDA graph with the
  board's power and SM clock sampled: what a search's products cost at sustained power.
* ``max_rate_at_p99``: a single server batching whatever has arrived (up to the largest
  measured batch, rounded up to the engine's power-of-two batch bucket), service times drawn
  from the measured latencies of that bucket, Poisson arrivals; the highest rate whose P99
  latency (wait + service) stays under the bound.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch.autograd import DeviceType

from benchmarks.power_sampler import PowerSampler
from torch_engine import attention as attn
from torch_engine import beam_search as bs
from torch_engine import search as search_fns
from torch_engine.catalog import Catalog
from torch_engine.config import ModelConfig
from xgr_common.layout import TokenLayout


def sync() -> None:
    """Waits for the device's queued work (nothing to wait for on the CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn: Callable[[], object], repeats: int,
            before: Callable[[], object] | None = None) -> list[float]:
    """Wall milliseconds of ``repeats`` calls of ``fn``, each synchronised with the device,
    after two warm-up calls; ``before`` runs (untimed, synchronised) ahead of each."""
    for _ in range(2):
        if before:
            before()
        fn()
    sync()
    out = []
    for _ in range(repeats):
        if before:
            before()
            sync()
        start = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def random_catalog_arrays(items: int, paths: int,
                          layout: TokenLayout) -> tuple[np.ndarray, np.ndarray]:
    """The ids and codes of ``random_catalog``."""
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(items * 4), size=items, replace=False)
    codes = rng.integers(0, layout.codebook_size, (paths, layout.levels))
    return ids, codes[rng.integers(0, paths, items)]


def random_catalog(items: int, paths: int, layout: TokenLayout) -> Catalog:
    """The engine benchmarks' catalog: ``items`` random ids sharing ``paths`` random code
    paths (seed 0), so every benchmark times the same tables."""
    return Catalog.from_arrays(*random_catalog_arrays(items, paths, layout), layout)


def profiled(call: Callable[[], object], calls: int, with_stack: bool = False):
    """The profiler's record of ``calls`` calls after one warm-up (CPU activities, and the
    GPU's when there is one; ``with_stack``: Python's tracer too) and their wall
    microseconds a call."""
    from torch.profiler import ProfilerActivity, profile

    call()
    sync()
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, with_stack=with_stack) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        wall = (time.perf_counter() - start) * 1e6 / calls
    return prof, wall


def kernel_times(call: Callable[[], object], calls: int = 3) -> dict[str, float]:
    """Microseconds per call of each kernel over ``calls`` profiled calls, slowest first:
    device time of the GPU's kernels, or on the CPU the operators' own time."""
    cuda = torch.cuda.is_available()
    prof, _ = profiled(call, calls)
    out = {}
    for event in prof.key_averages():
        if cuda:
            us = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
            if event.key.startswith(("aten::", "cuda", "Memcpy")):
                continue    # the host-side names of the kernels listed under their own
        else:
            us = event.self_cpu_time_total
        if us:
            out[event.key] = out.get(event.key, 0.0) + us / calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def layer_params(cfg: ModelConfig) -> int:
    """Weights of the decoder layers (embedding and LM head excluded)."""
    hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    attn_w = h * (hq + 2 * hkv) * d + hq * d * h
    return cfg.num_layers * (attn_w + 3 * h * cfg.intermediate_size)


def floors(cfg: ModelConfig, batch: int, prompt: int, width: int, levels: int,
           matmul_tflops: float, copy_tbps: float, element: int = 2) -> dict[str, float]:
    """Floor milliseconds of prefill, the decode steps and the whole search."""
    params = layer_params(cfg)
    hq, d, layers = cfg.num_heads, cfg.head_dim, cfg.num_layers
    kv_row = 2 * layers * cfg.num_kv_heads * d * element        # K and V bytes per token
    # Prefill: 2 flops per weight per token, causal attention QK^T + PV (half the square).
    pre_flops = 2 * params * batch * prompt + 2 * layers * hq * d * batch * prompt * prompt
    pre_bytes = params * element + batch * prompt * kv_row
    # Each decode step: every beam through the weights, attending the prompt once per beam.
    step_flops = 2 * params * batch * width + 4 * layers * hq * d * batch * width * prompt
    step_bytes = params * element + batch * prompt * kv_row
    ms = lambda flops, nbytes: max(flops / (matmul_tflops * 1e12),  # noqa: E731
                                   nbytes / (copy_tbps * 1e12)) * 1e3
    prefill = ms(pre_flops, pre_bytes)
    decode = (levels - 1) * ms(step_flops, step_bytes)
    return {"prefill_ms": prefill, "decode_ms": decode, "total_ms": prefill + decode}


STAGES = {
    "prefill": [(search_fns, "prefill")],
    "prefill attention": [(attn, "prefill_attention")],
    "decode attention": [(attn, "decode_attention")],
    "selection": [(bs, "select_fused"), (bs, "constrain"), (bs, "rank"), (bs, "keep_all"),
                  (bs, "drop_exhausted"), (bs, "exhausted_prefixes"),
                  (bs, "blocked_prefixes")],
    "item expansion": [(bs, "expand_items"), (bs, "expand_items_of")],
}


def _scoped(name: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(f"stage: {name}"):
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def stage_scopes():
    """Wrap the search's stage functions in profiler ranges (module attributes the search looks
    up at call time), restoring them afterwards."""
    saved = []
    try:
        for name, pairs in STAGES.items():
            for owner, attr in pairs:
                saved.append((owner, attr, owner.__dict__.get(attr)))
                setattr(owner, attr, _scoped(name, getattr(owner, attr)))
        yield
    finally:
        for owner, attr, old in reversed(saved):
            if old is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


def device_ms(fn: Callable[[], object], repeats: int = 20) -> list[float]:
    """Device milliseconds of ``fn`` per call (CUDA events, after one warm-up call)."""
    fn()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def profiled_search(engine, batch, width: int, top_k: int) -> list:
    """Profiler events of one eager search (``engine`` must not replay graphs) after two
    warm-up searches, the stage functions wrapped in ``stage: <name>`` ranges; CUDA kernels
    too when the engine is on CUDA."""
    cuda = engine.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    def run():
        return search_fns.search(engine.model, engine.catalog, batch, width, top_k,
                                 engine.options, engine.runner.exclusions)
    with torch.no_grad():
        for _ in range(2):
            run()
        sync()
        with stage_scopes(), torch.profiler.profile(activities=activities) as prof:
            run()
            sync()
    return prof.events()


def stage_breakdown(engine, batch, width: int, top_k: int) -> dict[str, float]:
    """Kernel milliseconds per stage of one eager search (``engine`` must not replay graphs),
    and the sum of all its kernels (on the CPU: operator times, for a smoke run)."""
    return _group_by_stage(profiled_search(engine, batch, width, top_k),
                           engine.device.type == "cuda")


def _group_by_stage(events, cuda: bool) -> dict[str, float]:
    """Milliseconds per stage. On CUDA: device events (kernels, copies, fills) inside each
    stage's device-side annotation span (eager launches run one at a time on one stream, so
    containment is attribution); the spans themselves are not counted. On the CPU: the
    operator time of each stage's range."""
    out = {name: 0.0 for name in STAGES}
    if not cuda:
        for event in events:
            if event.name.startswith("stage: "):
                out[event.name[len("stage: "):]] += event.cpu_time_total / 1e3
        out["all kernels"] = sum(e.self_cpu_time_total for e in events) / 1e3
        return out
    device = [e for e in events if e.device_type != DeviceType.CPU]
    spans = [e for e in device if e.is_user_annotation and e.name.startswith("stage: ")]
    work = [e for e in device if not e.is_user_annotation]
    if not spans:   # no device-side annotations: kernels attached to the launching ranges
        for event in events:
            if event.device_type == DeviceType.CPU and event.name.startswith("stage: "):
                out[event.name[len("stage: "):]] += _launched_us(event) / 1e3
    for span in spans:
        lo, hi = span.time_range.start, span.time_range.end
        inside = sum(e.time_range.elapsed_us() for e in work
                     if lo <= e.time_range.start and e.time_range.end <= hi)
        out[span.name[len("stage: "):]] += inside / 1e3
    out["all kernels"] = sum(e.time_range.elapsed_us() for e in work) / 1e3
    out["annotation spans found"] = float(len(spans))
    return out


def _launched_us(event) -> float:
    """Device microseconds of the kernels launched under a CPU event (its subtree)."""
    own = sum(k.duration for k in event.kernels if not k.name.startswith("stage: "))
    return own + sum(_launched_us(child) for child in event.cpu_children)


def max_rate_at_p99(service_ms: dict[int, list[float]], bound_ms: float, requests: int = 20000,
                    seed: int = 0) -> dict[str, float]:
    """Highest Poisson arrival rate (requests/s) whose simulated P99 latency is <= bound_ms.

    service_ms: measured latencies of whole batches by (power-of-two) batch size.
    """
    sizes = sorted(service_ms)
    largest = sizes[-1]

    def simulate(rate: float) -> tuple[float, float]:
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(1e3 / rate, requests))
        latency = np.empty(requests)
        clock, i, batches = 0.0, 0, []
        while i < requests:
            clock = max(clock, arrivals[i])
            waiting = int(np.searchsorted(arrivals, clock, side="right")) - i
            take = min(max(waiting, 1), largest)
            bucket = next(s for s in sizes if s >= take)
            clock += float(rng.choice(service_ms[bucket]))
            latency[i:i + take] = clock - arrivals[i:i + take]
            batches.append(take)
            i += take
        return float(np.percentile(latency, 99)), float(np.mean(batches))

    low, high = 0.0, 2.0 * largest * 1e3 / min(np.median(service_ms[largest]), bound_ms)
    best = {"rate_per_s": 0.0, "p99_ms": float("nan"), "mean_batch": float("nan")}
    for _ in range(30):
        mid = (low + high) / 2
        p99, mean_batch = simulate(mid)
        if p99 <= bound_ms:
            low, best = mid, {"rate_per_s": mid, "p99_ms": p99, "mean_batch": mean_batch}
        else:
            high = mid
    return best


def kernel_table(engine, batch, width: int, top_k: int, top: int = 30) -> list[dict]:
    """The kernels of one eager search (``engine`` must not replay graphs), grouped by stage
    (the ranges of ``stage_breakdown``; "decode other" for the rest) and kernel name: calls,
    total and mean microseconds, largest totals first. Names are cut to 90 characters."""
    device = [e for e in profiled_search(engine, batch, width, top_k)
              if e.device_type != DeviceType.CPU]
    spans = [(e.time_range.start, e.time_range.end, e.name[len("stage: "):]) for e in device
             if e.is_user_annotation and e.name.startswith("stage: ")]
    # Innermost span wins (prefill attention sits inside prefill).
    spans.sort(key=lambda s: s[1] - s[0])
    groups: dict[tuple[str, str], list[float]] = {}
    for event in device:
        if event.is_user_annotation:
            continue
        lo, hi = event.time_range.start, event.time_range.end
        stage = next((name for start, end, name in spans if start <= lo and hi <= end),
                     "decode other")
        groups.setdefault((stage, event.name[:90]), []).append(event.time_range.elapsed_us())
    rows = [{"stage": stage, "kernel": name, "calls": len(times), "total_us": sum(times),
             "mean_us": sum(times) / len(times)} for (stage, name), times in groups.items()]
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:top]


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) features of each matrix product of one layer as the engine runs it (fused
    q/k/v and gate/up), and of one level's logits (a 256-code slice of the LM head)."""
    hq, hkv, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    return {"qkv": ((hq + 2 * hkv) * d, h), "o_proj": (h, hq * d),
            "gate_up": (2 * cfg.intermediate_size, h), "down": (h, cfg.intermediate_size),
            "level logits": (256, h)}


def gemm_table(cfg: ModelConfig, rows_list: list[int], matmul_tflops: float,
               copy_tbps: float, device) -> list[dict]:
    """Each of ``linear_shapes`` at each row count: device microseconds of ``F.linear`` (bf16,
    50 products replayed in one CUDA graph, median of 10 replays), and of the in-place
    ``addmm_`` that folds a residual add into the product (beta = 1); the achieved TFLOP/s and
    the fraction of the bound (matrix work at the ceiling, or reading the weights once)."""
    out = []
    repeat = 50
    for rows in rows_list:
        for name, (n, k) in linear_shapes(cfg).items():
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
            acc = torch.randn(rows, n, device=device, dtype=torch.bfloat16)
            timings = {}
            for variant, fn in (("linear", lambda: torch.nn.functional.linear(x, w)),
                                ("addmm_", lambda: acc.addmm_(x, w.t()))):
                graph = capture(fn, repeat)
                timings[variant] = float(np.median(device_ms(graph.replay, 10))) * 1e3 / repeat
                del graph
            flops = 2 * rows * n * k
            bound_us = max(flops / (matmul_tflops * 1e12),
                           (n * k + rows * (n + k)) * 2 / (copy_tbps * 1e12)) * 1e6
            out.append({"rows": rows, "product": name, "out_features": n, "in_features": k,
                        "linear_us": timings["linear"], "addmm_us": timings["addmm_"],
                        "tflops": flops / timings["linear"] / 1e6, "bound_us": bound_us,
                        "fraction_of_bound": bound_us / timings["linear"]})
    return out


def search_passes(cfg: ModelConfig, batch: int, prompt_rows: int, width: int,
                  levels: int) -> list[tuple[int, int]]:
    """(rows of the q/k/v product, rows of the other three products) of each layer of each pass
    of one search, in the engine's order: prefill over the bucket's ``prompt_rows`` (its last
    layer's output, MLP and down products on each request's last row only), then
    ``levels - 1`` decode steps over ``batch * width`` beam rows."""
    layers = cfg.num_layers
    prefill = [(prompt_rows, prompt_rows)] * (layers - 1) + [(prompt_rows, batch)]
    return prefill + [(batch * width, batch * width)] * (layers * (levels - 1))


@dataclass(frozen=True)
class ProductsChain:
    """``run`` issues the products; ``flops`` counts their matrix work; ``stream`` is the
    residual rows the output and down products add into."""

    run: Callable[[], None]
    flops: float
    stream: torch.Tensor


def products_chain(cfg: ModelConfig, passes: list[tuple[int, int]], logits_rows: list[int],
                   device, after_qkv: Callable[[int], None] | None = None,
                   after_gate_up: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
                   | None = None) -> ProductsChain:
    """Only the matrix products of ``passes`` (``search_passes``) and of
    the level logits (``logits_rows`` rows each), as the engine issues them: q/k/v and gate/up
    as plain products, the output and down products adding into the residual stream
    (``addmm_``, beta = 1). Every layer has its own random bf16 weights, as a model does, so no
    weight stays in L2 between layers.

    Hooks put other work where the engine has it: ``after_qkv(i)`` runs after pass i's q/k/v
    product (attention); ``after_gate_up(i, gate_up, x)`` after its gate/up product, returning
    the activation the down product reads (SwiGLU)."""
    shapes = linear_shapes(cfg)
    layers = cfg.num_layers
    gen = torch.Generator(device=device).manual_seed(0)

    def weight(name: str) -> torch.Tensor:
        n, k = shapes[name]
        return torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * k ** -0.5
    weights = [{name: weight(name) for name in ("qkv", "o_proj", "gate_up", "down")}
               for _ in range(layers)]
    head = weight("level logits")
    rows = max(max(r for pair in passes for r in pair), max(logits_rows))
    h, inter = cfg.hidden_size, cfg.intermediate_size
    x = torch.randn(rows, h, device=device, dtype=torch.bfloat16, generator=gen)
    attended = torch.randn(rows, cfg.num_heads * cfg.head_dim, device=device,
                           dtype=torch.bfloat16, generator=gen)
    act = torch.randn(rows, inter, device=device, dtype=torch.bfloat16, generator=gen)
    qkv_out = torch.empty(rows, shapes["qkv"][0], device=device, dtype=torch.bfloat16)
    gate_up_out = torch.empty(rows, 2 * inter, device=device, dtype=torch.bfloat16)
    logits_out = torch.empty(rows, shapes["level logits"][0], device=device,
                             dtype=torch.bfloat16)
    flops = 0.0
    for i, (qkv_rows, rest) in enumerate(passes):
        w = weights[i % layers]
        flops += 2 * qkv_rows * w["qkv"].numel() + 2 * rest * sum(
            w[n].numel() for n in ("o_proj", "gate_up", "down"))
    flops += sum(2 * r * head.numel() for r in logits_rows)

    def run() -> None:
        for i, (qkv_rows, rest) in enumerate(passes):
            w = weights[i % layers]
            torch.mm(x[:qkv_rows], w["qkv"].t(), out=qkv_out[:qkv_rows])
            if after_qkv is not None:
                after_qkv(i)
            x[:rest].addmm_(attended[:rest], w["o_proj"].t())
            torch.mm(x[:rest], w["gate_up"].t(), out=gate_up_out[:rest])
            hidden = act[:rest]
            if after_gate_up is not None:
                hidden = after_gate_up(i, gate_up_out[:rest], x[:rest])
            x[:rest].addmm_(hidden, w["down"].t())
        for r in logits_rows:
            torch.mm(x[:r], head.t(), out=logits_out[:r])
    return ProductsChain(run=run, flops=flops, stream=x)


def time_products_chain(cfg: ModelConfig, batch: int, prompt_rows: int, width: int,
                        levels: int, repeats: int, device, **hooks) -> tuple[float, float, dict]:
    """Median device ms of one search's ``products_chain`` (``hooks``: its ``after_qkv`` and
    ``after_gate_up``) replayed in a CUDA graph, its flops, and the board's power and SM clock
    while it ran (``PowerSampler.summary``)."""
    chain = products_chain(cfg, search_passes(cfg, batch, prompt_rows, width, levels),
                           [batch] + [batch * width] * (levels - 1), device, **hooks)
    graph = capture(chain.run)
    with PowerSampler() as power:
        ms = float(np.median(device_ms(graph.replay, repeats)))
    del graph
    torch.cuda.empty_cache()
    return ms, chain.flops, power.summary()


def capture(fn: Callable[[], object], repeat: int = 1) -> torch.cuda.CUDAGraph:
    """``repeat`` calls of ``fn`` captured in one CUDA graph, after two warm-up calls on a side
    stream (kernel compilation and allocator state stay out of the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            fn()
    return graph
