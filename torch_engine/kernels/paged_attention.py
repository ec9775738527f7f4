"""Attention over cached pages in Triton: a prompt suffix's prefill and one decode step when
the prompt's first tokens come from the prompt cache (``torch_engine.prompt_cache``).

Same functions as ``torch_engine.reference.paged_attention``. Cached tokens live in a paged
pool ``[pages, page_tokens, Hkv, D]``; request b's are the first ``cached_lens[b]`` tokens of
its pages ``block_table[b, :]``. Key tiles load the pages in place (no contiguous copy of the
cached part): a tile inside one page (the page holds whole tiles) with one page index and,
when the launcher made descriptors, through TMA; a tile wider than a page with one page index
a row:

* prefill: one program per (request, ``BLOCK_M`` suffix queries, query head), or (a tiling
  the launcher can be given, ``PagedPrefillConfig.heads``) per (request, ``BLOCK_M``
  queries, KV head) with the group's query heads stacked as rows, so a key tile is loaded
  once for the group; the last row tiles (the most keys) launch first. One
  FlashAttention-2 online softmax (``_online_softmax``) over the cached tiles (every cached
  key is visible: whole tiles run without a mask), then over the request's packed suffix
  under the mask rule, derived from positions and segment ids (causal: ``k <= q``;
  item-causal: or the same segment). Suffix tiles before the tile's first query are visible
  to all its queries and run unmasked; tiles that no query may see are skipped: under the
  causal rule the loop ends at the tile's last query; under item-causal a tile past it runs
  only when it starts inside the last query's segment.
* decode: the xAttention kernel of ``decode_attention`` in its paged mode: the cached tokens
  and the suffix form one key sequence, split across programs when the row tiles alone
  cannot fill the GPU, then each beam's own slots, merged by log-sum-exp.

The launchers validate every shape, dtype, stride and device before a launch.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from torch.library import triton_op, wrap_triton

from torch_engine.kernels import _common as c
from torch_engine.kernels._online_softmax import (attend_cached_pages, online_softmax_step,
                                                   page_stages, score_key_tile)
from torch_engine.kernels.decode_attention import PagedPrefix, launch_decode
from torch_engine.kernels.decode_tiling import paged_config_for
from xgr_common.errors import InvalidInputError, require
from xgr_common.layout import MaskMode

_LOG2E = 1.4426950408889634
MODES = {MaskMode.CAUSAL: 0, MaskMode.ITEM_CAUSAL: 3}


@triton.jit
def _paged_prefill_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, cu_ptr, len_ptr, seg_ptr, cached_ptr, table_ptr,
        pk_ptr, pv_ptr, kd, vd, pkd, pvd,
        s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_tb,
        s_pkp, s_pkt, s_pkh, s_pvp, s_pvt, s_pvh,
        m_tiles, batch, lanes, group, qk_scale,
        MODE: tl.constexpr, SEQ_LENS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr, ACC_IN_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
        SUFFIX_TMA: tl.constexpr, PAGE_TMA: tl.constexpr, PAGE_STAGES: tl.constexpr):
    qk_scale = tl.cast(qk_scale, tl.float32)
    # One program per (row tile, request, head lane), the row tiles last first: under the
    # mask rules a later tile walks more keys, so the longest programs start first and the
    # short ones fill the tail (a long suffix otherwise ends on its last tiles alone).
    pid = tl.program_id(0)
    lane = pid % lanes
    b = (pid // lanes) % batch
    q0 = (m_tiles - 1 - pid // (lanes * batch)) * BLOCK_M
    start = tl.load(cu_ptr + b).to(tl.int32)
    if SEQ_LENS:
        length = tl.load(len_ptr + b).to(tl.int32)
    else:
        length = tl.load(cu_ptr + b + 1).to(tl.int32) - start
    if q0 >= length:
        return
    # Rows: BLOCK_M tokens x HEADS query heads, token-major. HEADS == 1: the lane is the
    # query head. HEADS > 1: the lane is the KV head and the rows hold its whole group
    # (padded to HEADS), so each key tile is loaded once for the group, not once per head.
    r = tl.arange(0, BLOCK_M * HEADS)
    tok = q0 + r // HEADS
    if HEADS == 1:
        head = lane + 0 * r
        kvh = lane // group
        row_ok = tok < length
    else:
        kvh = lane
        head = kvh * group + r % HEADS
        row_ok = (tok < length) & (r % HEADS < group)
    d = tl.arange(0, HEAD_DIM)
    q_rows = (start + tok)[:, None] * s_qt + head[:, None] * s_qh + d[None, :]
    q = tl.load(q_ptr + q_rows, mask=row_ok[:, None], other=0.0)
    # A finite floor instead of -inf keeps exp2(m_old - m_new) defined when a tile is all masked.
    m_i = tl.full([BLOCK_M * HEADS], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M * HEADS], tl.float32)
    acc = tl.zeros([BLOCK_M * HEADS, HEAD_DIM], tl.float32)
    n = tl.arange(0, BLOCK_N)
    # The cached part: every query sees every cached key, so whole tiles need no mask.
    acc, l_i, m_i = attend_cached_pages(
        acc, l_i, m_i, q, pk_ptr + kvh * s_pkh, pv_ptr + kvh * s_pvh, pkd, pvd, s_pkp, s_pkt,
        s_pvp, s_pvt, table_ptr + b * s_tb, 0, tl.load(cached_ptr + b), n, d, kvh * HEAD_DIM,
        qk_scale, PAGE, BLOCK_N, PAGE_TMA, ACC_IN_DOT, DOT_PRECISION, PAGE_STAGES)
    # The suffix. Keys before the tile's first query are visible to all its queries under
    # both rules (k <= q), so the tiles wholly before q0 run unmasked.
    k_head = k_ptr + kvh * s_kh
    v_head = v_ptr + kvh * s_vh
    before = (q0 // BLOCK_N) * BLOCK_N
    for n0 in range(0, before, BLOCK_N):
        s, values = score_key_tile(q, k_head, v_head, kd, vd, start + n0, start + n0 + n,
                                   kvh * HEAD_DIM, s_kt, s_vt, d, start + length, False,
                                   SUFFIX_TMA, DOT_PRECISION)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, values, qk_scale, ACC_IN_DOT,
                                            DOT_PRECISION)
    # The rest under the mask rule; a tile past the last query runs only when item-causal
    # and it starts inside the last query's segment.
    q_last = tl.minimum(q0 + BLOCK_M, length) - 1
    seg_q = tl.load(seg_ptr + start + tok, mask=row_ok, other=-1)
    seg_last = tl.load(seg_ptr + start + q_last)
    if MODE == 0:
        hi = q_last + 1
    else:
        hi = length
    for n0 in range(before, hi, BLOCK_N):
        seg_first = tl.load(seg_ptr + start + n0)
        if (n0 <= q_last) | (seg_first == seg_last):
            n_idx = n0 + n
            n_ok = n_idx < length
            s, values = score_key_tile(q, k_head, v_head, kd, vd, start + n0, start + n_idx,
                                       kvh * HEAD_DIM, s_kt, s_vt, d, start + length, True,
                                       SUFFIX_TMA, DOT_PRECISION)
            allowed = n_idx[None, :] <= tok[:, None]
            if MODE == 3:
                seg_k = tl.load(seg_ptr + start + n_idx, mask=n_ok, other=-2)
                allowed = allowed | (seg_k[None, :] == seg_q[:, None])
            s = tl.where(allowed & n_ok[None, :], s, float("-inf"))
            acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, values, qk_scale,
                                                ACC_IN_DOT, DOT_PRECISION)
    out = acc / tl.maximum(l_i, 1.0e-30)[:, None]
    o_rows = (start + tok)[:, None] * s_ot + head[:, None] * s_oh + d[None, :]
    tl.store(out_ptr + o_rows, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# ------------------------------------------------------------------------------ launchers
def _check_pages(op: str, pool_k, pool_v, block_table, cached_lens, batch: int, kv_heads: int,
                 head_dim: int, dtype) -> int:
    c.check_rank(op, "pool_k", pool_k, 4, "[pages, page_tokens, Hkv, D]")
    c.check_same_shape(op, "pool_v", pool_v, "pool_k", pool_k,
                       "[pages, page_tokens, Hkv, D]")
    page = pool_k.shape[1]
    require(page >= 16 and page & (page - 1) == 0, InvalidInputError,
            f"{op}: pool_k.shape[1] (page_tokens) must be a power of two >= 16, got {page}")
    c.check_dim(op, "pool_k", pool_k, 2, kv_heads, "Hkv")
    c.check_dim(op, "pool_k", pool_k, 3, head_dim, "head_dim")
    require(pool_k.dtype == dtype and pool_v.dtype == dtype, InvalidInputError,
            f"{op}: pool_k and pool_v must have the queries' dtype {dtype}, got "
            f"{pool_k.dtype} and {pool_v.dtype}")
    c.check_rank(op, "block_table", block_table, 2, "[B, pages per request]")
    c.check_dim(op, "block_table", block_table, 0, batch, "B")
    c.check_index(op, "block_table", block_table)
    c.check_rank(op, "cached_lens", cached_lens, 1, "[B]")
    c.check_dim(op, "cached_lens", cached_lens, 0, batch, "B")
    c.check_index(op, "cached_lens", cached_lens)
    c.check_last_dim_contiguous(op, {"pool_k": pool_k, "pool_v": pool_v})
    return page


def _check_offsets(op: str, cu_seqlens, seq_lens, batch: int) -> None:
    c.check_rank(op, "cu_seqlens", cu_seqlens, 1, "[B + 1]")
    c.check_dim(op, "cu_seqlens", cu_seqlens, 0, batch + 1, "B + 1")
    c.check_index(op, "cu_seqlens", cu_seqlens)
    if seq_lens is not None:
        c.check_rank(op, "seq_lens", seq_lens, 1, "[B]")
        c.check_dim(op, "seq_lens", seq_lens, 0, batch, "B")
        c.check_index(op, "seq_lens", seq_lens)


def _check_prefill(q, k, v, cu_seqlens, segment_ids, mode: str, pool_k, pool_v, block_table,
                   cached_lens, max_len, scale, seq_lens, devices: bool = True
                   ) -> tuple[float, int]:
    """Shape, dtype, stride and (unless tracing) device checks; the scale in base-2 units and
    the page size."""
    op = "paged_prefill_attention"
    require(MaskMode(mode) in MODES, InvalidInputError,
            f"{op}: mode must be one of {[m.value for m in MODES]} (the prompt cache keeps "
            f"only look-back masks), got {MaskMode(mode).value!r}")
    c.check_rank(op, "q", q, 3, "[T, Hq, D]")
    c.check_rank(op, "k", k, 3, "[T, Hkv, D]")
    c.check_same_shape(op, "v", v, "k", k, "[T, Hkv, D]")
    total, hq, dim = q.shape
    hkv = k.shape[1]
    c.check_dim(op, "k", k, 0, total, "T")
    c.check_dim(op, "k", k, 2, dim, "head_dim")
    require(hq % hkv == 0, InvalidInputError,
            f"{op}: query heads {hq} must be a multiple of KV heads {hkv}")
    c.check_head_dim(op, dim)
    dtype = c.check_float(op, {"q": q, "k": k, "v": v})
    c.check_rank(op, "segment_ids", segment_ids, 1, "[T]")
    c.check_dim(op, "segment_ids", segment_ids, 0, total, "T")
    c.check_index(op, "segment_ids", segment_ids, (torch.int32,))
    c.check_rank(op, "cu_seqlens", cu_seqlens, 1, "[B + 1]")
    batch = cu_seqlens.shape[0] - 1
    _check_offsets(op, cu_seqlens, seq_lens, batch)
    page = _check_pages(op, pool_k, pool_v, block_table, cached_lens, batch, hkv, dim, dtype)
    require(isinstance(max_len, (int, torch.SymInt)) and not isinstance(max_len, bool),
            InvalidInputError, f"{op}: max_len must be an int, got {max_len!r}")
    c.require_size(max_len >= 0, f"{op}: max_len must be >= 0, got {max_len}")
    c.check_last_dim_contiguous(op, {"q": q, "k": k, "v": v})
    if devices:
        c.check_devices(op, {"q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens,
                             "segment_ids": segment_ids, "pool_k": pool_k, "pool_v": pool_v,
                             "block_table": block_table, "cached_lens": cached_lens})
    c.check_int32_offsets(op, {"q": q, "k": k, "v": v})
    return c.resolve_scale(op, scale, dim) * _LOG2E, page


@dataclasses.dataclass(frozen=True)
class PagedPrefillConfig:
    """Tiling of one paged prefill launch: ``block_m`` suffix tokens x ``heads`` query heads
    a program (``heads`` > 1: the KV head's whole group, padded to a power of two, shares
    each key tile), ``block_n`` keys a step, whole key tiles through TMA or pointers."""

    block_m: int
    block_n: int
    heads: int = 1
    num_warps: int = 4
    num_stages: int = 2
    # Whole key tiles (suffix tiles, and cached tiles when a page holds whole tiles) loaded
    # through tensor-memory-access descriptors (Hopper's TMA) where the layout allows.
    tma: bool = False
    # Pipeline depth of the cached-page loop; None: ``_online_softmax.page_stages``' rule.
    page_stages: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "heads"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1 and value & (value - 1) == 0,
                    InvalidInputError, f"PagedPrefillConfig.{name} must be a power of two, "
                    f"got {value!r}")
        require(self.block_m * self.heads >= 16 and self.block_n >= 16, InvalidInputError,
                f"PagedPrefillConfig: block_m x heads and block_n must be at least 16 (the "
                f"smallest tensor-core tile), got {self.block_m} x {self.heads} and "
                f"{self.block_n}")


def _run_prefill(q, k, v, cu_seqlens, segment_ids, mode: str, pool_k, pool_v, block_table,
                 cached_lens, max_len, scale, seq_lens,
                 config: PagedPrefillConfig | None = None) -> torch.Tensor:
    """Checks, the tile from shapes (example sizes when traced), the launch."""
    qk_scale, page = _check_prefill(q, k, v, cu_seqlens, segment_ids, mode, pool_k, pool_v,
                                    block_table, cached_lens, max_len, scale, seq_lens)
    out = torch.empty_like(q)
    total, hq, dim = q.shape
    hkv = k.shape[1]
    batch = cu_seqlens.shape[0] - 1
    if isinstance(out.numel(), int) and out.numel() == 0:
        return out
    if config is None:
        config = prefill_config(q.element_size())
    require(config.heads == 1 or config.heads >= hq // hkv, InvalidInputError,
            f"paged_prefill_attention: a program holding a group needs heads >= the group "
            f"{hq // hkv}, got {config.heads}")
    m_tiles = (max_len + config.block_m - 1) // config.block_m
    suffix_tma = config.tma and c.tma_ready(k, v)
    kd, vd = c.kv_descriptors(k, v, config.block_n) if suffix_tma else (k, v)
    pkd, pvd = c.page_descriptors(pool_k, pool_v, config.block_n, config.tma)
    with c.on_device(q.device):
        lanes = hq if config.heads == 1 else hkv
        wrap_triton(_paged_prefill_kernel)[(m_tiles * batch * lanes,)](
            q, k, v, out, cu_seqlens, cu_seqlens if seq_lens is None else seq_lens,
            segment_ids, cached_lens, block_table, pool_k, pool_v, kd, vd, pkd, pvd,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), block_table.stride(0),
            pool_k.stride(0), pool_k.stride(1), pool_k.stride(2),
            pool_v.stride(0), pool_v.stride(1), pool_v.stride(2),
            m_tiles, batch, lanes, hq // hkv, qk_scale,
            MODE=MODES[MaskMode(mode)], SEQ_LENS=seq_lens is not None,
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, HEADS=config.heads, HEAD_DIM=dim,
            PAGE=page, ACC_IN_DOT=True, DOT_PRECISION=c.dot_precision(q.dtype),
            SUFFIX_TMA=suffix_tma, PAGE_TMA=pkd is not pool_k,
            PAGE_STAGES=page_stages(config.num_stages, config.page_stages),
            num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def launch_paged_prefill(q, k, v, cu_seqlens, segment_ids, mode: MaskMode, pool_k, pool_v,
                         block_table, cached_lens, max_len: int,
                         config: PagedPrefillConfig, scale: float | None = None,
                         seq_lens=None) -> torch.Tensor:
    """``paged_prefill_attention`` with a given tiling (tests and tiling sweeps), outside the
    registered op."""
    return _run_prefill(q, k, v, cu_seqlens, segment_ids, MaskMode(mode).value, pool_k,
                        pool_v, block_table, cached_lens, max_len, scale, seq_lens, config)


@triton_op("xgr::paged_prefill_attention", mutates_args=())
def _paged_prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cu_seqlens: torch.Tensor, segment_ids: torch.Tensor, mode: str,
                      pool_k: torch.Tensor, pool_v: torch.Tensor, block_table: torch.Tensor,
                      cached_lens: torch.Tensor, max_len: int, scale: float | None = None,
                      seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    # torch.library.triton_op, as the other attention kernels: AOTInductor compiles the
    # kernel into a package that keeps a prompt cache (xgr_export.cached_package).
    if c.interpreting():
        return torch.ops.xgr.paged_prefill_attention_interpreted(
            q, k, v, cu_seqlens, segment_ids, mode, pool_k, pool_v, block_table, cached_lens,
            max_len, scale, seq_lens)
    return _run_prefill(q, k, v, cu_seqlens, segment_ids, mode, pool_k, pool_v, block_table,
                        cached_lens, max_len, scale, seq_lens)


@torch.library.custom_op("xgr::paged_prefill_attention_interpreted", mutates_args=())
def _paged_prefill_interpreted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cu_seqlens: torch.Tensor, segment_ids: torch.Tensor, mode: str,
                               pool_k: torch.Tensor, pool_v: torch.Tensor,
                               block_table: torch.Tensor, cached_lens: torch.Tensor,
                               max_len: int, scale: float | None = None,
                               seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """The op under ``TRITON_INTERPRET=1`` (CPU): interpreted kernels cannot be traced."""
    return _run_prefill(q, k, v, cu_seqlens, segment_ids, mode, pool_k, pool_v, block_table,
                        cached_lens, max_len, scale, seq_lens)


@_paged_prefill_interpreted.register_fake
def _(q, k, v, cu_seqlens, segment_ids, mode, pool_k, pool_v, block_table, cached_lens,
      max_len, scale=None, seq_lens=None):
    _check_prefill(q, k, v, cu_seqlens, segment_ids, mode, pool_k, pool_v, block_table,
                   cached_lens, max_len, scale, seq_lens, devices=False)
    return torch.empty_like(q)


def paged_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens: torch.Tensor, segment_ids: torch.Tensor,
                            mode: MaskMode, pool_k: torch.Tensor, pool_v: torch.Tensor,
                            block_table: torch.Tensor, cached_lens: torch.Tensor,
                            max_len: int, scale: float | None = None,
                            seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """``reference.paged_attention.paged_prefill_attention`` in one launch; ``max_len``:
    the longest suffix of the batch (an upper bound: its padded width), which sizes the
    grid. Values (offsets, pages, lengths within the pool) are the caller's contract: the
    engine builds them from the cache's plan."""
    return torch.ops.xgr.paged_prefill_attention(
        q, k, v, cu_seqlens, segment_ids, MaskMode(mode).value, pool_k, pool_v, block_table,
        cached_lens, max_len, scale, seq_lens)


