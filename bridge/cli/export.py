"""``xgr export --out DIR``: the whole pipeline as one TF SavedModel that embeds the engine.

Builds the synthetic world's catalog and feature graph, an engine (``--model`` Hugging Face
directory, else a randomly initialised ``--preset``), exports ``Engine.recommend`` with
``torch.export`` + AOTInductor for ``--device`` and saves feature graph -> TorchCall ->
post-processing as a SavedModel in ``--out``. Serve it with TF Serving (op linked in, see
``migration_guide/tf_serving.md``) or load it anywhere with ``import custom_ops`` +
``tf.saved_model.load``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Folder for the SavedModel (must not exist or be empty).")
flags.DEFINE_string("model", None, "Hugging Face Qwen2/Qwen3 directory; default: --preset.")
flags.DEFINE_string("preset", "tiny", "Randomly initialised model preset when --model is unset.")
flags.DEFINE_integer("seed", 0, "Seed of the synthetic world, model and feature graph.")
flags.DEFINE_integer("num_items", 3000, "Catalog size of the synthetic world.")
flags.DEFINE_integer("beam_width", 16, "Beams of the exported search.")
flags.DEFINE_integer("top_k", 12, "Items the engine returns per request (<= beam_width x "
                     "items per code path).")
flags.DEFINE_integer("top_n", 8, "Items per request after the business rule.")
flags.DEFINE_integer("max_batch", 1024, "Largest batch the exported engine accepts.")
flags.DEFINE_string("device", "cpu", "Device the engine runs on when served: cpu or cuda[:i].")
flags.DEFINE_enum("attention_backend", "torch", ["torch", "triton", "auto"],
                  "Engine attention in the package. 'triton' embeds the Triton kernels only when "
                  "they are registered with torch.library.triton_op (export refuses Python-only "
                  "custom ops: a TorchCall process has no Python).")
flags.DEFINE_string("cache_dir", str(Path.home() / ".cache" / "xgr" / "torch_call"),
                    "Compiled packages by content hash (AOTInductor takes ~40 s on a CPU).")
flags.mark_flag_as_required("out")


def main(argv: list[str]) -> int:
    del argv
    # The torch side first: Triton (pulled in by torch.export) aborts once TF is loaded.
    from tf_frontend.engine_package import EngineExportConfig, export_engine

    import torch

    from torch_engine.catalog import Catalog
    from torch_engine.config import EngineConfig
    from torch_engine.engine import Engine
    from torch_engine.model import Model
    from torch_engine.prompt_spec import PromptSpec
    from torch_engine.synthetic import WorldConfig, make_world

    from tf_frontend.export import PipelineConfig, export_pipeline
    from tf_frontend.feature_graph import FeatureGraph

    engine_config = EngineExportConfig(FLAGS.beam_width, FLAGS.top_k, FLAGS.max_batch,
                                       FLAGS.device)
    pipeline_config = PipelineConfig(top_n=FLAGS.top_n)
    world = make_world(WorldConfig(num_items=FLAGS.num_items, seed=FLAGS.seed))
    device = torch.device(FLAGS.device)
    model = (Model.from_pretrained(FLAGS.model, device=device) if FLAGS.model
             else Model.from_preset(FLAGS.preset, seed=FLAGS.seed, device=device))
    engine = Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes),
                    EngineConfig(attention_backend=FLAGS.attention_backend))
    spec = PromptSpec(model_hidden=model.config.hidden_size)
    print(f"exporting Engine.recommend (beam_width {engine_config.beam_width}, top_k "
          f"{engine_config.top_k}) for {engine_config.device}; AOTInductor takes a while ...")
    with tempfile.TemporaryDirectory(prefix="xgr_export_") as tmp:
        package = export_engine(engine, spec, Path(tmp) / "engine.pt2", engine_config,
                                FLAGS.cache_dir)
        graph = FeatureGraph(spec, world.item_ids, world.item_codes, seed=FLAGS.seed)
        out = export_pipeline(FLAGS.out, graph, package, pipeline_config)
    print(f"saved {out}\n  engine contract: {package.signature.strip().replace(chr(10), '; ')}"
          f"\n  load: import custom_ops; tf.saved_model.load({str(out)!r})"
          f".signatures['serving_default'](**features)")
    return 0
