"""The token layout's tokens added after a Qwen2/Qwen3 checkpoint's text vocabulary.

A Hugging Face checkpoint's tokenizer fills ids ``[0, len(tokenizer))`` with text (Qwen2:
151665 tokens in 151936 embedding rows, the rest padding). ``extend_vocabulary`` places the
layout (``TokenLayout.after_text``: specials, profile/context tokens, semantic-ID codes) at
``base = len(tokenizer)``, adds its names (``TokenLayout.token_names``) to the tokenizer as
special tokens, grows the embedding (and an untied ``lm_head``; a tied one follows) to cover
``code_end`` and writes the model, the tokenizer and ``xgr_model.json`` to a new folder.

Initialisation rule (``INIT_RULE``): every row the layout takes, and every row added past
the old size, is ``mean + noise_scale * std * z``, where ``mean`` and ``std`` are the
per-dimension mean and standard deviation (float64, population) of that matrix's text rows
``[0, base)`` and ``z ~ N(0, 1)`` is drawn float32 from one ``torch.Generator`` seeded with
``seed``: first the embedding's rows in id order, then (untied) the head's. New tokens thus
start in the text rows' distribution (their logits near the average text logit), distinct
from each other, reproducibly. The text rows are left bit-identical; padding rows past
``code_end`` that existed before stay as they were.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from xgr_common.errors import ConfigError, require
from xgr_common.layout import TokenLayout
from xgr_common.model_card import ARCHITECTURES, MODEL_CARD_FILE, SERVED_MASKS, ModelCard
from xgr_common.prompt_spec import PromptSpec
from xgr_common.prompt_v2 import HistorySplit, PromptText, PromptV2Layout

if TYPE_CHECKING:   # torch loads with the first extension: `xgr extend_vocab --help` is quick
    import torch

# Token ids are int32 inside the kernels: no vocabulary may pass this.
INT32_VOCAB_LIMIT = 2**31 - 1
LAYOUT_PREFIX = "<|xgr_"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
INIT_RULE = ("text-row mean + {noise_scale} x text-row std x N(0, 1) per dimension, "
             "seed {seed}")
_SPEC_DEFAULTS = PromptSpec()
_INT_FIELDS = ("levels", "codebook_size", "profile_vocab", "window_seconds", "keep_last",
               "embedding_buckets", "embedding_dim", "tower_hidden", "profile_tokens",
               "seed", "pad_to_multiple_of", "max_vocab_size")
_MINIMUM = {"profile_tokens": 0, "seed": 0}


@dataclass(frozen=True)
class VocabularyConfig:
    """What a team chooses when it prepares a checkpoint.

    levels, codebook_size: the semantic-ID codes (``levels * codebook_size`` tokens);
    profile_vocab: profile/context token ids between the specials and the codes; the
    ``PromptSpec`` fields (window_seconds, keep_last, context_vocab, embedding_buckets,
    embedding_dim, tower_hidden, profile_tokens) go into ``xgr_model.json`` with the layout;
    prefill_mask: ``item_causal`` or ``causal``, the mask the model will be trained with;
    seed, noise_scale: the initialisation rule's (module docstring); pad_to_multiple_of: the
    new embedding size is rounded up to this; max_vocab_size: the largest size allowed;
    prompt_version: 1 or 2 (``xgr_common.prompt_v2``); for version 2, history_split (how the
    history splits into its frozen and recent parts) and prompt_text (the spans' text,
    tokenised by the checkpoint's tokenizer into the card).
    """

    levels: int = 3
    codebook_size: int = 256
    profile_vocab: int = 248
    window_seconds: int = _SPEC_DEFAULTS.window_seconds
    keep_last: int = _SPEC_DEFAULTS.keep_last
    context_vocab: tuple[str, ...] = _SPEC_DEFAULTS.context_vocab
    embedding_buckets: int = _SPEC_DEFAULTS.embedding_buckets
    embedding_dim: int = _SPEC_DEFAULTS.embedding_dim
    tower_hidden: int = _SPEC_DEFAULTS.tower_hidden
    profile_tokens: int = _SPEC_DEFAULTS.profile_tokens
    prefill_mask: str = "item_causal"
    seed: int = 0
    noise_scale: float = 0.1
    pad_to_multiple_of: int = 64
    max_vocab_size: int = INT32_VOCAB_LIMIT
    prompt_version: int = 1
    history_split: HistorySplit = field(default_factory=HistorySplit)
    prompt_text: PromptText = field(default_factory=PromptText)

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value, low = getattr(self, name), _MINIMUM.get(name, 1)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= low,
                    ConfigError, f"VocabularyConfig.{name} must be an int >= {low}, got "
                                 f"{value!r}")
        require(self.max_vocab_size <= INT32_VOCAB_LIMIT, ConfigError,
                f"VocabularyConfig.max_vocab_size must be <= {INT32_VOCAB_LIMIT} (token ids "
                f"are int32 inside the kernels), got {self.max_vocab_size}")
        require(isinstance(self.noise_scale, (int, float)) and not isinstance(
                    self.noise_scale, bool) and math.isfinite(self.noise_scale)
                and self.noise_scale > 0, ConfigError,
                f"VocabularyConfig.noise_scale must be a finite number > 0, got "
                f"{self.noise_scale!r}")
        masks = [mask.value for mask in SERVED_MASKS]
        require(self.prefill_mask in masks, ConfigError,
                f"VocabularyConfig.prefill_mask must be one of {masks}, got "
                f"{self.prefill_mask!r}")
        context = tuple(self.context_vocab)
        require(all(isinstance(value, str) and value for value in context), ConfigError,
                f"VocabularyConfig.context_vocab must hold non-empty strings, got "
                f"{self.context_vocab!r}")
        require(len(set(context)) == len(context), ConfigError,
                f"VocabularyConfig.context_vocab must not repeat a value, got {context!r}")
        object.__setattr__(self, "context_vocab", context)
        require(self.prompt_version in (1, 2), ConfigError,
                f"VocabularyConfig.prompt_version must be 1 or 2, got {self.prompt_version!r}")
        require(self.prompt_version == 2 or (self.prompt_text == PromptText()
                                             and self.history_split == HistorySplit()),
                ConfigError, "VocabularyConfig.prompt_text and history_split belong to prompt "
                             "version 2; set prompt_version=2")
        require(isinstance(self.history_split, HistorySplit)
                and isinstance(self.prompt_text, PromptText), ConfigError,
                "VocabularyConfig.history_split must be a HistorySplit and prompt_text a "
                "PromptText")
        try:   # the prompt contract's own rules, before any file is read
            self.prompt_spec(text_vocab=0, hidden_size=1)
        except ConfigError as error:
            raise ConfigError(f"VocabularyConfig: {error}") from None

    def layout(self, text_vocab: int) -> TokenLayout:
        """The layout after ``text_vocab`` text ids."""
        return TokenLayout.after_text(text_vocab, self.levels, self.codebook_size,
                                      self.profile_vocab)

    def prompt_spec(self, text_vocab: int, hidden_size: int,
                    tokenize: Callable[[str], list[int]] | None = None) -> PromptSpec:
        """The prompt contract of the extended checkpoint (soft prompts ``hidden_size`` wide);
        version 2's text spans by ``tokenize`` (the checkpoint's tokenizer; None: empty,
        for checks before any file is read)."""
        prompt_v2 = None
        if self.prompt_version == 2:
            spans = (self.prompt_text.encode(tokenize, text_vocab) if tokenize is not None
                     else PromptText().encode(lambda text: [], 0))
            prompt_v2 = PromptV2Layout(self.history_split, spans)
        return PromptSpec(layout=self.layout(text_vocab), window_seconds=self.window_seconds,
                          keep_last=self.keep_last, context_vocab=self.context_vocab,
                          embedding_buckets=self.embedding_buckets,
                          embedding_dim=self.embedding_dim, tower_hidden=self.tower_hidden,
                          profile_tokens=self.profile_tokens, model_hidden=hidden_size,
                          prompt_v2=prompt_v2)

    @property
    def init_rule(self) -> str:
        return INIT_RULE.format(noise_scale=self.noise_scale, seed=self.seed)


@dataclass(frozen=True)
class VocabularyReport:
    """What ``extend_vocabulary`` did: sizes before/after, where the layout lies
    (``base = text_vocab`` to ``code_end``), the rows drawn by the rule
    (``initialised_rows``, ``[start, end)``), the rule, and the wall time."""

    model_dir: Path
    out_dir: Path
    architecture: str
    tied: bool
    text_vocab: int
    old_vocab_size: int
    new_vocab_size: int
    code_end: int
    tokens_added: int
    initialised_rows: tuple[int, int]
    init_rule: str
    seconds: float
    card: ModelCard = field(repr=False)

    @property
    def base(self) -> int:
        return self.text_vocab

    def summary(self) -> str:
        start, end = self.initialised_rows
        head = "tied to the embedding" if self.tied else "untied, resized alike"
        return "\n".join([
            f"extended {self.model_dir} ({self.architecture}) -> {self.out_dir}",
            f"  vocabulary: {self.old_vocab_size} -> {self.new_vocab_size} rows "
            f"(text ids [0, {self.text_vocab}) unchanged; lm_head {head})",
            f"  layout: {self.tokens_added} tokens at ids [{self.base}, {self.code_end}) "
            f"(specials from {self.base}, profile from {self.card.spec.layout.profile_base}, "
            f"codes from {self.card.spec.layout.code_base})",
            f"  rows [{start}, {end}) initialised: {self.init_rule}",
            f"  {MODEL_CARD_FILE}: prefill_mask {self.card.prefill_mask.value}, "
            f"profile_tokens {self.card.spec.profile_tokens}, model_hidden "
            f"{self.card.spec.model_hidden}",
            f"  {self.seconds:.1f} s"])

    def to_json(self) -> dict:
        return {"model_dir": str(self.model_dir), "out_dir": str(self.out_dir),
                "architecture": self.architecture, "tied": self.tied,
                "text_vocab": self.text_vocab, "old_vocab_size": self.old_vocab_size,
                "new_vocab_size": self.new_vocab_size, "code_end": self.code_end,
                "tokens_added": self.tokens_added,
                "initialised_rows": list(self.initialised_rows), "init_rule": self.init_rule,
                "seconds": self.seconds}


def extend_vocabulary(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      config: VocabularyConfig = VocabularyConfig(),
                      progress: Callable[[str], None] | None = None) -> VocabularyReport:
    """Adds ``config``'s layout after ``model_dir``'s text vocabulary; writes the resized
    checkpoint (safetensors, the checkpoint's dtype), its tokenizer and ``xgr_model.json`` to
    ``out_dir`` (new or empty). ``progress`` gets one line per stage.

    Raises ConfigError naming the file or field: ``model_dir`` not a Qwen2/Qwen3 checkpoint
    with a tokenizer, already extended, a layout past ``max_vocab_size``, ``out_dir`` not
    empty.
    """
    from transformers import AutoModelForCausalLM

    say = progress or (lambda line: None)
    started = time.perf_counter()
    source, out = Path(model_dir), Path(out_dir)
    hf_config = _read_config(source)
    architecture = hf_config["model_type"]
    require(not out.exists() or (out.is_dir() and not any(out.iterdir())), ConfigError,
            f"output folder {out} must be new or empty")
    require(not (source / MODEL_CARD_FILE).exists(), ConfigError,
            f"{source} already holds {MODEL_CARD_FILE}: its vocabulary was extended before")

    say(f"reading the tokenizer of {source}")
    tokenizer = _load_tokenizer(source)
    base, old_size = len(tokenizer), int(hf_config["vocab_size"])
    require(base <= old_size, ConfigError,
            f"{source}: the tokenizer holds {base} tokens but config.json vocab_size is "
            f"{old_size}: they do not belong to one checkpoint")
    layout = config.layout(base)
    new_size = max(old_size, _round_up(layout.code_end, config.pad_to_multiple_of))
    require(new_size <= config.max_vocab_size, ConfigError,
            f"the layout ends at id {layout.code_end} (code_end = {base} text ids + "
            f"{layout.num_tokens} layout tokens), a vocabulary of {new_size} rows, beyond "
            f"VocabularyConfig.max_vocab_size {config.max_vocab_size}")

    # The prompt's text spans by the checkpoint's own tokenizer, before anything is written.
    spec = config.prompt_spec(base, int(hf_config["hidden_size"]), lambda text: tokenizer(
        text, add_special_tokens=False)["input_ids"])
    names = layout.token_names()
    _add_layout_tokens(tokenizer, names, layout, source)
    say(f"added {len(names)} tokens at ids [{base}, {layout.code_end})")

    say(f"loading the {architecture} model of {source}")
    model = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
    tied, rows = _resize_and_initialise(model, base, layout.code_end, new_size, config, say)

    say(f"saving the model, the tokenizer and {MODEL_CARD_FILE} to {out}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    hidden = int(model.config.hidden_size)
    card = ModelCard(spec=spec, prefill_mask=config.prefill_mask,
                     architecture=architecture, vocab_size=new_size, hidden_size=hidden)
    card.write(out)
    ModelCard.read(out)   # the card agrees with the config.json and tokenizer.json written
    return VocabularyReport(
        model_dir=source, out_dir=out, architecture=architecture, tied=tied, text_vocab=base,
        old_vocab_size=old_size, new_vocab_size=new_size, code_end=layout.code_end,
        tokens_added=len(names), initialised_rows=rows, init_rule=config.init_rule,
        seconds=time.perf_counter() - started, card=card)


def _resize_and_initialise(model, base: int, code_end: int, new_size: int,
                           config: VocabularyConfig, say: Callable[[str], None]
                           ) -> tuple[bool, tuple[int, int]]:
    """Grows ``model``'s embedding (and untied head) to ``new_size`` rows and draws the rows
    the layout takes, and those the resize adds, by the rule. Returns whether the head is tied
    and the ``[start, end)`` rows drawn."""
    import torch

    old_size = model.get_input_embeddings().weight.shape[0]
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    text = {"embedding": model.get_input_embeddings().weight[:base].detach().clone()}
    if not tied:
        text["lm_head"] = model.get_output_embeddings().weight[:base].detach().clone()
    if new_size != old_size:
        say(f"resizing the embedding{'' if tied else ' and lm_head'}: {old_size} -> "
            f"{new_size} rows")
        model.resize_token_embeddings(new_size, mean_resizing=False)
    # The rows the layout takes, plus every row the resize added (its padding past code_end).
    rows = (base, new_size if new_size > old_size else code_end)
    generator = torch.Generator().manual_seed(config.seed)
    matrices = {"embedding": model.get_input_embeddings().weight}
    if not tied:
        matrices["lm_head"] = model.get_output_embeddings().weight
    for name, weight in matrices.items():    # the embedding's draws first, then the head's
        say(f"initialising {name} rows [{rows[0]}, {rows[1]}): {config.init_rule}")
        with torch.no_grad():
            weight[rows[0]:rows[1]] = initial_rows(text[name], rows[1] - rows[0],
                                                   config.noise_scale, generator)
        # transformers' resize copies the old rows; a release that did not would show here.
        require(torch.equal(weight[:base], text[name]), ConfigError,
                f"{name} text rows [0, {base}) changed while resizing to {new_size} rows")
    return tied, rows


def initial_rows(text_rows: torch.Tensor, count: int, noise_scale: float,
                 generator: torch.Generator) -> torch.Tensor:
    """``count`` new rows ``[count, hidden]`` (``text_rows``' dtype) by the rule: the text rows'
    per-dimension mean + ``noise_scale`` x their std x ``N(0, 1)`` noise (float32 draws
    from ``generator``, combined in float64). text_rows: ``[base, hidden]``."""
    import torch

    std, mean = _column_std_mean(text_rows)
    noise = torch.randn((count, text_rows.shape[1]), generator=generator,
                        dtype=torch.float32).double()
    return (mean + noise_scale * std * noise).to(text_rows.dtype)


def _column_std_mean(rows: torch.Tensor, chunk: int = 16384) -> tuple[torch.Tensor, ...]:
    """Population std and mean per column (float64), a block of rows at a time: a float64
    copy of a whole 150k-row embedding is not needed."""
    import torch

    total = torch.zeros(rows.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for start in range(0, rows.shape[0], chunk):
        block = rows[start:start + chunk].double()
        total += block.sum(0)
        squares += (block * block).sum(0)
    mean = total / rows.shape[0]
    return (squares / rows.shape[0] - mean * mean).clamp_min(0).sqrt(), mean


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _read_config(source: Path) -> dict:
    require(source.is_dir(), ConfigError, f"model folder {source} does not exist")
    path = source / "config.json"
    require(path.is_file(), ConfigError, f"{source} has no config.json: not a Hugging Face "
                                         f"model folder")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None
    require(config.get("model_type") in ARCHITECTURES, ConfigError,
            f"{path} model_type is {config.get('model_type')!r}: only {list(ARCHITECTURES)} "
            f"checkpoints can be extended")
    size = config.get("vocab_size")
    require(isinstance(size, int) and size >= 1, ConfigError,
            f"{path} vocab_size must be a positive int, got {size!r}")
    return config


def _load_tokenizer(source: Path):
    from transformers import AutoTokenizer

    require(any((source / name).is_file() for name in TOKENIZER_FILES), ConfigError,
            f"{source} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): the layout's tokens "
            f"are added after the tokenizer's text vocabulary")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigError(f"{source}: its tokenizer does not load: {error}") from None
    require(tokenizer.is_fast, ConfigError,
            f"{source}: the tokenizer must be a fast (tokenizer.json) tokenizer, got "
            f"{type(tokenizer).__name__}")
    taken = sorted(name for name in tokenizer.get_vocab() if name.startswith(LAYOUT_PREFIX))
    require(not taken, ConfigError,
            f"{source}: the tokenizer already holds {len(taken)} xgr tokens "
            f"({', '.join(taken[:2])}, ...): this checkpoint was extended before")
    return tokenizer


def _add_layout_tokens(tokenizer, names: list[str], layout: TokenLayout, source: Path) -> None:
    """Adds ``names`` as special tokens and checks each took its layout id."""
    from tokenizers import AddedToken

    added = tokenizer.add_tokens([AddedToken(name, special=True, normalized=False)
                                  for name in names], special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids(names)
    wrong = [(name, got, layout.base + k) for k, (name, got) in enumerate(zip(names, ids))
             if got != layout.base + k]
    require(added == len(names) and not wrong, ConfigError,
            f"{source}: the tokenizer put layout tokens at other ids than the layout's "
            f"(name, got, want): {wrong[:3]}; {added} of {len(names)} were added")
