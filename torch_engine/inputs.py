"""Checking and normalising ``Engine.recommend``'s arguments.

Shapes, dtypes and sizes are checked on the host at once. The rules on values (lengths, id
ranges, segment order, exclusion ids, prompt length) are computed on the device as a few flags
(``Verdict``) and read in one transfer, which on CUDA is a device synchronisation:
``check_inputs`` reads them at once; ``Engine.recommend`` reads them after the search, so a
batch costs one synchronisation, at the end. Until then the search runs on a sanitised copy
(ids out of range set to 0, lengths clamped, segments made non-decreasing), so an invalid
request can never index out of bounds; its results are dropped and ``InvalidInputError``
names the argument and the rule.

The flags and the sanitised copy are one function (``torch_engine.reference.input_rules``):
on CUDA one Triton launch (``torch_engine.kernels.input_rules``) instead of about 30 small
torch launches, plain torch ops elsewhere or without Triton.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from xgr_common.errors import InvalidInputError, require
from xgr_common.import_order import triton_importable
from torch_engine.reference.input_rules import input_rules as reference_input_rules

if TYPE_CHECKING:
    from torch_engine.engine import Engine


@dataclass(frozen=True)
class RequestBatch:
    """Checked inputs on the engine's device.

    token_ids: ``[B, L]`` int64 (padding slots set to 0); total_lengths: ``[B]`` int64 = S +
    lengths; segment_ids: ``[B, L]`` int32 (zeros when ``causal``); prefix_embeds:
    ``[B, S, hidden]`` in the model dtype or None; exclude_items: ``[B, X]`` int64, X >= 1,
    -1 = padding.
    """

    token_ids: torch.Tensor
    total_lengths: torch.Tensor
    segment_ids: torch.Tensor
    causal: bool
    prefix_embeds: torch.Tensor | None
    exclude_items: torch.Tensor


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
    input rules (``Verdict``)."""
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

    flags: ``[6]`` int64 on the inputs' device: lengths < 1, lengths > width, token ids out
    of range, segments bad, exclusion ids bad, longest length. The other fields only build
    messages (read only when raising): tokens ``[B, L]`` and lengths ``[B]`` as given
    (integer dtypes, on the flags' device).
    """

    flags: torch.Tensor
    tokens: torch.Tensor
    lengths: torch.Tensor
    vocab_size: int
    prefix: int
    levels: int
    max_position: int

    def raise_if_invalid(self) -> None:
        """One host read of the flags; ``InvalidInputError`` for the first rule broken, in
        the order the rules are documented (lengths, tokens, segments, exclusions, prompt
        length)."""
        short, long, tokens_bad, segments_bad, exclude_bad, longest = self.flags.tolist()
        width = self.tokens.shape[1]
        # Messages that show values are built only when raising.
        if short:
            raise InvalidInputError(f"lengths must be >= 1 (empty history), got "
                                    f"{self.lengths.tolist()}")
        if long:
            raise InvalidInputError(f"lengths must be <= token_ids.shape[1] = {width}, got "
                                    f"{self.lengths.tolist()}")
        if tokens_bad:
            bad = self.bad_tokens()
            raise InvalidInputError(
                f"token_ids must lie in [0, vocab_size={self.vocab_size}) within each length; "
                f"{int(bad.sum())} do not, e.g. {self.tokens[bad][:3].tolist()}")
        require(not segments_bad, InvalidInputError, "segment_ids must be >= 0 and "
                "non-decreasing along each row within its length")
        require(not exclude_bad, InvalidInputError,
                "exclude_items must hold item ids >= 0 or -1 as padding")
        positions = longest + self.prefix + self.levels - 1
        require(positions <= self.max_position, InvalidInputError,
                f"prompt plus generated codes ({positions} positions) exceed the model's "
                f"max_position {self.max_position}")

    def bad_tokens(self) -> torch.Tensor:
        """``[B, L]`` bool: the token ids out of range within their request's length (built
        only for the message, so the fast path never writes a mask)."""
        width = self.tokens.shape[1]
        valid = (torch.arange(width, device=self.tokens.device)[None, :]
                 < self.lengths[:, None])
        return valid & ((self.tokens < 0) | (self.tokens >= self.vocab_size))


def input_rules_for(device: torch.device):
    """The function computing the flags and the sanitised copy on ``device`` (signature of
    ``torch_engine.reference.input_rules``): on CUDA the one-launch Triton kernel, unless
    Triton cannot be imported (not installed, or TensorFlow loaded first: see
    ``import_order``); plain torch ops elsewhere."""
    if device.type == "cuda" and triton_importable():
        try:
            from torch_engine.kernels.input_rules import input_rules
        except ImportError:
            return reference_input_rules
        return input_rules
    return reference_input_rules


def check_inputs(engine: "Engine", token_ids, lengths, segment_ids, beam_width, top_k,
                 prefix_embeds, exclude_items) -> RequestBatch:
    """Validate ``Engine.recommend``'s arguments and move them to the engine's device:
    ``prepare_inputs`` and its verdict read at once (one read; on CUDA one synchronisation)."""
    batch, verdict = prepare_inputs(engine, token_ids, lengths, segment_ids, beam_width, top_k,
                                    prefix_embeds, exclude_items)
    verdict.raise_if_invalid()
    return batch


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


def check_arguments(engine: "Engine", token_ids, lengths, segment_ids, beam_width, top_k,
                    prefix_embeds, exclude_items) -> Arguments:
    """Shapes, dtypes and sizes of ``Engine.recommend``'s arguments (``InvalidInputError``
    naming the argument and the rule); host work only, no device launch for the usual
    arguments (an exclusion list is padded into a table on the tokens' device)."""
    cfg, catalog = engine.model.config, engine.catalog
    tokens = _int_tensor("token_ids", token_ids, 2)
    batch, width = tokens.shape
    require(batch >= 1 and width >= 1, InvalidInputError,
            f"token_ids must hold at least one request and one token, got {tuple(tokens.shape)}")
    lens = _int_tensor("lengths", lengths, 1)
    require(lens.shape[0] == batch, InvalidInputError,
            f"lengths must have shape [{batch}] (one per row of token_ids), got "
            f"{tuple(lens.shape)}")
    require(isinstance(beam_width, int) and 1 <= beam_width <= engine.config.max_beam_width,
            InvalidInputError, f"beam_width must be an int in [1, EngineConfig.max_beam_width="
            f"{engine.config.max_beam_width}], got {beam_width!r}")
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
                and prefix_embeds.shape[2] == cfg.hidden_size, InvalidInputError,
                f"prefix_embeds must have shape [{batch}, S, {cfg.hidden_size}], got "
                f"{tuple(prefix_embeds.shape)}")
        prefix_embeds = prefix_embeds.to(device=engine.device, dtype=engine.dtype)
    exclude = _exclusions(exclude_items, batch, engine.config.max_exclude, home)
    return Arguments(tokens, lens.to(device=home), segments, prefix_embeds, exclude)


