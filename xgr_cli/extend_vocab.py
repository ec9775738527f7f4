"""``xgr extend_vocab --model DIR --out DIR``: a Qwen2/Qwen3 checkpoint made ready for export.

Turns the flags into an ``xgr_checkpoint.vocabulary.VocabularyConfig`` and runs
``extend_vocabulary``: the token layout after the checkpoint's text vocabulary, the tokenizer
and embeddings resized, ``xgr_model.json`` written beside them in ``--out``. Prints what it
did; a bad flag or checkpoint gives a message and exit status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from absl import flags

from xgr_checkpoint.vocabulary import VocabularyConfig
from xgr_common.errors import XgrError
from xgr_common.prompt_v2 import SPANS, HistorySplit, PromptText

_DEFAULTS = VocabularyConfig()
_SPLIT = HistorySplit()
FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Hugging Face Qwen2/Qwen3 folder (config.json, safetensors, "
                    "tokenizer).")
flags.DEFINE_string("out", None, "Folder for the extended checkpoint (must be new or empty).")
flags.DEFINE_integer("levels", _DEFAULTS.levels, "Semantic-ID code levels.")
flags.DEFINE_integer("codebook_size", _DEFAULTS.codebook_size, "Codes per level.")
flags.DEFINE_integer("profile_vocab", _DEFAULTS.profile_vocab,
                     "Profile/context token ids between the specials and the codes.")
flags.DEFINE_integer("keep_last", _DEFAULTS.keep_last, "History items kept per prompt.")
flags.DEFINE_integer("window_days", _DEFAULTS.window_seconds // 86400,
                     "History events older than this are dropped.")
flags.DEFINE_list("context_vocab", list(_DEFAULTS.context_vocab),
                  "Context values with a token of their own (the rest share one).")
flags.DEFINE_integer("embedding_buckets", _DEFAULTS.embedding_buckets,
                     "Rows of the TF table that hashed user/context ids fall into.")
flags.DEFINE_integer("embedding_dim", _DEFAULTS.embedding_dim, "Width of the TF table.")
flags.DEFINE_integer("tower_hidden", _DEFAULTS.tower_hidden, "Profile tower hidden width.")
flags.DEFINE_integer("profile_tokens", _DEFAULTS.profile_tokens,
                     "Soft-prompt vectors the profile tower emits.")
flags.DEFINE_enum("prefill_mask", _DEFAULTS.prefill_mask, ["item_causal", "causal"],
                  "The prefill mask the model is trained with.")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of the new rows' noise.")
flags.DEFINE_float("noise_scale", _DEFAULTS.noise_scale,
                   "New rows: text-row mean + noise_scale x text-row std x N(0, 1).")
flags.DEFINE_integer("pad_to_multiple_of", _DEFAULTS.pad_to_multiple_of,
                     "The new embedding size is rounded up to this.")
flags.DEFINE_integer("max_vocab_size", _DEFAULTS.max_vocab_size,
                     "Refuse a layout that would make the vocabulary larger than this.")
flags.DEFINE_string("report_json", None, "Also write the report to this JSON file.")
flags.DEFINE_integer("prompt_version", 1, "The prompt contract: 1, or 2 (a frozen long-term "
                     "history part first, soft vectors after it, text spans; the flags below "
                     "set it).")
flags.DEFINE_integer("block_hours", _SPLIT.block_seconds // 3600,
                     "Version 2: hours per history block (the long-term part changes only "
                     "when a block closes).")
flags.DEFINE_integer("long_term_blocks", _SPLIT.long_term_blocks,
                     "Version 2: closed blocks the long-term part draws from.")
flags.DEFINE_integer("long_term_items", _SPLIT.long_term_items,
                     "Version 2: most long-term history items.")
flags.DEFINE_integer("recent_items", _SPLIT.recent_items,
                     "Version 2: most recent history items.")
for _span in SPANS:
    flags.DEFINE_string(_span, "", f"Version 2: the text of the {_span} span, tokenised by the "
                                   f"checkpoint's tokenizer.")
flags.mark_flags_as_required(["model", "out"])


def config_from_flags() -> VocabularyConfig:
    return VocabularyConfig(
        levels=FLAGS.levels, codebook_size=FLAGS.codebook_size,
        profile_vocab=FLAGS.profile_vocab, window_seconds=FLAGS.window_days * 86400,
        keep_last=FLAGS.keep_last, context_vocab=tuple(FLAGS.context_vocab),
        embedding_buckets=FLAGS.embedding_buckets, embedding_dim=FLAGS.embedding_dim,
        tower_hidden=FLAGS.tower_hidden, profile_tokens=FLAGS.profile_tokens,
        prefill_mask=FLAGS.prefill_mask, seed=FLAGS.seed, noise_scale=FLAGS.noise_scale,
        pad_to_multiple_of=FLAGS.pad_to_multiple_of, max_vocab_size=FLAGS.max_vocab_size,
        prompt_version=FLAGS.prompt_version,
        history_split=HistorySplit(block_seconds=FLAGS.block_hours * 3600,
                                   long_term_blocks=FLAGS.long_term_blocks,
                                   long_term_items=FLAGS.long_term_items,
                                   recent_items=FLAGS.recent_items),
        prompt_text=PromptText(**{span: getattr(FLAGS, span) for span in SPANS}))


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"xgr extend_vocab: unexpected arguments {argv[1:]}", file=sys.stderr)
        return 2
    from xgr_checkpoint.vocabulary import extend_vocabulary

    try:
        report = extend_vocabulary(FLAGS.model, FLAGS.out, config_from_flags(),
                                   progress=lambda line: print(line, flush=True))
    except (XgrError, OSError) as error:   # a bad flag or checkpoint: a message, no traceback
        print(f"xgr extend_vocab: {error}", file=sys.stderr)
        return 1
    print(report.summary(), flush=True)
    if FLAGS.report_json:
        Path(FLAGS.report_json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 0