def prefill_config(element_size: int) -> PagedPrefillConfig:
    """The tiling for inputs of ``element_size`` bytes, one for every shape so far
    (``experiments/probe_paged_prefill_tilings`` timed the choices as graph replays at the
    cache-hit shapes). 16-bit inputs: one query head a program, 64 x 64 tiles, three stages,
    whole key tiles through TMA, at every suffix length: 32-row tiles, which give a short
    suffix more programs, and a KV head's group stacked in one program
    (``PagedPrefillConfig.heads``, each key tile loaded once for the group) both ran slower.
    float32: 32 x 32 (twice the bytes a tile), pointer loads. The interpreter: 16 x 16 (many
    tiles on small tests) through TMA, so the CPU tests take the descriptor loads (explicit
    tilings take pointers)."""
    if c.interpreting():
        return PagedPrefillConfig(16, 16, 1, 4, 1, tma=True)
    if element_size > 2:
        return PagedPrefillConfig(32, 32, 1, 4, 2)
    return PagedPrefillConfig(64, 64, 1, 4, 3, tma=True)


def _check_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table,
                  cached_lens, beam_k, beam_v, num_own, seq_lens, devices: bool = True) -> int:
    """Shape, dtype, stride and (unless tracing) device checks; the page size."""
    op = "paged_decode_attention"
    c.check_rank(op, "q", q, 4, "[B, W, Hq, D]")
    c.check_rank(op, "shared_k", shared_k, 3, "[T, Hkv, D]")
    c.check_same_shape(op, "shared_v", shared_v, "shared_k", shared_k, "[T, Hkv, D]")
    c.check_rank(op, "beam_k", beam_k, 5, "[B, W, S, Hkv, D]")
    c.check_same_shape(op, "beam_v", beam_v, "beam_k", beam_k, "[B, W, S, Hkv, D]")
    batch, width, hq, dim = q.shape
    hkv = shared_k.shape[1]
    require(hq % hkv == 0, InvalidInputError,
            f"{op}: query heads {hq} must be a multiple of KV heads {hkv}")
    c.check_dim(op, "shared_k", shared_k, 2, dim, "head_dim")
    for axis, size, what in ((0, batch, "B"), (1, width, "W"), (3, hkv, "Hkv"), (4, dim, "D")):
        c.check_dim(op, "beam_k", beam_k, axis, size, what)
    require(isinstance(num_own, int) and 0 <= num_own <= beam_k.shape[2], InvalidInputError,
            f"{op}: num_own must be an int in [0, S={beam_k.shape[2]}], got {num_own!r}")
    c.check_head_dim(op, dim)
    dtype = c.check_float(op, {"q": q, "shared_k": shared_k, "shared_v": shared_v,
                               "beam_k": beam_k, "beam_v": beam_v})
    _check_offsets(op, cu_seqlens, seq_lens, batch)
    page = _check_pages(op, pool_k, pool_v, block_table, cached_lens, batch, hkv, dim, dtype)
    c.check_last_dim_contiguous(op, {"q": q, "shared_k": shared_k, "shared_v": shared_v,
                                     "beam_k": beam_k, "beam_v": beam_v})
    if devices:
        c.check_devices(op, {"q": q, "shared_k": shared_k, "shared_v": shared_v,
                             "cu_seqlens": cu_seqlens, "pool_k": pool_k, "pool_v": pool_v,
                             "block_table": block_table, "cached_lens": cached_lens,
                             "beam_k": beam_k, "beam_v": beam_v})
    c.check_int32_offsets(op, {"q": q, "shared_k": shared_k, "shared_v": shared_v})
    c.require_size(batch * hkv <= 65535, f"{op}: batch x KV heads must be at most 65535, got "
                   f"{batch} x {hkv}")
    return page


