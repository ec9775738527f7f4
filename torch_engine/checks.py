"""The checks of ``Engine.recommend``'s arguments: shapes on the host, values on the device.

``check_arguments`` checks shapes, dtypes and sizes on the host at once (``InvalidInputError``
naming the argument and the rule). The rules on values (``xgr_common.value_rules``: lengths,
id ranges, segment order, exclusion ids, prompt length) are computed on the device as a flag
vector, with a sanitised copy the search runs on meanwhile (``search.sanitise``); a
``Verdict`` holds the flags unread until the batch's one host read, which raises for the
first rule broken, in the table's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_engine.catalog import Catalog
from xgr_common.errors import InvalidInputError, require
from xgr_common.value_rules import FLAG_INDEX, VALUE_RULES


@dataclass(frozen=True)
class Arguments:
    """``Engine.recommend``'s arguments with shapes, dtypes and sizes checked, values not yet.

    token_ids: ``[B, L]`` integer and lengths: ``[B]`` integer, where the caller put them;
    segment_ids: ``[B, L]`` int32 on the tokens' device, or None for a causal prompt;
    prefix_embeds: ``[B, S, hidden]`` on the engine's device in its dtype, or None;
    exclude_items: ``[B, X]`` int64 (X >= 1, -1 = padding) on the tokens' device, or None.
    """

    token_ids: torch.Tensor
    lengths: torch.Tensor
    segment_ids: torch.Tensor | None
    prefix_embeds: torch.Tensor | None
    exclude_items: torch.Tensor | None

    @property
    def causal(self) -> bool:
        return self.segment_ids is None

    @property
    def soft(self) -> int:
        """Soft tokens per request (S)."""
        return 0 if self.prefix_embeds is None else self.prefix_embeds.shape[1]

    @property
    def excluded(self) -> int:
        """Exclusion columns (0 for none)."""
        return 0 if self.exclude_items is None else self.exclude_items.shape[1]


@dataclass(frozen=True, eq=False)
class ArgumentLimits:
    """What ``check_arguments`` checks against: the catalog (top_k's bound,
    ``Catalog.reachable_items``), the model's hidden size, ``EngineConfig``'s beam and
    exclusion limits, and where soft tokens go (the model's device and dtype)."""

    catalog: Catalog
    hidden_size: int
    max_beam_width: int
    max_exclude: int
    device: torch.device
    dtype: torch.dtype


def check_arguments(limits: ArgumentLimits, token_ids, lengths, segment_ids, beam_width,
                    top_k, prefix_embeds, exclude_items) -> Arguments:
    """Shapes, dtypes and sizes of ``Engine.recommend``'s arguments (``InvalidInputError``
    naming the argument and the rule); host work only, no device launch for the usual
    arguments (an exclusion list is padded into a table on the tokens' device)."""
    catalog = limits.catalog
    tokens = _int_tensor("token_ids", token_ids, 2)
    batch, width = tokens.shape
    require(batch >= 1 and width >= 1, InvalidInputError,
            f"token_ids must hold at least one request and one token, got {tuple(tokens.shape)}")
    lens = _int_tensor("lengths", lengths, 1)
    require(lens.shape[0] == batch, InvalidInputError,
            f"lengths must have shape [{batch}] (one per row of token_ids), got "
            f"{tuple(lens.shape)}")
    require(isinstance(beam_width, int) and 1 <= beam_width <= limits.max_beam_width,
            InvalidInputError, f"beam_width must be an int in [1, EngineConfig.max_beam_width="
            f"{limits.max_beam_width}], got {beam_width!r}")
    reachable = catalog.reachable_items(beam_width)
    require(isinstance(top_k, int) and 1 <= top_k <= reachable, InvalidInputError,
            f"top_k must be an int in [1, {reachable}] (catalog of {catalog.num_items} items, "
            f"beam_width {beam_width} x at most {catalog.max_items_per_path} items per path), "
            f"got {top_k!r}")
    # Checked where the tokens are (the CPU: no device wait; CUDA: one read, later).
    home = tokens.device
    segments = _segments(segment_ids, (batch, width), home)
    if prefix_embeds is not None:
        require(isinstance(prefix_embeds, torch.Tensor) and prefix_embeds.is_floating_point(),
                InvalidInputError, "prefix_embeds must be a floating-point torch.Tensor")
        require(prefix_embeds.dim() == 3 and prefix_embeds.shape[0] == batch
                and prefix_embeds.shape[2] == limits.hidden_size, InvalidInputError,
                f"prefix_embeds must have shape [{batch}, S, {limits.hidden_size}], got "
                f"{tuple(prefix_embeds.shape)}")
        prefix_embeds = prefix_embeds.to(device=limits.device, dtype=limits.dtype)
    exclude = _exclusions(exclude_items, batch, limits.max_exclude, home)
    return Arguments(tokens, lens.to(device=home), segments, prefix_embeds, exclude)


def _int_tensor(name: str, value, dims: int) -> torch.Tensor:
    require(isinstance(value, torch.Tensor), InvalidInputError,
            f"{name} must be a torch.Tensor, got {type(value).__name__}")
    require(not value.is_floating_point() and not value.is_complex()
            and value.dtype != torch.bool, InvalidInputError,
            f"{name} must have an integer dtype, got {value.dtype}")
    require(value.dim() == dims, InvalidInputError,
            f"{name} must be {dims}-D, got shape {tuple(value.shape)}")
    return value


def _exclusions(exclude_items, batch: int, limit: int, device: torch.device
                ) -> torch.Tensor | None:
    """``[B, X]`` int64 (X >= 1) on ``device`` from a padded tensor or a list of 1-D tensors, or
    None (no exclusions: None, or no column); shapes checked here, values (ids >= -1) by the
    value rules (``Verdict``)."""
    if exclude_items is None:
        return None
    if isinstance(exclude_items, (list, tuple)):
        require(len(exclude_items) == batch, InvalidInputError,
                f"exclude_items list must hold one tensor per request ({batch}), got "
                f"{len(exclude_items)}")
        rows = [_int_tensor(f"exclude_items[{i}]", row, 1)
                for i, row in enumerate(exclude_items)]
        widest = max([row.shape[0] for row in rows] + [1])
        padded = torch.full((batch, widest), -1, dtype=torch.int64, device=device)
        for i, row in enumerate(rows):
            padded[i, :row.shape[0]] = row          # a device copy, no host read
        exclude_items = padded
    table = _int_tensor("exclude_items", exclude_items, 2)
    require(table.shape[0] == batch, InvalidInputError,
            f"exclude_items must have {batch} rows, got shape {tuple(table.shape)}")
    require(table.shape[1] <= limit, InvalidInputError,
            f"exclude_items rows may hold at most EngineConfig.max_exclude={limit} ids, got "
            f"{table.shape[1]}")
    if table.shape[1] == 0:
        return None
    return table.to(device=device, dtype=torch.int64)


def _segments(segment_ids, shape: tuple[int, int], device: torch.device
              ) -> torch.Tensor | None:
    """``[B, L]`` int32 on ``device``, or None for a causal prompt (the rules write its zero
    segment ids)."""
    if segment_ids is None:
        return None
    segments = _int_tensor("segment_ids", segment_ids, 2)
    require(tuple(segments.shape) == shape, InvalidInputError,
            f"segment_ids must have the shape of token_ids {shape}, got "
            f"{tuple(segments.shape)}")
    return segments.to(device=device, dtype=torch.int32)


@dataclass(frozen=True)
class Verdict:
    """The value rules of one batch, computed on the device and not yet read.

    flags: ``[FLAG_COUNT]`` int64 on the inputs' device, one entry per rule of
    ``xgr_common.value_rules.VALUE_RULES`` in its order (non-zero when a row breaks an
    ``any`` rule; the longest length for ``positions``). The other fields only build messages
    (read only when raising): tokens ``[B, L]`` and lengths ``[B]`` as given (integer dtypes,
    on the flags' device), the vocabulary, soft tokens per request, code levels and the
    model's max_position.
    """

    flags: torch.Tensor
    tokens: torch.Tensor
    lengths: torch.Tensor
    vocab_size: int
    prefix: int
    levels: int
    max_position: int

    @classmethod
    def of(cls, args: Arguments, flags: torch.Tensor, vocab_size: int, levels: int,
           max_position: int) -> "Verdict":
        """The verdict of ``args`` whose rules computed ``flags``."""
        return cls(flags, args.token_ids, args.lengths, vocab_size, args.soft, levels,
                   max_position)

    def raise_if_invalid(self) -> None:
        """One host read of the flags; ``InvalidInputError`` for the first rule broken, in
        ``VALUE_RULES`` order, its message the rule's text and the values that break it."""
        values = self.flags.tolist()
        for rule in VALUE_RULES:
            detail = self._broken(rule.name, values[FLAG_INDEX[rule.name]])
            if detail is not None:
                raise InvalidInputError(rule.text + detail)

    def _broken(self, name: str, value: int) -> str | None:
        """None when rule ``name`` holds, else what its message adds to the rule's text
        (messages that show values are built only when raising)."""
        if name == "positions":
            positions = value + self.prefix + self.levels - 1
            if positions <= self.max_position:
                return None
            return f"; got {positions} positions, max_position {self.max_position}"
        if not value:
            return None
        if name == "lengths_positive":
            return f", got {self.lengths.tolist()}"
        if name == "lengths_fit":
            return f" = {self.tokens.shape[1]}, got {self.lengths.tolist()}"
        if name == "token_range":
            bad = self.bad_tokens()
            return (f" (vocab_size={self.vocab_size}); {int(bad.sum())} do not, e.g. "
                    f"{self.tokens[bad][:3].tolist()}")
        return ""

    def bad_tokens(self) -> torch.Tensor:
        """``[B, L]`` bool: the token ids out of range within their request's length (built
        only for the message, so the fast path never writes a mask)."""
        width = self.tokens.shape[1]
        valid = (torch.arange(width, device=self.tokens.device)[None, :]
                 < self.lengths[:, None])
        return valid & ((self.tokens < 0) | (self.tokens >= self.vocab_size))
