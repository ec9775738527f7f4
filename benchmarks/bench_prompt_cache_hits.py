"""The prompt-KV cache's hit rate against its size, on a stated session workload.

    python -m benchmarks.bench_prompt_cache_hits --out=benchmarks/results

The workload: ``--population`` users whose requests arrive at ``--rate`` a second for
``--hours`` simulated hours, each request's user drawn by Zipf (exponent ``--zipf``) over the
population, so active users return within minutes and the tail rarely. Every user has a
frozen part of ``--frozen_tokens`` tokens (items of ``--item_tokens``); at ``--block_hours``
each user's next request finds a closed block: ``--block_tokens`` more tokens appended (the
v2 contract's long-term part growing), so appends are part of the run.

The real ``PromptCache`` plans every request (digests, lookups, pages, eviction, the host
tier); its pool is sized in pages from the KV bytes a token takes in ``--preset`` (qwen3-1.7b:
112 KB in bf16), while the simulation stores a tiny stand-in geometry, so a pool of 80 GB
costs a few megabytes here. For each device budget in ``--device_gb`` (and with a host tier
of ``--host_gb`` beside it): the share of requests that hit (by tier), the share of frozen
tokens reused, and the measured return intervals. Writes ``prompt_cache_hits_<date>.json``
and a plot ``prompt_cache_hits_<date>.png``.
"""

from __future__ import annotations

import statistics

import numpy as np
import torch
from absl import app, flags
from tqdm import tqdm

from benchmarks import results_file as rf
from torch_engine.config import preset
from torch_engine.prompt_cache import CacheScope, KVGeometry, PromptCache, PromptCacheConfig
from torch_engine.prompt_cache.cache import PromptRow
from xgr_common.layout import MaskMode

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results", "folder of the JSON and the plot")
flags.DEFINE_string("preset", "qwen3-1.7b", "model whose KV bytes a token sizes the pool")
flags.DEFINE_integer("population", 20_000, "users")
flags.DEFINE_float("zipf", 1.0, "Zipf exponent of user activity")
flags.DEFINE_float("rate", 20.0, "requests a second")
flags.DEFINE_float("hours", 1.0, "simulated hours")
flags.DEFINE_integer("frozen_tokens", 4000, "frozen tokens a user")
flags.DEFINE_integer("item_tokens", 20, "tokens an item (the safe boundaries)")
flags.DEFINE_float("block_hours", 1.0, "a block closes every this many hours")
flags.DEFINE_integer("block_tokens", 100, "tokens a closed block adds")
flags.DEFINE_list("device_gb", ["5", "10", "20", "40", "80"], "device pool budgets (GB)")
flags.DEFINE_float("host_gb", 256.0, "host tier beside each device budget (GB; 0: none)")
flags.DEFINE_integer("page_tokens", PromptCacheConfig.page_tokens, "tokens a page")
flags.DEFINE_integer("seed", 0, "workload seed")

STAND_IN = KVGeometry(1, 1, 16, torch.float16)
SCOPE = CacheScope("simulated", "layout", MaskMode.ITEM_CAUSAL)