def decode_keys(shared_tokens: int, batch: int, table_pages: int, page_tokens: int) -> int:
    """The keys the paged decode's split rule counts (``decode_tiling``'s ``total_tokens``):
    every key a request may read, its pages' whole width and its packed prompt (an upper
    bound from shapes alone, so the choice captures)."""
    return shared_tokens + batch * table_pages * page_tokens


def _run_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table, cached_lens,
                beam_k, beam_v, num_own, scale, seq_lens,
                counters: torch.Tensor | None = None) -> torch.Tensor:
    """Checks, the split rule from shapes (example sizes when traced), the launch."""
    page = _check_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table,
                         cached_lens, beam_k, beam_v, num_own, seq_lens)
    batch, width, hq, dim = q.shape
    hkv = shared_k.shape[1]
    scale = c.resolve_scale("paged_decode_attention", scale, dim)
    keys = decode_keys(c.size_hint(shared_k.shape[0], 1024), c.size_hint(batch),
                       c.size_hint(block_table.shape[1]), page)
    config = paged_config_for(c.size_hint(batch), width, hq // hkv, hkv, keys, dim, q.device)
    with c.on_device(q.device):
        return launch_decode(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own,
                             scale, config, counters=counters, seq_lens=seq_lens,
                             paged=PagedPrefix(pool_k, pool_v, block_table, cached_lens))


@triton_op("xgr::paged_decode_attention", mutates_args=())
def _paged_decode_op(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                     cu_seqlens: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor,
                     block_table: torch.Tensor, cached_lens: torch.Tensor,
                     beam_k: torch.Tensor, beam_v: torch.Tensor, num_own: int,
                     scale: float | None = None,
                     seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    if c.interpreting():
        return torch.ops.xgr.paged_decode_attention_interpreted(
            q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table, cached_lens,
            beam_k, beam_v, num_own, scale, seq_lens)
    return _run_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table,
                       cached_lens, beam_k, beam_v, num_own, scale, seq_lens)


@torch.library.custom_op("xgr::paged_decode_attention_interpreted", mutates_args=())
def _paged_decode_interpreted(q: torch.Tensor, shared_k: torch.Tensor,
                              shared_v: torch.Tensor, cu_seqlens: torch.Tensor,
                              pool_k: torch.Tensor, pool_v: torch.Tensor,
                              block_table: torch.Tensor, cached_lens: torch.Tensor,
                              beam_k: torch.Tensor, beam_v: torch.Tensor, num_own: int,
                              scale: float | None = None,
                              seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """The op under ``TRITON_INTERPRET=1`` (CPU): interpreted kernels cannot be traced."""
    return _run_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table,
                       cached_lens, beam_k, beam_v, num_own, scale, seq_lens)


@_paged_decode_interpreted.register_fake
def _(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table, cached_lens, beam_k,
      beam_v, num_own, scale=None, seq_lens=None):
    _check_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table, cached_lens,
                  beam_k, beam_v, num_own, seq_lens, devices=False)
    return torch.empty_like(q)


