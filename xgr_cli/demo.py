"""``xgr demo``: the whole pipeline on the embedded default model, on the CPU.

Builds the synthetic world (``xgr_world``), fits the ``tiny`` decoder and its profile tower on
the training users (the first time; later runs load the fit from the cache), and runs
TF feature graph -> DLPack -> Torch engine -> TF rules for the held-out users. Prints

  (a) the top items of a few users, with their semantic IDs and scores;
  (b) the time of each pipeline stage;
  (c) recall@K of the model against a popularity baseline under the same rules.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
from absl import flags
from tqdm.auto import tqdm

from bridge.pipeline import RecommendPipeline
from tf_frontend.pipeline_spec import PipelineConfig
from tf_frontend.rules import BusinessRules
from torch_engine.catalog import Catalog
from torch_engine.config import engine_config_for
from torch_engine.engine import Engine
from xgr_world import default_model as dm
from xgr_world.evaluation import Evaluation, evaluate, popularity_ranking

FLAGS = flags.FLAGS
flags.DEFINE_integer("users", 500, "Held-out users to recommend for (at most the settings' "
                     "holdout_users).")
flags.DEFINE_integer("beam_width", 128, "Beams kept per code level.")
flags.DEFINE_integer("top_k", 100, "Items returned per user.")
flags.DEFINE_integer("batch_size", 50, "Users per pipeline call.")
flags.DEFINE_integer("show_users", 3, "Users whose top items are printed.")
flags.DEFINE_integer("show_items", 8, "Items printed per shown user.")
flags.DEFINE_list("recall_at", ["10", "50"], "K values of the recall table (top_k is added).")
flags.DEFINE_list("blocked_items", [], "Item ids the business rules never show.")
flags.DEFINE_integer("max_per_category", 0, "Business rule: at most this many items per "
                     "top-level category in a list (0 = no cap).")
flags.DEFINE_bool("refit", False, "Fit the default model again even when a cached fit exists.")
flags.DEFINE_string("cache_dir", None, "Where fits are cached (default $XGR_CACHE_DIR or "
                    "~/.cache/xgr-bridge).")
flags.DEFINE_bool("quick", False, "A small world and a short fit "
                  "(xgr_world.default_model.QUICK): a quick first look, and what CI runs.")
flags.DEFINE_integer("fit_steps", None, "Training steps of a fresh fit (default: the settings').")
flags.DEFINE_integer("seed", 0, "Seed of the world and of the fit.")
flags.DEFINE_integer("prompt_version", None, "The prompt contract the model is fitted and "
                     "served in: 1, or 2 (the long-term history first, the soft vectors after "
                     "it). Default: the settings' own (2; --quick: 1).")
flags.DEFINE_string("report_json", None, "Also write recall and timings to this JSON file.")


def table(headers: tuple[str, ...], rows: list[tuple], indent: str = "  ") -> str:
    """Left-aligned text columns; floats with 3 decimals."""
    cells = [tuple(f"{c:.3f}" if isinstance(c, float) else str(c) for c in r) for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = [" ".join(str(h).ljust(w) for h, w in zip(headers, widths)),
             " ".join("-" * w for w in widths)]
    lines += [" ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(indent + line for line in lines)


def settings_from_flags() -> dm.DefaultModelSettings:
    base = dm.QUICK if FLAGS.quick else dm.DefaultModelSettings()
    steps = FLAGS.fit_steps or base.train.steps
    settings = replace(base, world=replace(base.world, seed=FLAGS.seed),
                       train=replace(base.train, steps=steps, seed=FLAGS.seed,
                                     warmup_steps=min(base.train.warmup_steps, steps // 5)))
    if FLAGS.prompt_version is None:
        return settings
    return dm.with_prompt_version(settings, FLAGS.prompt_version)


def show_users(fitted: dm.DefaultModel, result: Evaluation, users: int, items: int) -> None:
    world = fitted.world
    codes = {int(i): tuple(int(x) for x in c) for i, c in zip(world.item_ids, world.item_codes)}
    for row, user in enumerate(result.users[:users]):
        history = world.history_items[world.history_splits[user]:world.history_splits[user + 1]]
        top = Counter(codes[int(i)][0] for i in history).most_common(2)
        target = int(result.targets[row])
        print(f"\nuser {world.user_ids[user]} ({world.user_context[user].decode()}): "
              f"{len(history)} past events, mostly categories "
              f"{', '.join(f'{c} ({n})' for c, n in top)}; next item (held out) {target} "
              f"{'-'.join(map(str, codes[target]))}")
        rows = [(rank + 1, int(item), "-".join(map(str, codes[int(item)])),
                 float(result.model_scores[row, rank]), "<- held-out item" if item == target else "")
                for rank, item in enumerate(result.model_items[row, :items]) if item >= 0]
        print(table(("rank", "item", "semantic id", "log p", ""), rows))


def main(argv: list[str]) -> None:
    del argv
    settings = settings_from_flags()
    start = time.perf_counter()
    fitted = dm.fit_or_load(settings, FLAGS.cache_dir, refit=FLAGS.refit)
    seconds = time.perf_counter() - start
    fit = fitted.fit
    how = "loaded" if fitted.loaded else "fitted"
    print(f"default model ({settings.preset}): {how} in {seconds:.1f} s from {fitted.directory}\n"
          f"  fit: {len(fit.losses)} steps in {fit.seconds:.1f} s, code cross entropy "
          f"{fit.mean_loss(first=True):.3f} -> {fit.mean_loss(first=False):.3f}")
    files = fitted.export_files()
    print(f"  export it as one SavedModel: xgr export --model {files['model']} "
          f"--catalog {files['catalog']} --feature_graph {files['feature_graph']} --out DIR")

    world = fitted.world
    catalog = Catalog.from_arrays(world.item_ids, world.item_codes, settings.spec.layout)
    rules = BusinessRules(blocked_items=tuple(int(i) for i in FLAGS.blocked_items),
                          max_per_category=FLAGS.max_per_category or None)
    pipeline = RecommendPipeline.for_engine(
        fitted.feature_graph(), Engine(fitted.model, catalog, engine_config_for(settings.spec)),
        FLAGS.beam_width, FLAGS.top_k,
        PipelineConfig(top_n=FLAGS.top_k, rules=rules),
        catalog=(world.item_ids, world.item_codes), prefill_mask=settings.train.mask_mode)
    users = settings.eval_users[:FLAGS.users]
    result = evaluate(pipeline, world, users, popularity_ranking(world, settings.train_users),
                      FLAGS.batch_size,
                      progress=lambda it: tqdm(it, desc="recommend", unit="batch", leave=False))

    print(f"\n(a) top items of {min(FLAGS.show_users, len(users))} held-out users "
          f"(beam width {FLAGS.beam_width}, top {FLAGS.top_k})")
    show_users(fitted, result, FLAGS.show_users, FLAGS.show_items)

    # The first batch pays one-time costs (graph tracing, allocator growth): leave it out.
    timed = result.timings[1:] or result.timings
    names = [name for name, _ in timed[0].rows()]
    mean = {name: float(np.mean([dict(t.rows())[name] for t in timed])) for name in names}
    per_batch = len(users) / len(result.timings)
    print(f"\n(b) time per stage, mean of {len(timed)} batches of ~{per_batch:.0f} users")
    print(table(("stage", "ms / batch", "ms / user", "share"),
                [(n, mean[n], mean[n] / per_batch, f"{100 * mean[n] / mean['total']:.0f}%")
                 for n in names]))

    ks = sorted({int(k) for k in FLAGS.recall_at if int(k) <= FLAGS.top_k} | {FLAGS.top_k})
    recall = {k: result.recall(k) for k in ks}
    print(f"\n(c) recall@K on {len(users)} held-out users (next item; history excluded)")
    print(table(("K", "model", "popularity", "lift"),
                [(k, m, p, f"{m / p:.2f}x" if p else "-") for k, (m, p) in recall.items()]))
    if FLAGS.report_json:
        Path(FLAGS.report_json).write_text(json.dumps({
            "loaded": fitted.loaded, "fit_seconds": fit.seconds,
            "loss_first": fit.mean_loss(first=True), "loss_last": fit.mean_loss(first=False),
            "recall": {str(k): {"model": m, "popularity": p} for k, (m, p) in recall.items()},
            "timings_ms": mean, "users": len(users)}, indent=2))
