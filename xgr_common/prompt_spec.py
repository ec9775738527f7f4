"""The contract between the TF feature graph and the engine: how a request becomes a prompt.

Pure Python (no torch): ``tf_frontend`` builds its graph from this spec and the engine's
trainer builds the matching Torch side from the same spec, so the two can never drift.

A request's prompt (see ``custom_ops`` prompt assembly, ``xgr_common.layout``)::

    [S soft vectors] BOS PROFILE_START ctx_1..ctx_P | ITEM_START c0 c1 c2 | ... | ITEM_START
    segment 0 .....................................   segment 1           ...   segment n+1

Each history item is ``ITEM_START`` followed by its ``levels`` code tokens, in its own segment.
The prompt ends with one more ``ITEM_START`` in a new segment: the item to generate. The engine
then decodes ``levels`` code tokens, which belong to that last segment.

The S soft vectors (``profile_embeds [B, S, hidden]``) come from TF's sparse embedding tables
passed through the profile tower; they are prepended by the engine (``prefix_embeds``).

That is the version 1 prompt. A spec with ``prompt_v2`` (``xgr_common.prompt_v2``) describes
the version 2 prompt instead: a frozen long-term part first, the soft vectors at SOFT markers
after it, text spans between the parts. A spec without it is version 1, and its JSON is
exactly what it was before version 2 existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from xgr_common.errors import ConfigError, require, require_fields
from xgr_common.layout import TokenLayout
from xgr_common.prompt_v2 import VERSION as V2, PromptV2Layout

# Fields a spec's JSON holds only when set (a version 1 spec's JSON stays as it was).
_OPTIONAL = ("prompt_v2",)


@dataclass(frozen=True)
class PromptSpec:
    """How the feature graph cleans histories, hashes ids and sizes the profile tower."""

    layout: TokenLayout = field(default_factory=TokenLayout)
    window_seconds: int = 90 * 24 * 3600   # drop history events older than this
    keep_last: int = 50                    # keep at most the last N cleaned events
    context_vocab: tuple[str, ...] = ("us", "gb", "de", "fr", "jp", "br", "in", "cn")
    embedding_buckets: int = 4096          # hashed user/context ids -> rows of the TF table
    embedding_dim: int = 32                # width of the TF sparse embedding table
    tower_hidden: int = 64                 # profile tower: Dense(tower_hidden, silu)
    profile_tokens: int = 2                # S soft tokens out of the tower
    model_hidden: int = 64                 # the engine's hidden size (tower output width)
    prompt_v2: PromptV2Layout | None = None   # the version 2 prompt; None: version 1

    def __post_init__(self) -> None:
        require(self.keep_last >= 1, ConfigError, f"keep_last must be >= 1, got {self.keep_last}")
        require(self.window_seconds > 0, ConfigError,
                f"window_seconds must be > 0, got {self.window_seconds}")
        require(self.profile_tokens >= 0, ConfigError,
                f"profile_tokens must be >= 0, got {self.profile_tokens}")
        require(len(self.context_vocab) + 1 <= self.layout.profile_vocab, ConfigError,
                "context tokens do not fit between the special and the code tokens")
        require(self.prompt_v2 is None or isinstance(self.prompt_v2, PromptV2Layout),
                ConfigError, f"prompt_v2 must be a PromptV2Layout or None, got "
                             f"{type(self.prompt_v2).__name__}")

    @property
    def version(self) -> int:
        """The prompt contract's version: 2 with ``prompt_v2``, else 1."""
        return 1 if self.prompt_v2 is None else V2

    def require_version(self, version: int, where: str) -> None:
        """``ConfigError`` unless this spec's prompt is ``version``, naming ``where`` (what
        needs it) and the version the model was trained with."""
        require(self.version == version, ConfigError,
                f"{where} needs prompt version {version}; this model's card (prompt_spec) "
                f"says version {self.version}: a model is served and trained only in the "
                f"prompt version it was trained with")

    @property
    def max_history_items(self) -> int:
        """Most history items the graph keeps for one request (its ``history_values`` row, the
        history the engine excludes). Version 1: ``keep_last``. Version 2: the split's
        long-term and recent items together (``keep_last`` plays no part there)."""
        if self.prompt_v2 is not None:
            split = self.prompt_v2.split
            return split.long_term_items + split.recent_items
        return self.keep_last

    @property
    def max_prompt_tokens(self) -> int:
        """Longest token prompt the graph emits. Version 1 (soft tokens excluded): BOS,
        PROFILE_START, one context token, ``keep_last`` items of ``1 + levels`` tokens, the
        trailing ITEM_START. Version 2: its layout's longest row, SOFT markers included."""
        if self.prompt_v2 is not None:
            return self.prompt_v2.max_prompt_tokens(self.layout.levels, self.profile_tokens, 1)
        return 3 + self.keep_last * (1 + self.layout.levels) + 1

    def context_token(self, index: int) -> int:
        """Token id of context value ``index`` in ``context_vocab`` (index -1 = out of vocabulary)."""
        return self.layout.profile_base + 1 + index

    def to_dict(self) -> dict:
        """JSON-ready fields, the layout nested (``from_dict`` reads them back)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["layout"] = self.layout.to_dict()
        data["context_vocab"] = list(self.context_vocab)
        if self.prompt_v2 is None:
            del data["prompt_v2"]
        else:
            data["prompt_v2"] = self.prompt_v2.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "PromptSpec":
        """A spec from ``to_dict``'s output; ConfigError names an unknown or missing key."""
        known = {f.name for f in fields(cls)}
        present = known - {name for name in _OPTIONAL if not isinstance(data, dict)
                           or name not in data}
        require_fields(data, present, "prompt spec")
        context = data["context_vocab"]
        require(isinstance(context, list) and all(isinstance(v, str) for v in context),
                ConfigError, f"prompt spec context_vocab must be a list of strings, got "
                             f"{context!r}")
        for name in known - {"layout", "context_vocab", *_OPTIONAL}:
            value = data[name]
            require(isinstance(value, int) and not isinstance(value, bool), ConfigError,
                    f"prompt spec {name} must be an int, got {value!r}")
        extra = ({"prompt_v2": PromptV2Layout.from_dict(data["prompt_v2"])}
                 if "prompt_v2" in data else {})
        return cls(**{**data, "layout": TokenLayout.from_dict(data["layout"]),
                      "context_vocab": tuple(context), **extra})
