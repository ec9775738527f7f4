"""Token-id layout and attention-mask conventions shared by the TF feature ops and the engine.

Pure Python (no torch): the TF side (``custom_ops``, ``tf_frontend``) imports it too.

Vocabulary layout (all ids are int64 at the boundaries, int32 inside kernels)::

    [0, num_special)                         special tokens (PAD, BOS, EOS, SEP, ...)
    [profile_base, profile_base + profile_vocab)   profile/context feature tokens
    [code_base + l*C, code_base + (l+1)*C)   semantic-ID code c of level l is code_base + l*C + c

``code_base`` is configurable so a real checkpoint can keep its text vocabulary below the
code tokens (added tokens at the end of the vocabulary).

Segment ids (the hybrid attention layout, ``segment_ids [B, L]`` int32):
    0          the profile segment (soft-prompt vectors and profile/context tokens)
    1, 2, ...  one segment per history item, in order; the BOS/SEP tokens belong to the item
               that follows/precedes them as documented by the prompt-assembly op
    -1         padding (right-padded rows); never attended, never attends
Segments are contiguous and non-decreasing along a row.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from xgr_common.errors import ConfigError, require

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

    def __post_init__(self) -> None:
        require(self.levels >= 1, ConfigError, f"levels must be >= 1, got {self.levels}")
        require(self.codebook_size >= 1, ConfigError,
                f"codebook_size must be >= 1, got {self.codebook_size}")
        specials = (self.pad_id, self.bos_id, self.eos_id, self.sep_id,
                    self.item_start_id, self.profile_start_id)
        require(all(0 <= s < self.num_special for s in specials), ConfigError,
                f"special ids {specials} must lie in [0, num_special={self.num_special})")
        require(self.code_base >= self.num_special, ConfigError,
                f"code_base ({self.code_base}) must be >= num_special ({self.num_special})")

    @property
    def profile_base(self) -> int:
        return self.num_special

    @property
    def profile_vocab(self) -> int:
        """Ids available for profile/context tokens: between the specials and the codes."""
        return self.code_base - self.num_special

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
