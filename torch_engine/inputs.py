"""Checking and normalising ``Engine.recommend``'s arguments (host side, reads values).

Kept apart from the device search so the search stays free of host synchronisation: every
rule that needs a value (lengths, id ranges, segment order) is enforced here, once, and raises
``InvalidInputError`` naming the argument and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from torch_engine.errors import InvalidInputError, require

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


def _exclusions(exclude_items, batch: int, limit: int, device: torch.device) -> torch.Tensor:
    """``[B, X]`` int64 (X >= 1) from None, a padded tensor or a list of 1-D tensors."""
    if exclude_items is None:
        return torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    if isinstance(exclude_items, (list, tuple)):
        require(len(exclude_items) == batch, InvalidInputError,
                f"exclude_items list must hold one tensor per request ({batch}), got "
                f"{len(exclude_items)}")
        rows = [_int_tensor(f"exclude_items[{i}]", row, 1).to(torch.int64)
                for i, row in enumerate(exclude_items)]
        widest = max([row.shape[0] for row in rows] + [1])
        padded = torch.full((batch, widest), -1, dtype=torch.int64)
        for i, row in enumerate(rows):
            padded[i, :row.shape[0]] = row.cpu()
        exclude_items = padded
    table = _int_tensor("exclude_items", exclude_items, 2)
    require(table.shape[0] == batch, InvalidInputError,
            f"exclude_items must have {batch} rows, got shape {tuple(table.shape)}")
    require(table.shape[1] <= limit, InvalidInputError,
            f"exclude_items rows may hold at most EngineConfig.max_exclude={limit} ids, got "
            f"{table.shape[1]}")
    require(bool((table >= -1).all()), InvalidInputError,
            "exclude_items must hold item ids >= 0 or -1 as padding")
    table = table.to(device=device, dtype=torch.int64)
    if table.shape[1] == 0:
        table = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return table


def check_inputs(engine: "Engine", token_ids, lengths, segment_ids, beam_width, top_k,
                 prefix_embeds, exclude_items) -> RequestBatch:
    """Validate ``Engine.recommend``'s arguments and move them to the engine's device."""
    cfg, catalog = engine.model.config, engine.catalog
    tokens = _int_tensor("token_ids", token_ids, 2)
    batch, width = tokens.shape
    require(batch >= 1 and width >= 1, InvalidInputError,
            f"token_ids must hold at least one request and one token, got {tuple(tokens.shape)}")
    lens = _int_tensor("lengths", lengths, 1)
    require(lens.shape[0] == batch, InvalidInputError,
            f"lengths must have shape [{batch}] (one per row of token_ids), got "
            f"{tuple(lens.shape)}")
    lens = lens.to(torch.int64).cpu()
    require(bool((lens >= 1).all()), InvalidInputError,
            f"lengths must be >= 1 (empty history), got {lens.tolist()}")
    require(bool((lens <= width).all()), InvalidInputError,
            f"lengths must be <= token_ids.shape[1] = {width}, got {lens.tolist()}")
    valid = torch.arange(width)[None, :] < lens[:, None]
    host_tokens = tokens.to(torch.int64).cpu()
    bad = valid & ((host_tokens < 0) | (host_tokens >= cfg.vocab_size))
    require(not bool(bad.any()), InvalidInputError,
            f"token_ids must lie in [0, vocab_size={cfg.vocab_size}) within each length; "
            f"{int(bad.sum())} do not, e.g. {host_tokens[bad][:3].tolist()}")
    require(isinstance(beam_width, int) and 1 <= beam_width <= engine.config.max_beam_width,
            InvalidInputError, f"beam_width must be an int in [1, EngineConfig.max_beam_width="
            f"{engine.config.max_beam_width}], got {beam_width!r}")
    reachable = min(catalog.num_items, beam_width * catalog.max_items_per_path)
    require(isinstance(top_k, int) and 1 <= top_k <= reachable, InvalidInputError,
            f"top_k must be an int in [1, {reachable}] (catalog of {catalog.num_items} items, "
            f"beam_width {beam_width} x at most {catalog.max_items_per_path} items per path), "
            f"got {top_k!r}")
    causal = segment_ids is None
    if causal:
        segments = torch.zeros((batch, width), dtype=torch.int32)
    else:
        segments = _int_tensor("segment_ids", segment_ids, 2)
        require(tuple(segments.shape) == (batch, width), InvalidInputError,
                f"segment_ids must have the shape of token_ids {(batch, width)}, got "
                f"{tuple(segments.shape)}")
        segments = segments.to(torch.int32).cpu()
        step = segments[:, 1:] - segments[:, :-1]
        require(bool((segments[valid] >= 0).all()) and not bool((valid[:, 1:] & (step < 0)).any()),
                InvalidInputError, "segment_ids must be >= 0 and non-decreasing along each "
                "row within its length")
    prefix = 0
    if prefix_embeds is not None:
        require(isinstance(prefix_embeds, torch.Tensor) and prefix_embeds.is_floating_point(),
                InvalidInputError, "prefix_embeds must be a floating-point torch.Tensor")
        require(prefix_embeds.dim() == 3 and prefix_embeds.shape[0] == batch
                and prefix_embeds.shape[2] == cfg.hidden_size, InvalidInputError,
                f"prefix_embeds must have shape [{batch}, S, {cfg.hidden_size}], got "
                f"{tuple(prefix_embeds.shape)}")
        prefix = prefix_embeds.shape[1]
        prefix_embeds = prefix_embeds.to(device=engine.device, dtype=engine.dtype)
    longest = prefix + int(lens.max()) + catalog.levels - 1
    require(longest <= cfg.max_position, InvalidInputError,
            f"prompt plus generated codes ({longest} positions) exceed the model's "
            f"max_position {cfg.max_position}")
    device = engine.device
    return RequestBatch(
        token_ids=torch.where(valid, host_tokens, 0).to(device),
        total_lengths=(lens + prefix).to(device),
        segment_ids=segments.to(device),
        causal=causal,
        prefix_embeds=prefix_embeds,
        exclude_items=_exclusions(exclude_items, batch, engine.config.max_exclude, device),
    )


def bucket_size(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def next_power_of_two(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


def pad_to_buckets(batch: RequestBatch, length_multiple: int, pow2_batch: bool
                   ) -> RequestBatch:
    """Pad a checked batch so that batches of nearby shapes share one shape (one captured
    graph): the prompt width ``S + L`` up to a multiple of ``length_multiple`` (right
    padding, never attended), the rows up to the next power of two when ``pow2_batch``
    (one-token requests whose results the caller drops; see ``Engine.recommend``) and the
    exclusion width up to a power of two (-1 padding). Device ops only, no host wait.
    """
    rows, width = batch.token_ids.shape
    soft = 0 if batch.prefix_embeds is None else batch.prefix_embeds.shape[1]
    extra_cols = bucket_size(soft + width, length_multiple) - soft - width
    extra_rows = (next_power_of_two(rows) if pow2_batch else rows) - rows
    exclude = batch.exclude_items
    extra_excl = next_power_of_two(exclude.shape[1]) - exclude.shape[1]
    if not (extra_cols or extra_rows or extra_excl):
        return batch
    pad = torch.nn.functional.pad
    prefix = batch.prefix_embeds
    if prefix is not None:
        prefix = pad(prefix, (0, 0, 0, 0, 0, extra_rows))
    # Padding rows: one token (id 0) in segment 0, no exclusions.
    lengths = pad(batch.total_lengths, (0, extra_rows), value=soft + 1)
    return RequestBatch(
        token_ids=pad(batch.token_ids, (0, extra_cols, 0, extra_rows)),
        total_lengths=lengths,
        segment_ids=pad(batch.segment_ids, (0, extra_cols, 0, extra_rows)),
        causal=batch.causal,
        prefix_embeds=prefix,
        exclude_items=pad(exclude, (0, extra_excl, 0, extra_rows), value=-1),
    )