def apply_rules(engine: "Engine", args: Arguments) -> tuple[RequestBatch, Verdict]:
    """The value rules of checked arguments, computed where the tokens are into a ``Verdict``
    the caller reads later, and the sanitised batch on the engine's device, safe to search
    whatever the verdict (see the module's docstring)."""
    cfg, tokens = engine.model.config, args.token_ids
    exclude = args.exclude_items
    if exclude is None:
        exclude = torch.full((tokens.shape[0], 1), -1, dtype=torch.int64, device=tokens.device)
    # Contiguous rows for the kernel (a no-op for the usual inputs).
    flags, clean_tokens, total_lengths, clean_segments, exclude = input_rules_for(
        tokens.device)(tokens.contiguous(), args.lengths.contiguous(),
                       None if args.causal else args.segment_ids.contiguous(),
                       exclude.contiguous(), cfg.vocab_size, args.soft, args.causal)
    # The search runs on the sanitised copy until the verdict is read.
    device = engine.device
    return RequestBatch(
        token_ids=clean_tokens.to(device),
        total_lengths=total_lengths.to(device),
        segment_ids=clean_segments.to(device),
        causal=args.causal,
        prefix_embeds=args.prefix_embeds,
        exclude_items=exclude.to(device),
    ), verdict_of(engine, args, flags)


def verdict_of(engine: "Engine", args: Arguments, flags: torch.Tensor) -> Verdict:
    """The ``Verdict`` of ``args`` whose rules computed ``flags``."""
    return Verdict(flags, args.token_ids, args.lengths, engine.model.config.vocab_size,
                   args.soft, engine.catalog.levels, engine.model.config.max_position)


def prepare_inputs(engine: "Engine", token_ids, lengths, segment_ids, beam_width, top_k,
                   prefix_embeds, exclude_items) -> tuple[RequestBatch, Verdict]:
    """``check_arguments`` then ``apply_rules``: shapes, dtypes and sizes checked now
    (``InvalidInputError``); the value rules computed where ``token_ids`` lives into a
    ``Verdict`` the caller reads later, and a sanitised batch on the engine's device. Inputs on
    the CPU are checked there, then copied to the engine's device."""
    return apply_rules(engine, check_arguments(engine, token_ids, lengths, segment_ids,
                                               beam_width, top_k, prefix_embeds,
                                               exclude_items))

