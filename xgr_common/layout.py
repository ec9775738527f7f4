"""Token-id layout and attention-mask conventions shared by the TF feature ops and the engine.

Pure Python (no torch): the TF side (``custom_ops``, ``tf_frontend``) imports it too.

Vocabulary layout (all ids are int64 at the boundaries, int32 inside kernels)::

    [0, base)                                a checkpoint's text vocabulary (none: base = 0)
    [base, base + num_special)               special tokens (PAD, BOS, EOS, SEP, ...)
    [profile_base, profile_base + profile_vocab)   profile/context feature tokens
    [code_base + l*C, code_base + (l+1)*C)   semantic-ID code c of level l is code_base + l*C + c

A model trained from scratch owns its whole vocabulary (``base`` 0, the default layout). A
real checkpoint keeps its text vocabulary below ``base`` and gets the layout's tokens added
after it (``TokenLayout.after_text``; ``xgr_checkpoint.vocabulary`` resizes the checkpoint).
``token_names`` gives each layout token the name its tokenizer entry carries.

Segment ids (the hybrid attention layout, ``segment_ids [B, L]`` int32):
    0          the profile segment (soft-prompt vectors and profile/context tokens)
    1, 2, ...  one segment per history item, in order; the BOS/SEP tokens belong to the item
               that follows/precedes them as documented by the prompt-assembly op
    -1         padding (right-padded rows); never attended, never attends
Segments are contiguous and non-decreasing along a row.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

from xgr_common.errors import ConfigError, require, require_fields

PAD_SEGMENT = -1
PROFILE_SEGMENT = 0


class MaskMode(str, enum.Enum):
    """Which key positions a query position may attend during prefill.

    q, k are positions inside one request; seg is that request's segment-id row.
    """

    CAUSAL = "causal"                    # k <= q
    PREFIX_BIDIRECTIONAL = "prefix"      # k <= q, or both in the profile segment (seg == 0)
    SEGMENT_BIDIRECTIONAL = "segment"    # seg[k] == seg[q] (block diagonal, no cross-segment)
    ITEM_CAUSAL = "item_causal"          # k <= q, or seg[k] == seg[q]  (== seg[k] <= seg[q])

    @property
    def last_sees_request(self) -> bool:
        """Whether a request's last token attends every token of its request (all rules but
        segment-bidirectional, where it sees only its own segment)."""
        return self is not MaskMode.SEGMENT_BIDIRECTIONAL


@dataclass(frozen=True)
class TokenLayout:
    """Where special, profile and code tokens live in the vocabulary."""

    levels: int = 3
    codebook_size: int = 256
    code_base: int = 256
    num_special: int = 8
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    sep_id: int = 3
    item_start_id: int = 4
    profile_start_id: int = 5
    base: int = 0

    def __post_init__(self) -> None:
        for name in ("levels", "codebook_size", "code_base", "num_special", "pad_id", "bos_id",
                     "eos_id", "sep_id", "item_start_id", "profile_start_id", "base"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool), ConfigError,
                    f"TokenLayout.{name} must be an int, got {value!r}")
        require(self.levels >= 1, ConfigError, f"levels must be >= 1, got {self.levels}")
        require(self.codebook_size >= 1, ConfigError,
                f"codebook_size must be >= 1, got {self.codebook_size}")
        require(self.base >= 0, ConfigError, f"base must be >= 0, got {self.base}")
        specials = self.special_ids
        end = self.base + self.num_special
        require(all(self.base <= s < end for s in specials.values()), ConfigError,
                f"special ids {tuple(specials.values())} must lie in [base, base + num_special) "
                f"= [{self.base}, {end})")
        require(len(set(specials.values())) == len(specials), ConfigError,
                f"special ids must be distinct, got {specials}")
        require(self.num_special >= 7 and self.soft_id not in specials.values(), ConfigError,
                f"the specials need a free slot at base + 6 for the SOFT marker (num_special "
                f"{self.num_special}, specials {specials})")
        require(self.code_base >= end, ConfigError,
                f"code_base ({self.code_base}) must be >= base + num_special ({end})")

    @classmethod
    def after_text(cls, text_vocab: int, levels: int = 3, codebook_size: int = 256,
                   profile_vocab: int = 248, num_special: int = 8) -> "TokenLayout":
        """The layout of a checkpoint whose text vocabulary holds ids ``[0, text_vocab)``:
        specials (in the default order), then ``profile_vocab`` profile tokens, then the codes,
        all after the text."""
        require(isinstance(text_vocab, int) and text_vocab >= 0, ConfigError,
                f"text_vocab must be an int >= 0, got {text_vocab!r}")
        require(isinstance(profile_vocab, int) and profile_vocab >= 1, ConfigError,
                f"profile_vocab must be an int >= 1, got {profile_vocab!r}")
        base = text_vocab
        return cls(levels=levels, codebook_size=codebook_size,
                   code_base=base + num_special + profile_vocab, num_special=num_special,
                   pad_id=base, bos_id=base + 1, eos_id=base + 2, sep_id=base + 3,
                   item_start_id=base + 4, profile_start_id=base + 5, base=base)

    @property
    def special_ids(self) -> dict[str, int]:
        """Name -> id of each special token the prompt contract uses."""
        return {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "sep": self.sep_id,
                "item_start": self.item_start_id, "profile_start": self.profile_start_id}

    @property
    def soft_id(self) -> int:
        """The SOFT marker of the prompt contract v2: where the engine places the soft-prompt
        vectors (``xgr_common.prompt_v2``). The special slot after the named ones; the rows
        of the embedding table at it are never read for it."""
        return self.base + 6

    @property
    def profile_base(self) -> int:
        return self.base + self.num_special

    @property
    def profile_vocab(self) -> int:
        """Ids available for profile/context tokens: between the specials and the codes."""
        return self.code_base - self.profile_base

    @property
    def num_tokens(self) -> int:
        """How many ids the layout owns: ``[base, code_end)``."""
        return self.code_end - self.base

    def token_names(self) -> list[str]:
        """The name of each id in ``[base, code_end)``, in id order: ``<|xgr_bos|>`` and the
        other specials (``<|xgr_special_k|>`` for the unused ones), ``<|xgr_profile_k|>``,
        ``<|xgr_sid_l_c|>`` for code c of level l. A tokenizer of a resized checkpoint maps
        these names to these ids."""
        by_id = {value: name for name, value in self.special_ids.items()}
        names = [f"<|xgr_{by_id.get(self.base + k, f'special_{k}')}|>"
                 for k in range(self.num_special)]
        names += [f"<|xgr_profile_{k}|>" for k in range(self.profile_vocab)]
        names += [f"<|xgr_sid_{level}_{code}|>" for level in range(self.levels)
                  for code in range(self.codebook_size)]
        return names

    def to_dict(self) -> dict[str, int]:
        """The fields as JSON-ready ints (``from_dict`` reads them back)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "TokenLayout":
        """A layout from ``to_dict``'s output; ConfigError names an unknown or missing key."""
        require_fields(data, {f.name for f in fields(cls)}, "token layout")
        return cls(**data)

    @property
    def code_end(self) -> int:
        """One past the last code token id."""
        return self.code_base + self.levels * self.codebook_size

    def level_range(self, level: int) -> tuple[int, int]:
        """[start, end) of the token ids of ``level``'s codebook."""
        require(0 <= level < self.levels, ConfigError,
                f"level must be in [0, {self.levels}), got {level}")
        start = self.code_base + level * self.codebook_size
        return start, start + self.codebook_size

    def code_token(self, level: int, code: int) -> int:
        """Token id of ``code`` at ``level``."""
        return self.level_range(level)[0] + code
