"""``xgr stand_in --out DIR``: a random-weight Qwen2/Qwen3 checkpoint with a Qwen-like tokenizer.

For trying ``xgr extend_vocab`` and export where no real checkpoint can be downloaded
(``xgr_checkpoint.stand_in``). A bad flag gives a message and exit status 1.
"""

from __future__ import annotations

import sys

from absl import flags

from xgr_common.errors import XgrError

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Folder for the stand-in checkpoint (must be new or empty).")
flags.DEFINE_enum("architecture", "qwen2", ["qwen2", "qwen3"], "Hugging Face model_type.")
flags.DEFINE_integer("hidden_size", 64, "Hidden width (the profile tower's output width).")
flags.DEFINE_integer("layers", 2, "Decoder layers.")
flags.DEFINE_integer("heads", 4, "Query heads.")
flags.DEFINE_integer("kv_heads", 2, "Key/value heads (grouped-query attention).")
flags.DEFINE_integer("head_dim", 16, "Width of one head.")
flags.DEFINE_bool("tie_word_embeddings", True, "lm_head shares the embedding.")
flags.DEFINE_integer("seed", 0, "Seed of the random weights.")
flags.mark_flag_as_required("out")


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"xgr stand_in: unexpected arguments {argv[1:]}", file=sys.stderr)
        return 2
    from xgr_checkpoint.stand_in import make_stand_in

    try:
        stand_in = make_stand_in(FLAGS.out, FLAGS.architecture, FLAGS.hidden_size, FLAGS.layers,
                                 FLAGS.heads, FLAGS.kv_heads, FLAGS.head_dim,
                                 FLAGS.tie_word_embeddings, FLAGS.seed)
    except (XgrError, OSError) as error:
        print(f"xgr stand_in: {error}", file=sys.stderr)
        return 1
    head = "tied" if stand_in.tie_word_embeddings else "untied"
    print(f"wrote a random-weight {stand_in.architecture} stand-in to {stand_in.path}: "
          f"{stand_in.text_vocab} text tokens in {stand_in.vocab_size} embedding rows, hidden "
          f"{stand_in.hidden_size}, lm_head {head}", flush=True)
    return 0
