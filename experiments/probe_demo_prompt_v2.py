"""Probe: the demo's quick fit in prompt versions 1 and 2, and version 2 under both masks.

    python -m experiments.probe_demo_prompt_v2 OUT_JSON [STEPS] [quick|default]

Fits ``xgr_world.default_model.QUICK`` (the world CI fits; ``default``: the demo's own
settings, 5,000 users) three ways, each cached under
``$XGR_CACHE_DIR``: version 1, causal mask, every code a target (the demo's rule); version 2
likewise; version 2 under the item-causal mask, the next item's codes the only targets (the
all-codes objective would leak there). Each is evaluated on the held-out users through the
in-process pipeline with the mask it was fitted with: recall@10 and @50 against popularity,
and the fit's seconds. Prints a table; writes the rows as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

from bridge.pipeline import RecommendPipeline
from tf_frontend.pipeline_spec import PipelineConfig
from torch_engine.catalog import Catalog
from torch_engine.config import engine_config_for
from torch_engine.engine import Engine
from xgr_common.layout import MaskMode
from xgr_world import default_model as dm
from xgr_world.evaluation import evaluate, popularity_ranking

VARIANTS = (("v1 causal all_codes", 1, MaskMode.CAUSAL, "all_codes"),
            ("v2 causal all_codes", 2, MaskMode.CAUSAL, "all_codes"),
            ("v2 item_causal next_item", 2, MaskMode.ITEM_CAUSAL, "next_item"))


def main(out: str, steps: int | None, world: str = "quick") -> None:
    rows = []
    for name, version, mask, objective in VARIANTS:
        base = dm.QUICK if world == "quick" else dm.DefaultModelSettings()
        train = replace(base.train, mask_mode=mask, objective=objective,
                        steps=steps or base.train.steps)
        settings = dm.with_prompt_version(replace(base, train=train), version)
        started = time.perf_counter()
        fitted = dm.fit_or_load(settings, progress=False)
        seconds = time.perf_counter() - started
        world = fitted.world
        catalog = Catalog.from_arrays(world.item_ids, world.item_codes, settings.spec.layout)
        pipeline = RecommendPipeline.for_engine(
            fitted.feature_graph(), Engine(fitted.model, catalog,
                                           engine_config_for(settings.spec)),
            64, 50, PipelineConfig(top_n=50), catalog=(world.item_ids, world.item_codes),
            prefill_mask=mask)
        result = evaluate(pipeline, world, settings.eval_users,
                          popularity_ranking(world, settings.train_users), 100)
        (r10, p10), (r50, p50) = result.recall(10), result.recall(50)
        row = {"variant": name, "fit_seconds": round(fitted.fit.seconds, 1),
               "loaded": fitted.loaded, "wall_seconds": round(seconds, 1),
               "recall@10": round(r10, 4), "recall@50": round(r50, 4),
               "popularity@10": round(p10, 4), "popularity@50": round(p50, 4),
               "loss_last": round(fitted.fit.mean_loss(first=False), 3)}
        rows.append(row)
        print(row, flush=True)
    print(f"{'variant':28} {'fit s':>6} {'R@10':>6} {'R@50':>6} {'pop@10':>7} {'pop@50':>7}")
    for r in rows:
        print(f"{r['variant']:28} {r['fit_seconds']:6.1f} {r['recall@10']:6.3f} "
              f"{r['recall@50']:6.3f} {r['popularity@10']:7.3f} {r['popularity@50']:7.3f}")
    with open(out, "w") as handle:
        json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "0" else None,
         sys.argv[3] if len(sys.argv) > 3 else "quick")
