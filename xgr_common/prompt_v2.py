"""The prompt contract v2: a long-term history part that stays fixed while a user is active,
soft vectors after it, text spans beside the semantic IDs.

Pure Python (no torch, no TF). The TF side builds the prompt with ``XgrSplitHistory`` and
``XgrAssemblePromptV2`` (``custom_ops``, each with its Torch twin); the engine places the
soft-prompt vectors at the SOFT markers (``torch_engine.search.place_soft_vectors``).

A request's prompt, with n long-term and m recent items::

    BOS intro | ITEM_START c0 c1 c2 | ... | before_profile SOFT x S PROFILE_START ctx before_recent
    seg 0       seg 1                 n     seg n + 1 (profile)
        | ITEM_START c0 c1 c2 | ... | question ITEM_START
          seg n + 2             ...   seg n + m + 2 (the item to generate)

**The frozen part** is ``BOS intro`` and the long-term items (``frozen_lengths`` tokens). Its
items come from ``XgrSplitHistory``: time is cut into blocks of ``block_seconds``; the
request's block is open; the long-term part is whole closed blocks among the newest
``long_term_blocks``, from the newest back while they fit ``long_term_items`` (the newest alone
cut to its newest events), each run of equal consecutive items inside a block collapsed. So
it changes only when the request time enters a new block: a block closes (its events join) and
the oldest may retire. The recent part is the open block's newest ``recent_items`` events.

**Mask rules.** Both prefill masks only look back: causal (``k <= q``) and item-causal (``k <=
q``, or the same segment; segments never decrease along a row). The frozen part comes first,
so its tokens attend only the frozen part, and its KV depends on it alone: not on the soft
vectors, the context, the recent items or the request time. The profile segment (text, soft
vectors, context) attends the frozen part and itself; each recent item attends everything
before it (and itself); the generated item's segment attends the whole prompt. Positions are
contiguous from 0: the S soft vectors take the S positions of their markers.

**Text spans** (``intro``, ``before_profile``, ``before_recent``, ``question``) are token ids of
the checkpoint's tokenizer, recorded in the model card (``xgr_model.json``) with the rest of
this contract; a model trained from scratch leaves them empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

from xgr_common.errors import ConfigError, require, require_fields

VERSION = 2
SPANS = ("intro", "before_profile", "before_recent", "question")


@dataclass(frozen=True)
class TextSpans:
    """Token ids placed between the parts of a v2 prompt (see the module docstring)."""

    intro: tuple[int, ...] = ()
    before_profile: tuple[int, ...] = ()
    before_recent: tuple[int, ...] = ()
    question: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in SPANS:
            span = getattr(self, name)
            require(isinstance(span, tuple) and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 31
                for t in span), ConfigError,
                f"text span {name} must be a tuple of token ids in [0, 2^31), got {span!r}")

    @property
    def total(self) -> int:
        return sum(len(getattr(self, name)) for name in SPANS)

    def as_attrs(self) -> dict[str, list[int]]:
        """The spans as the assembly op's attributes."""
        return {name: list(getattr(self, name)) for name in SPANS}


@dataclass(frozen=True)
class PromptText:
    """The text of a v2 prompt's spans, before tokenisation (``encode`` gives the
    ``TextSpans`` a model card records)."""

    intro: str = ""
    before_profile: str = ""
    before_recent: str = ""
    question: str = ""

    def __post_init__(self) -> None:
        for name in SPANS:
            require(isinstance(getattr(self, name), str), ConfigError,
                    f"prompt text {name} must be a string, got {getattr(self, name)!r}")

    def encode(self, tokenize: Callable[[str], Sequence[int]], text_vocab: int) -> TextSpans:
        """Each span's token ids by ``tokenize`` (the checkpoint's tokenizer, no special
        tokens added); ``ConfigError`` names a span that maps outside the text vocabulary
        ``[0, text_vocab)`` (the layout's own tokens must not appear in text)."""
        spans = {}
        for name in SPANS:
            text = getattr(self, name)
            ids = tuple(int(t) for t in tokenize(text)) if text else ()
            require(all(0 <= t < text_vocab for t in ids), ConfigError,
                    f"prompt text {name} {text!r} encodes to ids {list(ids)}, some outside the "
                    f"text vocabulary [0, {text_vocab}): the layout's tokens cannot be text")
            spans[name] = ids
        return TextSpans(**spans)


@dataclass(frozen=True)
class HistorySplit:
    """How ``XgrSplitHistory`` cuts a history (the op's attributes)."""

    block_seconds: int = 86400
    long_term_blocks: int = 90
    long_term_items: int = 200
    recent_items: int = 50

    def __post_init__(self) -> None:
        for name, low in (("block_seconds", 1), ("long_term_blocks", 1),
                          ("long_term_items", 0), ("recent_items", 1)):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= low,
                    ConfigError, f"HistorySplit.{name} must be an int >= {low}, got {value!r}")
        require(self.long_term_blocks <= 2 ** 40, ConfigError,
                f"HistorySplit.long_term_blocks must be <= 2^40, got {self.long_term_blocks}")

    def as_attrs(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PromptV2Layout:
    """The v2 prompt of a model: the history split, the text spans and the soft tokens."""

    split: HistorySplit = field(default_factory=HistorySplit)
    spans: TextSpans = field(default_factory=TextSpans)

    def max_prompt_tokens(self, levels: int, soft_tokens: int, context_tokens: int) -> int:
        """The longest row ``XgrAssemblePromptV2`` emits for this layout: BOS, the spans, S
        SOFT markers, PROFILE_START, the context, the trailing ITEM_START and every item the
        split can keep. A prompt of this many tokens is never cut."""
        items = self.split.long_term_items + self.split.recent_items
        return 3 + self.spans.total + soft_tokens + context_tokens + items * (1 + levels)

    def to_dict(self) -> dict:
        """JSON-ready, with the contract's version (``from_dict`` reads it back)."""
        return {"version": VERSION, "split": self.split.as_attrs(),
                "spans": self.spans.as_attrs()}

    @classmethod
    def from_dict(cls, data: dict) -> "PromptV2Layout":
        """The layout of ``to_dict``'s output; ``ConfigError`` names what is wrong, and a
        layout of another version is refused with the version it has."""
        require_fields(data, {"version", "split", "spans"}, "v2 prompt layout")
        require(data["version"] == VERSION, ConfigError,
                f"the prompt layout is version {data['version']!r}; this contract reads "
                f"version {VERSION}")
        split, spans = data["split"], data["spans"]
        require_fields(split, {f.name for f in fields(HistorySplit)}, "history split")
        require_fields(spans, set(SPANS), "text spans")
        for name in SPANS:
            require(isinstance(spans[name], list), ConfigError,
                    f"text span {name} must be a list of token ids, got {spans[name]!r}")
        return cls(split=HistorySplit(**split),
                   spans=TextSpans(**{name: tuple(spans[name]) for name in SPANS}))
