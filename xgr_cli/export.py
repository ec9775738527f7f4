"""``xgr export --out DIR``: the whole pipeline as one TF SavedModel that embeds the engine.

A team's export::

    xgr export --model CHECKPOINT --catalog catalog.parquet \
        --feature_graph feature_graph.safetensors --device cuda --out DIR

(CHECKPOINT: a Qwen2/Qwen3 folder with its ``xgr_model.json``; the feature graph: the trained
reference graph's weights or a SavedModel folder.) Without ``--model``/``--catalog`` it
exports the synthetic world with a ``--preset``. Turns the flags into an
``xgr_export.ExportConfig`` and runs ``xgr_export.export_saved_model``; prints what it built
and exits 1 when ``--verify_requests`` finds different items.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import flags

from xgr_common.errors import ConfigError
from xgr_export.config import ATTENTION_BACKENDS, DTYPES, LAYER_KERNELS, MASKS, \
    EngineExportConfig, ExportConfig
from xgr_world.synthetic import WorldConfig

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Folder for the SavedModel (must not exist or be empty).")
flags.DEFINE_string("model", None, "Hugging Face Qwen2/Qwen3 folder with its xgr_model.json "
                    "(written by training and by `xgr extend_vocab`); needs --catalog and "
                    "--feature_graph. Unset: the synthetic world with --preset.")
flags.DEFINE_string("catalog", None, "The catalog file (.parquet or .npz: item_id and the "
                    "semantic-ID code columns, see docs/catalog_file.md).")
flags.DEFINE_string("feature_graph", None, "The trained feature graph: the reference graph's "
                    "weights (.safetensors, as training writes them) or a SavedModel folder "
                    "of any TF/Keras graph emitting the prompt contract.")
flags.DEFINE_enum("mask", None, list(MASKS), "Prefill mask; default: the model card's "
                  "(item_causal for a preset). Given, it must equal the card's.")
flags.DEFINE_string("preset", "tiny", "Randomly initialised model preset when --model is unset.")
flags.DEFINE_integer("seed", 0, "Seed of the synthetic world, model and feature graph.")
flags.DEFINE_integer("num_items", 3000, "Catalog size of the synthetic world.")
flags.DEFINE_integer("num_users", 2000, "Users of the synthetic world (requests for --verify).")
flags.DEFINE_integer("history_events", 40, "History events per synthetic user.")
flags.DEFINE_integer("keep_last", None, "Preset export: history items kept per prompt (the "
                     "prompt holds 4 + 4 x keep_last tokens at most; default 50). A model's "
                     "comes from its xgr_model.json.")
flags.DEFINE_integer("window_days", None, "Preset export: history events older than this are "
                     "dropped (default 90). A model's comes from its xgr_model.json.")
flags.DEFINE_integer("beam_width", 16, "Beams of the exported search.")
flags.DEFINE_integer("top_k", 12, "Items the engine returns per request (<= beam_width x "
                     "items per code path).")
flags.DEFINE_integer("top_n", 8, "Items per request after the business rules.")
flags.DEFINE_integer("max_batch", 1024, "Largest batch the exported engine accepts.")
flags.DEFINE_integer("max_request_exclusions", 256,
                     "Most items one request may exclude through the serving_with_controls "
                     "signature (applied on the device beside its history); 0 leaves that "
                     "signature out.", lower_bound=0)
flags.DEFINE_string("device", "cpu", "Device the engine runs on when served: cpu or cuda[:i].")
flags.DEFINE_enum("dtype", None, list(DTYPES),
                  "Engine weights and activations; default bfloat16 on CUDA, float32 on the "
                  "CPU. --verify_requests compares with the Python engine in the same dtype.")
flags.DEFINE_enum("attention_backend", "auto", list(ATTENTION_BACKENDS),
                  "Engine attention in the package. 'auto': the Triton kernels on CUDA when they "
                  "are registered with torch.library.triton_op (AOTInductor then compiles them "
                  "into the package), else plain torch. 'triton' insists (export refuses "
                  "Python-only custom ops: a TorchCall process has no Python).")
flags.DEFINE_list("beam_widths", [], "Beam widths a request may ask for through "
                  "serving_with_controls' beam_width (comma-separated; must include "
                  "--beam_width, the default): one package serves them all, one width per model "
                  "call. Empty: --beam_width only.")
flags.DEFINE_enum("layer_kernels", "off", list(LAYER_KERNELS),
                  "'on': the fused layer kernels in the package (what Engine.recommend runs on "
                  "CUDA: concatenated projections with the norms folded in, q/k/v split with "
                  "rotary, SwiGLU, final norm; CUDA only). 'off' (default): Inductor fuses the "
                  "plain layer, which served faster on the H200 (docs/notes/gpu_serving.md).")
flags.DEFINE_string("cache_dir", str(Path.home() / ".cache" / "xgr" / "torch_call"),
                    "Compiled packages by content hash (AOTInductor is slow even for a small "
                    "model); empty: no cache.")
flags.DEFINE_integer("cuda_graphs", 8, "CUDA graphs the server keeps for a CUDA engine, one "
                     "per shape bucket (4 times as many with --prompt_cache); past them a new "
                     "shape runs eagerly until seen often. More for traffic of many history "
                     "lengths and batch sizes (watch xgr_engine_graph_budget).")
flags.DEFINE_integer("verify_requests", 0, "After saving, run this many requests (the "
                     "synthetic users, or requests drawn from --catalog) through the SavedModel "
                     "in a fresh process (TF + custom_ops only) and through the in-process "
                     "Python pipeline in the same dtype; fail unless the items agree (16-bit: "
                     "exactly, except inside score ties).")
flags.DEFINE_float("catalog_headroom", 0.0, "0: the catalog is compiled into the engine "
                   "package. >= 1: its tables are padded to that many times the catalog's "
                   "sizes (items, prefixes, fanout, items per path) and read from a tables file, "
                   "so a later catalog within that capacity is exported with --engine_from, "
                   "without a new compile.")
flags.DEFINE_string("engine_from", None, "A SavedModel exported with --catalog_headroom: reuse "
                    "its engine package (no compile) for this export's --catalog (and feature "
                    "graph). The engine flags (beam widths, top_k, device, dtype, backends) "
                    "are that export's; the new catalog must fit its capacity and keep the "
                    "codes of the items both catalogs hold.")
flags.DEFINE_bool("prompt_cache", False, "Keep a prompt-KV cache of the version 2 prompt's "
                  "frozen long-term part in the engine's runtime (TorchCall): a returning "
                  "user's long-term history is prefilled once. The signature then takes each "
                  "request's user_key (string; empty: not cached); `xgr serve "
                  "--prompt_cache_gb` sizes the cache. Version 2 models only.")
flags.DEFINE_string("report_json", None, "Write the export and verification report here.")
flags.mark_flag_as_required("out")


def _widths(values: list[str]) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(v) for v in values}))
    except ValueError as err:
        raise ConfigError(f"--beam_widths must be comma-separated integers, got "
                          f"{','.join(values)!r}") from err


def config_from_flags() -> ExportConfig:
    return ExportConfig(
        out=FLAGS.out, model=FLAGS.model, catalog=FLAGS.catalog,
        feature_graph=FLAGS.feature_graph, mask=FLAGS.mask, preset=FLAGS.preset,
        seed=FLAGS.seed,
        world=WorldConfig(num_items=FLAGS.num_items, num_users=FLAGS.num_users,
                          history_events=FLAGS.history_events, seed=FLAGS.seed),
        keep_last=FLAGS.keep_last, window_days=FLAGS.window_days,
        engine=EngineExportConfig(FLAGS.beam_width, FLAGS.top_k, FLAGS.max_batch, FLAGS.device,
                                  FLAGS.max_request_exclusions, _widths(FLAGS.beam_widths),
                                  FLAGS.cuda_graphs),
        top_n=FLAGS.top_n, dtype=FLAGS.dtype, attention_backend=FLAGS.attention_backend,
        layer_kernels=FLAGS.layer_kernels, cache_dir=FLAGS.cache_dir or None,
        verify_requests=FLAGS.verify_requests, catalog_headroom=FLAGS.catalog_headroom,
        engine_from=FLAGS.engine_from, prompt_cache=FLAGS.prompt_cache)


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
    if report.engine_from:
        how = ("hard-linked: one load serves both versions" if report.package_shared
               else "copied (another file system): a server loads it again")
        print(f"  engine package of {report.engine_from} reused ({how}); new tables written "
              f"in {report.package_seconds:.1f} s", flush=True)
    if report.check is not None:
        print(report.check.summary(), flush=True)
    if FLAGS.report_json:
        Path(FLAGS.report_json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 0 if report.ok else 1
