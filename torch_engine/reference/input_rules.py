"""Plain-torch reference of the value rules and the sanitised copy of ``Engine.recommend``'s
inputs (``torch_engine.kernels.input_rules`` computes the same, bit for bit, in one launch).

For request b with length ``n = lengths[b]`` over a row of width L:

    flags = [any(n < 1), any(n > L),
             any token id outside [0, vocab_size) within the length,
             any segment id < 0 within the length, or smaller than its left neighbour where
             that slot is within the length (0 when causal),
             any exclusion id < -1,
             max(n)]                                                        [6] int64
    kept           = clamp(n, 1, L)
    tokens_out     = token id where slot < kept and 0 <= id < vocab_size, else 0  [B, L] int64
    total_lengths  = kept + prefix                                          [B] int64
    segments_out   = cummax(clamp(segments, min=0)) along the whole row (zeros when causal)
                                                                            [B, L] int32

The search runs on the sanitised copy whatever the flags say, so it never indexes out of
bounds; ``inputs.Verdict`` reads the flags once and raises for the first rule broken.
Device ops only: no value reaches the host.
"""

from __future__ import annotations

import torch


def input_rules(tokens: torch.Tensor, lengths: torch.Tensor, segments: torch.Tensor | None,
                exclude: torch.Tensor, vocab_size: int, prefix: int, causal: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens: ``[B, L]`` integer; lengths: ``[B]`` integer; segments: ``[B, L]`` int32, or
    None when ``causal`` (ignored then); exclude: ``[B, X]`` integer (-1 = padding).
    Returns (flags ``[6]`` int64, tokens_out ``[B, L]`` int64, total_lengths ``[B]`` int64,
    segments_out ``[B, L]`` int32), all on the tokens' device."""
    tokens = tokens.to(torch.int64)
    lens = lengths.to(device=tokens.device, dtype=torch.int64)
    batch, width = tokens.shape
    slots = torch.arange(width, device=tokens.device)[None, :]
    valid = slots < lens[:, None]
    in_range = (tokens >= 0) & (tokens < vocab_size)
    flags = [(lens < 1).any(), (lens > width).any(), (valid & ~in_range).any()]
    if causal:
        flags.append(torch.zeros((), dtype=torch.bool, device=tokens.device))
        segments_out = torch.zeros((batch, width), dtype=torch.int32, device=tokens.device)
    else:
        falls = valid[:, 1:] & (segments[:, 1:] < segments[:, :-1])
        flags.append(((segments < 0) & valid).any() | falls.any())
        segments_out = torch.cummax(segments.clamp(min=0), dim=1).values
    flags.append((exclude < -1).any())
    flags = torch.stack([*(flag.to(torch.int64) for flag in flags), lens.max()])
    kept = lens.clamp(1, width)
    tokens_out = torch.where((slots < kept[:, None]) & in_range, tokens, 0)
    return flags, tokens_out, kept + prefix, segments_out
