"""Stand-in checkpoints: random-weight Qwen2/Qwen3 directories shaped like a team's.

No checkpoint is downloaded on the project's machines, so the vocabulary extension, the model
card and export are exercised on stand-ins with what a real Hugging Face checkpoint has:

* ``config.json`` + ``model.safetensors`` written by transformers
  (``Qwen2ForCausalLM(Qwen2Config(...)).save_pretrained``), every weight drawn from a seeded
  generator (norm scales around 1, biases and projections around 0), so a loader that drops a
  tensor shows in its logits;
* a byte-level BPE tokenizer trained with the ``tokenizers`` library on a small corpus, with
  Qwen's normaliser, pre-tokenizer and decoder, and Qwen's specials (``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>``) added after the BPE vocabulary, as in Qwen;
* a config ``vocab_size`` padded past ``len(tokenizer)`` to a multiple of 128, as Qwen's
  151936 rows hold its 151665 tokens: the rows past the text are padding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from xgr_common.errors import ConfigError, require
from xgr_common.model_card import ARCHITECTURES

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen pads its embedding to a multiple of 128 rows (151936 = 1187 x 128).
ROW_MULTIPLE = 128
BPE_VOCAB = 320
INIT_STD = 0.02
# A few sentences in the register of a recommendation product: enough for BPE merges that
# turn words into several tokens, small enough to train in milliseconds.
CORPUS = (
    "The user watched three films last week and bought two books about cooking.",
    "Recommended for you: twelve items from the categories you visit most often.",
    "A new season of the series starts on Friday; the first episode is free to watch.",
    "Customers who bought this lamp also bought a desk, a chair and a notebook.",
    "Listen again to the album you played 42 times in March, or try a similar artist.",
    "Shipping to Germany, France and Japan takes five days; returns are free.",
)


@dataclass(frozen=True)
class StandIn:
    """What ``make_stand_in`` wrote: ``path`` (a Hugging Face model directory),
    ``text_vocab`` (``len(tokenizer)``), ``vocab_size`` (config.json's, padding included)."""

    path: Path
    architecture: str
    text_vocab: int
    vocab_size: int
    hidden_size: int
    tie_word_embeddings: bool


def stand_in_tokenizer():
    """A Qwen-like fast tokenizer (``transformers.PreTrainedTokenizerFast``): byte-level BPE of
    ``BPE_VOCAB`` tokens trained on ``CORPUS`` (deterministic), then ``QWEN_SPECIALS``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # The same pipeline as transformers' Qwen2Tokenizer, which AutoTokenizer picks for a
    # qwen2/qwen3 directory: the saved tokenizer.json and the loaded tokenizer agree.
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS, trainer)
    backend.add_special_tokens([AddedToken(name, special=True, normalized=False)
                                for name in QWEN_SPECIALS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")


def make_stand_in(out_dir: str | os.PathLike, architecture: str = "qwen2",
                  hidden_size: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                  head_dim: int = 16, tie_word_embeddings: bool = True, seed: int = 0,
                  intermediate_size: int | None = None) -> StandIn:
    """Writes a random-weight ``architecture`` checkpoint and its tokenizer into ``out_dir``
    (new or empty). Weights float32: projections and embeddings ``N(0, 0.02)``, biases
    ``N(0, 0.02)``, norm scales ``1 + N(0, 0.02)``, drawn in ``named_parameters`` order from
    one generator seeded with ``seed``. ``intermediate_size`` defaults to ``2 * hidden_size``.
    """
    require(architecture in ARCHITECTURES, ConfigError,
            f"stand-in architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    for name, value in (("hidden_size", hidden_size), ("layers", layers), ("heads", heads),
                        ("kv_heads", kv_heads), ("head_dim", head_dim)):
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                ConfigError, f"stand-in {name} must be a positive int, got {value!r}")
    require(heads % kv_heads == 0, ConfigError,
            f"stand-in heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    require(isinstance(seed, int) and seed >= 0, ConfigError,
            f"stand-in seed must be an int >= 0, got {seed!r}")
    out = Path(out_dir)
    require(not out.exists() or (out.is_dir() and not any(out.iterdir())), ConfigError,
            f"stand-in output folder {out} must be new or empty")

    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tokenizer = stand_in_tokenizer()
    text_vocab = len(tokenizer)
    vocab_size = -(-(text_vocab + 1) // ROW_MULTIPLE) * ROW_MULTIPLE   # >= 1 padding row
    config_class, model_class = ((Qwen3Config, Qwen3ForCausalLM) if architecture == "qwen3"
                                 else (Qwen2Config, Qwen2ForCausalLM))
    config = config_class(
        vocab_size=vocab_size, hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        tie_word_embeddings=tie_word_embeddings, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        initializer_range=INIT_STD, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    model = model_class(config)
    _draw_weights(model, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return StandIn(path=out, architecture=architecture, text_vocab=text_vocab,
                   vocab_size=vocab_size, hidden_size=hidden_size,
                   tie_word_embeddings=tie_word_embeddings)


def _draw_weights(model: torch.nn.Module, seed: int) -> None:
    """Every parameter from one seeded generator (a tied head is drawn once, as the
    embedding), so the stand-in does not depend on torch's global random state."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * INIT_STD
            param.copy_(noise + 1.0 if name.endswith("norm.weight") else noise)
