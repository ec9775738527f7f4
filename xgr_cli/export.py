"""``xgr export --out DIR``: the whole pipeline as one TF SavedModel that embeds the engine.

Builds the synthetic world's catalog and feature graph, an engine (``--model`` Hugging Face
directory, else a randomly initialised ``--preset``), exports ``Engine.recommend`` with
``torch.export`` + AOTInductor for ``--device`` and saves feature graph -> TorchCall ->
post-processing as a SavedModel in ``--out``. Serve it with TF Serving (op linked in, see
``migration_guide/tf_serving.md``) or load it anywhere with ``import custom_ops`` +
``tf.saved_model.load``.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Folder for the SavedModel (must not exist or be empty).")
flags.DEFINE_string("model", None, "Hugging Face Qwen2/Qwen3 directory; default: --preset.")
flags.DEFINE_string("preset", "tiny", "Randomly initialised model preset when --model is unset.")
flags.DEFINE_integer("seed", 0, "Seed of the synthetic world, model and feature graph.")
flags.DEFINE_integer("num_items", 3000, "Catalog size of the synthetic world.")
flags.DEFINE_integer("num_users", 2000, "Users of the synthetic world (requests for --verify).")
flags.DEFINE_integer("history_events", 40, "History events per synthetic user.")
flags.DEFINE_integer("keep_last", 50, "History items kept per prompt: the prompt holds "
                     "4 + 4 x keep_last tokens at most (255 -> 1024).")
flags.DEFINE_integer("window_days", 90, "History events older than this are dropped.")
flags.DEFINE_integer("beam_width", 16, "Beams of the exported search.")
flags.DEFINE_integer("top_k", 12, "Items the engine returns per request (<= beam_width x "
                     "items per code path).")
flags.DEFINE_integer("top_n", 8, "Items per request after the business rules.")
flags.DEFINE_integer("max_batch", 1024, "Largest batch the exported engine accepts.")
flags.DEFINE_string("device", "cpu", "Device the engine runs on when served: cpu or cuda[:i].")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"],
                  "Engine weights and activations. float32 keeps the SavedModel's items equal to "
                  "the Python pipeline's (--verify_requests); 16-bit is faster on a GPU.")
flags.DEFINE_enum("attention_backend", "auto", ["torch", "triton", "auto"],
                  "Engine attention in the package. 'auto': the Triton kernels on CUDA when they "
                  "are registered with torch.library.triton_op (AOTInductor then compiles them "
                  "into the package), else plain torch. 'triton' insists (export refuses "
                  "Python-only custom ops: a TorchCall process has no Python).")
flags.DEFINE_string("cache_dir", str(Path.home() / ".cache" / "xgr" / "torch_call"),
                    "Compiled packages by content hash (AOTInductor takes ~40 s on a CPU); "
                    "empty: no cache.")
flags.DEFINE_integer("verify_requests", 0, "After saving, run this many synthetic requests "
                     "through the SavedModel in a fresh process (TF + custom_ops only) and "
                     "through the in-process Python pipeline; fail unless the items are equal.")
flags.DEFINE_string("report_json", None, "Write the export and verification report here.")
flags.mark_flag_as_required("out")


def resolve_attention(requested: str, device: str) -> str:
    """The attention backend to export: ``auto`` takes the Triton kernels on CUDA, in every
    dtype, when the package can embed them (registered with ``torch.library.triton_op``).
    On the H200 a float32 qwen2-0.5b engine package with them compiled in 226 s and returned
    exactly the eager engine's items, while the plain-torch attention graph (~1,000 more
    nodes for Inductor's single-threaded front end) had not finished compiling after 330 s."""
    if requested != "auto":
        return requested
    if not device.startswith("cuda"):
        return "torch"
    import torch_engine.kernels  # noqa: F401  (registers the xgr:: ops)
    from xgr_export.torch_package import is_triton_op

    embeddable = all(is_triton_op(name) for name in
                     ("xgr::decode_attention", "xgr::prefill_attention"))
    return "triton" if embeddable else "torch"


def main(argv: list[str]) -> int:
    del argv
    # The torch side first: Triton (pulled in by torch.export) aborts once TF is loaded.
    from xgr_export.engine_package import EngineExportConfig, export_engine

    import torch

    from torch_engine.catalog import Catalog
    from torch_engine.config import EngineConfig
    from torch_engine.engine import Engine
    from torch_engine.model import Model
    from xgr_common.prompt_spec import PromptSpec
    from xgr_world.synthetic import WorldConfig, make_world

    engine_config = EngineExportConfig(FLAGS.beam_width, FLAGS.top_k, FLAGS.max_batch,
                                       FLAGS.device)
    attention = resolve_attention(FLAGS.attention_backend, FLAGS.device)
    started = time.perf_counter()
    world = make_world(WorldConfig(num_items=FLAGS.num_items, num_users=FLAGS.num_users,
                                   history_events=FLAGS.history_events, seed=FLAGS.seed))
    device = torch.device(FLAGS.device)
    dtype = getattr(torch, FLAGS.dtype)
    model = (Model.from_pretrained(FLAGS.model, dtype=dtype, device=device) if FLAGS.model
             else Model.from_preset(FLAGS.preset, seed=FLAGS.seed, dtype=dtype, device=device))
    # The plain-torch selection: the fused one is a Python custom op, which AOTInductor cannot
    # put in the package.
    engine = Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes),
                    EngineConfig(attention_backend=attention, selection_backend="torch"))
    spec = PromptSpec(model_hidden=model.config.hidden_size, keep_last=FLAGS.keep_last,
                      window_seconds=FLAGS.window_days * 86400)
    report = {"preset": FLAGS.model or FLAGS.preset, "device": FLAGS.device,
              "attention_backend": attention, "dtype": str(engine.dtype).removeprefix("torch."),
              "num_items": FLAGS.num_items, "max_prompt_tokens": spec.max_prompt_tokens,
              "beam_width": FLAGS.beam_width, "top_k": FLAGS.top_k, "top_n": FLAGS.top_n,
              "torch": torch.__version__, "setup_seconds": time.perf_counter() - started}
    print(f"exporting Engine.recommend ({report['preset']}, {attention} attention, beam_width "
          f"{engine_config.beam_width}, top_k {engine_config.top_k}) for "
          f"{engine_config.device}; AOTInductor takes a while ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="xgr_export_") as tmp:
        started = time.perf_counter()
        package = export_engine(engine, spec, Path(tmp) / "engine.pt2", engine_config,
                                FLAGS.cache_dir or None)
        report["package_seconds"] = time.perf_counter() - started
        report["package_bytes"] = package.path.stat().st_size
        from xgr_export import saved_model as pipeline_export
        from tf_frontend.feature_graph import FeatureGraph

        config = pipeline_export.PipelineConfig(top_n=FLAGS.top_n)
        graph = FeatureGraph(spec, world.item_ids, world.item_codes, seed=FLAGS.seed)
        out = pipeline_export.export_pipeline(FLAGS.out, graph, package, config)
    print(f"saved {out}\n  engine contract: {package.signature.strip().replace(chr(10), '; ')}"
          f"\n  load: import custom_ops; tf.saved_model.load({str(out)!r})"
          f".signatures['serving_default'](**features)", flush=True)
    ok = True
    if FLAGS.verify_requests:
        from xgr_export.check import verify_against_python

        verdict = verify_against_python(out, graph, engine, config, world, FLAGS.verify_requests,
                                        FLAGS.beam_width, FLAGS.top_k)
        report["verify"] = verdict
        ok = verdict["ok"]
    if FLAGS.report_json:
        Path(FLAGS.report_json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1