def paged_decode_attention(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                           cu_seqlens: torch.Tensor, pool_k: torch.Tensor,
                           pool_v: torch.Tensor, block_table: torch.Tensor,
                           cached_lens: torch.Tensor, beam_k: torch.Tensor,
                           beam_v: torch.Tensor, num_own: int, scale: float | None = None,
                           seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """``reference.paged_attention.paged_decode_attention``: the xAttention kernel in its
    paged mode (split programs merged by log-sum-exp when the row tiles alone leave the GPU
    idle)."""
    return torch.ops.xgr.paged_decode_attention(q, shared_k, shared_v, cu_seqlens, pool_k,
                                                pool_v, block_table, cached_lens, beam_k,
                                                beam_v, num_own, scale, seq_lens)


def paged_decode_attention_counted(q: torch.Tensor, shared_k: torch.Tensor,
                                   shared_v: torch.Tensor, cu_seqlens: torch.Tensor,
                                   pool_k: torch.Tensor, pool_v: torch.Tensor,
                                   block_table: torch.Tensor, cached_lens: torch.Tensor,
                                   beam_k: torch.Tensor, beam_v: torch.Tensor, num_own: int,
                                   counters: torch.Tensor, scale: float | None = None,
                                   seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """``paged_decode_attention`` with caller-owned split counters (zeroed int32, at least
    ``decode_tiling.merge_counters`` entries for ``decode_keys``, left zeroed): a plain
    launch for the engine's eager and captured searches, which saves each launch its counter
    fill, as ``decode_attention.decode_attention_counted`` does for the contiguous decode."""
    return _run_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table,
                       cached_lens, beam_k, beam_v, num_own, scale, seq_lens, counters)