def arrivals(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Request times (seconds) and users of the workload."""
    count = rng.poisson(FLAGS.rate * FLAGS.hours * 3600)
    times = np.sort(rng.uniform(0, FLAGS.hours * 3600, count))
    ranks = np.arange(1, FLAGS.population + 1, dtype=np.float64)
    weights = ranks ** -FLAGS.zipf
    users = rng.choice(FLAGS.population, size=count, p=weights / weights.sum())
    return times, users


def return_intervals(times: np.ndarray, users: np.ndarray) -> dict:
    """Seconds between a user's consecutive requests: median, P90, and the share of returns
    within five minutes."""
    order = np.lexsort((times, users))
    t, u = times[order], users[order]
    gaps = np.diff(t)[u[1:] == u[:-1]]
    return {"returns": int(gaps.size), "median_s": float(np.median(gaps)),
            "p90_s": float(np.percentile(gaps, 90)),
            "within_5_min": float((gaps <= 300).mean())}


def frozen_row(user: int, blocks: int) -> PromptRow:
    """User ``user``'s frozen part after ``blocks`` closed blocks (tokens unique per user)."""
    length = FLAGS.frozen_tokens + blocks * FLAGS.block_tokens
    tokens = np.arange(length, dtype=np.int64) + user * 10_000_000
    segments = np.arange(length, dtype=np.int64) // FLAGS.item_tokens
    # A block's first token starts a segment of its own, so every block end is a boundary.
    return PromptRow(tokens, segments, length, length + 1)


def simulate(times, users, device_bytes: int, host_bytes: int, token_bytes: int) -> dict:
    pt = FLAGS.page_tokens
    pages = device_bytes // (token_bytes * pt)
    scale = STAND_IN.page_bytes(pt) / (token_bytes * pt)
    cache = PromptCache(STAND_IN, PromptCacheConfig(
        device_bytes=max(int(pages * STAND_IN.page_bytes(pt)), STAND_IN.page_bytes(pt)),
        host_bytes=int(host_bytes * scale), page_tokens=pt), "cpu")
    block_seconds = FLAGS.block_hours * 3600
    tiers = {"device": 0, "host": 0, "miss": 0, "uncached": 0}
    reused = wanted = 0
    for t, user in tqdm(zip(times, users), total=len(times), leave=False, mininterval=10,
                        desc=f"{device_bytes / 1e9:.0f} GB"):
        row = frozen_row(int(user), int(t // block_seconds))
        reservation = cache.reserve(SCOPE, [row])
        plan = reservation.plans[0]
        cache.finish(reservation, keep=True)
        tiers[plan.tier] += 1
        reused += plan.cached
        wanted += row.frozen
    stats = cache.stats()
    total = len(times)
    return {"device_gb": device_bytes / 1e9, "host_gb": host_bytes / 1e9, "pages": pages,
            "users_that_fit": pages * pt // FLAGS.frozen_tokens, "requests": total,
            "hit_rate": (tiers["device"] + tiers["host"]) / total,
            "device_hit_rate": tiers["device"] / total, "host_hit_rate": tiers["host"] / total,
            "token_reuse": reused / wanted, "partial_hits": stats.partial_hits,
            "evictions": stats.evictions, "host_spills": stats.host_spills}


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for host, style in ((0.0, "o-"), (FLAGS.host_gb, "s--")):
        sel = [r for r in rows if abs(r["host_gb"] - host) < 1e-9]
        if not sel:
            continue
        label = "device pool only" if host == 0 else f"device pool + {host:.0f} GB host tier"
        ax.plot([r["device_gb"] for r in sel], [100 * r["hit_rate"] for r in sel], style,
                label=label)
    ax.set_xscale("log")
    sizes = sorted({r["device_gb"] for r in rows})
    ax.set_xticks(sizes, [f"{size:g}" for size in sizes])
    ax.minorticks_off()
    ax.set_xlabel("device pool (GB)")
    ax.set_ylabel("requests that hit (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    del argv
    cfg = preset(FLAGS.preset)
    token_bytes = KVGeometry.of_model(cfg, torch.bfloat16).token_bytes
    rng = np.random.default_rng(FLAGS.seed)
    times, users = arrivals(rng)
    intervals = return_intervals(times, users)
    rows = []
    hosts = [0.0] + ([FLAGS.host_gb] if FLAGS.host_gb > 0 else [])
    for host in hosts:
        for gb in FLAGS.device_gb:
            rows.append(simulate(times, users, int(float(gb) * 1e9), int(host * 1e9),
                                 token_bytes))
    distinct = int(np.unique(users).size)
    print(f"\n{FLAGS.preset}: {token_bytes / 1024:.0f} KB of KV a token, frozen part "
          f"{FLAGS.frozen_tokens} tokens ({token_bytes * FLAGS.frozen_tokens / 1e6:.0f} MB); "
          f"{len(times)} requests of {distinct} users (population {FLAGS.population}, Zipf "
          f"{FLAGS.zipf}); returns: median {intervals['median_s']:.0f} s, "
          f"{100 * intervals['within_5_min']:.0f}% within 5 minutes")
    print(f"{'device GB':>10}{'host GB':>9}{'users fit':>11}{'hit %':>8}{'device %':>10}"
          f"{'host %':>8}{'tokens reused %':>17}")
    for r in rows:
        print(f"{r['device_gb']:>10.0f}{r['host_gb']:>9.0f}{r['users_that_fit']:>11}"
              f"{100 * r['hit_rate']:>8.1f}{100 * r['device_hit_rate']:>10.1f}"
              f"{100 * r['host_hit_rate']:>8.1f}{100 * r['token_reuse']:>17.1f}")
    json_path = rf.result_path(FLAGS.out, "prompt_cache_hits")
    png = str(json_path.with_suffix(".png"))
    plot(rows, png, f"{FLAGS.preset}, {FLAGS.frozen_tokens} frozen tokens, "
                    f"{FLAGS.population} users, Zipf {FLAGS.zipf}, {FLAGS.rate:.0f} req/s")
    rf.write_json(json_path, {
        "date": rf.utc_now(), "preset": FLAGS.preset, "kv_bytes_per_token": token_bytes,
        "workload": {"population": FLAGS.population, "zipf": FLAGS.zipf, "rate": FLAGS.rate,
                     "hours": FLAGS.hours, "frozen_tokens": FLAGS.frozen_tokens,
                     "item_tokens": FLAGS.item_tokens, "block_hours": FLAGS.block_hours,
                     "block_tokens": FLAGS.block_tokens, "seed": FLAGS.seed,
                     "requests": int(len(times)), "distinct_users": distinct,
                     # A user's first request always misses: the hit rate's ceiling.
                     "first_request_share": distinct / max(len(times), 1),
                     "return_intervals": intervals},
        "page_tokens": FLAGS.page_tokens, "rows": rows, "plot": png})
    print(f"wrote {json_path} and {png}")


if __name__ == "__main__":
    app.run(main)
