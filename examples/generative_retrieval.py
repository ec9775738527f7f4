"""Example (a): generative retrieval end to end, through the Python API.

    python examples/generative_retrieval.py            # the default model (fitted once)
    python examples/generative_retrieval.py --quick    # a small world and a short fit

A TF feature graph turns raw request features into a prompt of semantic-ID tokens; the Torch
engine beam-searches the next item's semantic ID, constrained to items that exist; TF applies
the business rules. Tensors cross between TF and Torch through DLPack without copies.
"""

from __future__ import annotations

# The project's packages first: importing one loads Triton (which torch's trainer imports)
# before TensorFlow, as it must be (the two bundle LLVM; see xgr_common/import_order.py).
from bridge.pipeline import RecommendPipeline  # noqa: I001
from tf_frontend.feature_graph import features_from_world
from tf_frontend.pipeline_spec import PipelineConfig
from tf_frontend.rules import BusinessRules
from torch_engine.catalog import Catalog
from torch_engine.config import engine_config_for
from torch_engine.engine import Engine
from xgr_world import default_model
from xgr_world.evaluation import popularity_lists, popularity_ranking, recall_at

import tensorflow as tf
from absl import app, flags

flags.DEFINE_bool("quick", False, "Use the small world and short fit of default_model.QUICK.")
flags.DEFINE_string("cache_dir", None, "Where the fitted model is cached.")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    del argv
    # 1. The default model: a synthetic world (catalog with 3-level semantic IDs, users with
    #    histories) and the tiny Qwen-style decoder fitted on it. Cached after the first fit.
    settings = default_model.QUICK if FLAGS.quick else default_model.DefaultModelSettings()
    fitted = default_model.fit_or_load(settings, FLAGS.cache_dir)
    world = fitted.world

    # 2. The TF side: the team's feature graph, with the sparse table and profile tower that
    #    were trained jointly with the decoder.
    feature_graph = fitted.feature_graph()

    # 3. The Torch side: the engine serves one model over one catalog. The catalog's tables
    #    constrain beam search to code paths of existing items.
    catalog = Catalog.from_arrays(world.item_ids, world.item_codes, settings.spec.layout)
    engine = Engine(fitted.model, catalog, engine_config_for(settings.spec))

    # 4. One pipeline: TF graph -> DLPack -> engine -> DLPack -> TF rules. Here the rules
    #    block two "withdrawn" items and show at most 20 items of one top-level category.
    withdrawn = tuple(int(i) for i in world.item_ids[:2])
    #    The engine keeps 64 beams and returns 50 items; the pipeline serves the model with
    #    the attention mask it was trained with.
    rules = BusinessRules(blocked_items=withdrawn, max_per_category=20)
    pipeline = RecommendPipeline.for_engine(feature_graph, engine, beam_width=64, top_k=50,
                                            config=PipelineConfig(top_n=50, rules=rules),
                                            catalog=(world.item_ids, world.item_codes),
                                            prefill_mask=settings.train.mask_mode)

    # 5. Requests are dicts of dense TF tensors (what TF Serving would receive): here the
    #    first 32 users the model never saw in training.
    users = settings.eval_users[:32]
    out = pipeline(features_from_world(world, users))
    items = out["item_ids"].numpy()          # [32, 50] int64, best first, -1 = nothing more
    scores = out["scores"].numpy()           # [32, 50] float32 log-probabilities

    print(f"user {world.user_ids[users[0]]}: top 5 items {items[0, :5].tolist()}, "
          f"log-probabilities {[round(float(s), 2) for s in scores[0, :5]]}")
    print("stage timings (ms):", {name: round(ms, 1) for name, ms in out["timings"].rows()})

    # 6. How good is it? Each user's held-out next item against a popularity ranking that,
    #    like the engine, skips the items of the user's cleaned history.
    targets = world.target_items[users]
    history = tf.RaggedTensor.from_row_splits(out["history_values"], out["history_splits"])
    popular, _ = popularity_lists(popularity_ranking(world, settings.train_users), history, 50)
    print(f"recall@50 on {len(users)} held-out users: model {recall_at(items, targets, 50):.2f}, "
          f"popularity {recall_at(popular, targets, 50):.2f}")


if __name__ == "__main__":
    app.run(main)
