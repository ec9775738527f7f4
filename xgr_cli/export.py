"""``xgr export --out DIR``: the whole pipeline as one TF SavedModel that embeds the engine.

Turns the flags into an ``xgr_export.ExportConfig`` and runs ``xgr_export.export_saved_model``
(the synthetic world's catalog and feature graph, an engine from ``--model`` or ``--preset``,
``torch.export`` + AOTInductor for ``--device``, feature graph -> TorchCall -> post-processing
saved in ``--out``, and with ``--verify_requests`` the fresh-process check); prints what it
built and exits 1 when the check finds different items.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import flags

from xgr_export.config import ATTENTION_BACKENDS, DTYPES, EngineExportConfig, ExportConfig
from xgr_world.synthetic import WorldConfig

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
flags.DEFINE_enum("dtype", "float32", list(DTYPES),
                  "Engine weights and activations. float32 keeps the SavedModel's items equal to "
                  "the Python pipeline's (--verify_requests); 16-bit is faster on a GPU.")
flags.DEFINE_enum("attention_backend", "auto", list(ATTENTION_BACKENDS),
                  "Engine attention in the package. 'auto': the Triton kernels on CUDA when they "
                  "are registered with torch.library.triton_op (AOTInductor then compiles them "
                  "into the package), else plain torch. 'triton' insists (export refuses "
                  "Python-only custom ops: a TorchCall process has no Python).")
flags.DEFINE_string("cache_dir", str(Path.home() / ".cache" / "xgr" / "torch_call"),
                    "Compiled packages by content hash (AOTInductor is slow even for a small "
                    "model); empty: no cache.")
flags.DEFINE_integer("verify_requests", 0, "After saving, run this many synthetic requests "
                     "through the SavedModel in a fresh process (TF + custom_ops only) and "
                     "through the in-process Python pipeline; fail unless the items are equal.")
flags.DEFINE_string("report_json", None, "Write the export and verification report here.")
flags.mark_flag_as_required("out")


def config_from_flags() -> ExportConfig:
    return ExportConfig(
        out=FLAGS.out, model=FLAGS.model, preset=FLAGS.preset, seed=FLAGS.seed,
        world=WorldConfig(num_items=FLAGS.num_items, num_users=FLAGS.num_users,
                          history_events=FLAGS.history_events, seed=FLAGS.seed),
        keep_last=FLAGS.keep_last, window_days=FLAGS.window_days,
        engine=EngineExportConfig(FLAGS.beam_width, FLAGS.top_k, FLAGS.max_batch, FLAGS.device),
        top_n=FLAGS.top_n, dtype=FLAGS.dtype, attention_backend=FLAGS.attention_backend,
        cache_dir=FLAGS.cache_dir or None, verify_requests=FLAGS.verify_requests)


def main(argv: list[str]) -> int:
    del argv
    config = config_from_flags()
    # Imported here: `xgr export --help` and a bad flag need neither torch nor TensorFlow.
    from xgr_common.serving_names import SERVING_SIGNATURE
    from xgr_export.export import export_saved_model

    report = export_saved_model(config, progress=lambda line: print(line, flush=True))
    print(f"saved {report.saved_model}\n  engine contract: "
          f"{report.engine_signature.strip().replace(chr(10), '; ')}\n  load: import "
          f"custom_ops; tf.saved_model.load({str(report.saved_model)!r})"
          f".signatures[{SERVING_SIGNATURE!r}](**features)", flush=True)
    if report.check is not None:
        print(report.check.summary(), flush=True)
    if FLAGS.report_json:
        Path(FLAGS.report_json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 0 if report.ok else 1
