"""``xgr stand_in --out DIR``: a random-weight Qwen2/Qwen3 checkpoint with a Qwen-like tokenizer.

For trying ``xgr extend_vocab`` and export where no real checkpoint can be downloaded
(``xgr_checkpoint.stand_in``). A bad flag gives a message and exit status 1.
"""

from __future__ import annotations

import sys

from absl import flags

from xgr_common.errors import XgrError

FLAGS = flags.FLAGS
SHAPE_FLAGS = ("architecture", "hidden_size", "layers", "heads", "kv_heads", "head_dim",
               "intermediate_size", "tie_word_embeddings")
flags.DEFINE_string("out", None, "Folder for the stand-in checkpoint (must be new or empty).")
flags.DEFINE_enum("architecture", "qwen2", ["qwen2", "qwen3"], "Hugging Face model_type.")
flags.DEFINE_integer("hidden_size", 64, "Hidden width (the profile tower's output width).")
flags.DEFINE_integer("layers", 2, "Decoder layers.")
flags.DEFINE_integer("heads", 4, "Query heads.")
flags.DEFINE_integer("kv_heads", 2, "Key/value heads (grouped-query attention).")
flags.DEFINE_integer("head_dim", 16, "Width of one head.")
flags.DEFINE_integer("intermediate_size", None, "MLP width (default: 2 x hidden_size).")
flags.DEFINE_bool("tie_word_embeddings", True, "lm_head shares the embedding.")
flags.DEFINE_string("preset", None, "Take the shape of a named model (qwen2-0.5b, qwen3-1.7b, "
                    "qwen2-7b, tiny: layers, heads, widths, tied head, architecture) instead of "
                    "the shape flags; the vocabulary stays the stand-in tokenizer's.")
flags.DEFINE_integer("seed", 0, "Seed of the random weights.")
flags.mark_flag_as_required("out")


def shape_of(name: str) -> dict:
    """The stand-in's shape flags from a named preset; ``ConfigError`` when a shape flag is
    given beside it (which would win is not obvious) or the name is unknown."""
    from torch_engine.config import preset
    from xgr_common.errors import ConfigError, require

    given = [f"--{n}" for n in SHAPE_FLAGS if FLAGS[n].present]
    require(not given, ConfigError, f"--preset {name} sets the shape: drop {', '.join(given)}")
    config = preset(name)
    return {"architecture": "qwen3" if config.qk_norm else "qwen2",
            "hidden_size": config.hidden_size, "layers": config.num_layers,
            "heads": config.num_heads, "kv_heads": config.num_kv_heads,
            "head_dim": config.head_dim, "intermediate_size": config.intermediate_size,
            "tie_word_embeddings": config.tie_word_embeddings}


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(f"xgr stand_in: unexpected arguments {argv[1:]}", file=sys.stderr)
        return 2
    from xgr_checkpoint.stand_in import make_stand_in

    try:
        shape = shape_of(FLAGS.preset) if FLAGS.preset else {
            name: FLAGS[name].value for name in SHAPE_FLAGS}
        stand_in = make_stand_in(FLAGS.out, shape["architecture"], shape["hidden_size"],
                                 shape["layers"], shape["heads"], shape["kv_heads"],
                                 shape["head_dim"], shape["tie_word_embeddings"], FLAGS.seed,
                                 shape["intermediate_size"])
    except (XgrError, OSError) as error:
        print(f"xgr stand_in: {error}", file=sys.stderr)
        return 1
    head = "tied" if stand_in.tie_word_embeddings else "untied"
    print(f"wrote a random-weight {stand_in.architecture} stand-in to {stand_in.path}: "
          f"{stand_in.text_vocab} text tokens in {stand_in.vocab_size} embedding rows, hidden "
          f"{stand_in.hidden_size}, lm_head {head}", flush=True)
    return 0
