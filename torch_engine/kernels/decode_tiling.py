"""The decode kernel's tiling, chosen from shapes alone (no device read, so a CUDA graph or a
traced program captures the choice): rows and keys of a program's tile, and whether and how
far the prompt is split across programs (split-K) when the row tiles alone leave
multiprocessors idle; plus how many merge counters a split launch uses. The launches are in
``decode_attention`` (contiguous prompt) and ``paged_attention`` (cached pages first)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from torch_engine.kernels import _common as c


@dataclass(frozen=True)
class DecodeConfig:
    """Tiling of one decode launch: rows of the (beam x group) tile, keys per step, splits."""

    block_m: int
    block_n: int
    splits: int
    num_warps: int = 4
    num_stages: int = 3
    # With splits > 1: merge in the split program that finishes last (an atomic counter per
    # row tile) instead of a second launch.
    fused_merge: bool = False
    # P V accumulated into the accumulator's registers, or added to it after the product.
    acc_in_dot: bool = True
    # Whole prompt key tiles loaded through tensor-memory-access descriptors (Hopper's TMA).
    tma: bool = False
    # Registers per thread at most (``_common.register_cap``); None: the compiler's choice.
    maxnreg: int | None = None
    # Pipeline depth of the cached-page loop (paged launches); None:
    # ``_online_softmax.page_stages``' rule.
    page_stages: int | None = None


@dataclass(frozen=True)
class DecodeTile:
    """Rows, keys per step, warps, pipeline stages, P V accumulation and key loads (TMA or
    pointers) of one program; for a split tile, ``per_sm``: the programs per multiprocessor
    that the split rule (``split_count``) fills before it counts another wave."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    acc_in_dot: bool = True
    tma: bool = False
    per_sm: int = 2


# Head dim -> (tile when the row tiles alone fill the GPU, tile when the prompt is split).
# From the tile sweeps (``docs/performance.md``): 64-row tiles x 4 warps for both head dims,
# at large batches and at batch 1. ``per_sm`` of the split tiles is how many programs fit a
# multiprocessor in an sm_90 compile: d64 with the merge code is bound by its registers per
# thread, d128 by its shared memory. The batch-1 split sweep slows past exactly these counts.
DECODE_TILES = {
    64: (DecodeTile(64, 64, 4, 3, acc_in_dot=False),
         DecodeTile(64, 64, 4, 3, acc_in_dot=False, per_sm=3)),
    128: (DecodeTile(64, 64, 4, 3, tma=True), DecodeTile(64, 64, 4, 3, per_sm=2)),
}
_INTERPRETER_TILE = DecodeTile(16, 16, 4, 1)
# Cost model of a split prompt, in key-tile steps of one program: a program's fixed work
# (prologue, own stage, epilogue) and what each split adds to the merge (the last program
# reads every split's partial rows). Fitted to the batch-1 split sweep: close to the best
# forced split count on every shape swept, where a rule without the merge term lost badly on
# some.
_FIXED_STEPS = 2.0
_MERGE_STEPS_PER_SPLIT = 1.0


def split_count(tiles: int, mean_len: int, tile: DecodeTile, sms: int) -> int:
    """Splits of each prompt (1..16) with the least estimated time: every wave of resident
    programs (``tile.per_sm`` per multiprocessor) lasts as long as one program, i.e. its chunk's
    key tiles plus the fixed steps, and each split adds merge steps. Chunks are whole key tiles
    and never shorter than two of them; counts that the rounding leaves equal collapse."""
    slots = max(1, tile.per_sm * sms)
    most = max(1, min(16, mean_len // (2 * tile.block_n)))
    best_cost, best = None, 1
    for wanted in range(1, most + 1):
        chunk_tiles = triton.cdiv(triton.cdiv(mean_len, wanted), tile.block_n)
        splits = triton.cdiv(mean_len, chunk_tiles * tile.block_n)
        waves = triton.cdiv(tiles * splits, slots)
        cost = waves * (chunk_tiles + _FIXED_STEPS)
        if splits > 1:
            cost += _MERGE_STEPS_PER_SPLIT * splits
        if best_cost is None or cost < best_cost:
            best_cost, best = cost, splits
    return best


def decode_config_for(batch: int, width: int, group: int, num_kv_heads: int, total_tokens: int,
                      head_dim: int, device: torch.device) -> DecodeConfig:
    """Tile choice from shapes alone (no device read, so CUDA-graph capturable).

    Splits the prompt only when ``B * Hkv * row_tiles`` programs leave SMs idle, into the
    count ``split_count`` estimates fastest for the mean prompt length ``T / B``; split
    partials merge in the split that finishes last (one launch).
    """
    rows = width * group
    sms = c.multiprocessors(device)
    if c.interpreting():
        full = split_tile = _INTERPRETER_TILE
    else:
        full, split_tile = DECODE_TILES.get(head_dim, DECODE_TILES[128])
    if batch * num_kv_heads * triton.cdiv(rows, full.block_m) >= sms:
        tile, splits = full, 1
    else:
        tile = split_tile
        tiles = batch * num_kv_heads * triton.cdiv(rows, tile.block_m)
        splits = split_count(tiles, max(1, total_tokens // max(batch, 1)), tile, sms)
    return DecodeConfig(block_m=tile.block_m, block_n=tile.block_n, splits=splits,
                        num_warps=tile.num_warps, num_stages=tile.num_stages,
                        fused_merge=splits > 1, acc_in_dot=tile.acc_in_dot, tma=tile.tma)


# Head dims whose paged decode loads its whole key tiles (cached pages and suffix) through
# TMA: with the page loop pipelined two tiles ahead, TMA brought the d128 paged decode to the
# contiguous decode's speed where pointer loads stayed behind; at d64 the two tied
# (``experiments/probe_paged_prefill_tilings``).
PAGED_TMA_HEAD_DIMS = frozenset({128})


def paged_config_for(batch: int, width: int, group: int, num_kv_heads: int,
                     total_tokens: int, head_dim: int, device: torch.device) -> DecodeConfig:
    """``decode_config_for`` for the paged decode (``total_tokens``: the keys a request may
    read, ``paged_attention.decode_keys``), its key tiles through TMA at the head dims of
    ``PAGED_TMA_HEAD_DIMS``."""
    config = decode_config_for(batch, width, group, num_kv_heads, total_tokens, head_dim,
                               device)
    if head_dim in PAGED_TMA_HEAD_DIMS and not c.interpreting():
        config = replace(config, tma=True)
    return config


def own_beams(block_m: int, group: int) -> int:
    """Power-of-two bound (>= 16, the smallest dot) on the beams that block_m consecutive
    rows of the (beam, group) tile touch: block_m / group when tiles align with beams."""
    span = block_m // group if block_m % group == 0 else -(-(block_m - 1) // group) + 1
    return max(16, triton.next_power_of_2(span))


def merge_counters(batch: int, width: int, num_heads: int, num_kv_heads: int,
                   total_tokens: int, head_dim: int, device: torch.device) -> int:
    """How many split counters a launch of this shape uses (0: its prompt is not split).

    The launch leaves each counter at zero, so launches of one shape in stream order (the
    layers and decode steps of a search) can share one zeroed ``counters`` buffer: one fill a
    search instead of one per launch."""
    group = num_heads // num_kv_heads
    config = decode_config_for(batch, width, group, num_kv_heads, total_tokens, head_dim, device)
    if not (config.fused_merge and config.splits > 1):
        return 0
    return triton.cdiv(width * group, config.block_m) * batch * num_kv_heads
