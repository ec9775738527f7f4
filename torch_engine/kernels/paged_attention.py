"""Attention over cached pages in Triton: a prompt suffix's prefill and one decode step when
the prompt's first tokens come from the prompt cache (``torch_engine.prompt_cache``).

Same functions as ``torch_engine.reference.paged_attention``. Cached tokens live in a paged
pool ``[pages, page_tokens, Hkv, D]``; request b's are the first ``cached_lens[b]`` tokens of
its pages ``block_table[b, :]``. Key tiles gather their rows' page indices from the table and
load the pages in place (no contiguous copy of the cached part):

* prefill: one program per (request, ``BLOCK_M`` suffix queries, query head), one
  FlashAttention-2 online softmax (``_online_softmax``) over the cached tiles (every cached
  key is visible), then over the request's packed suffix under the mask rule, derived from
  positions and segment ids (causal: ``k <= q``; item-causal: or the same segment). Suffix
  tiles that no query of the tile may see are skipped: under the causal rule the loop ends at
  the tile's last query; under item-causal a tile past it runs only when it starts inside the
  last query's segment.
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
from torch_engine.kernels._online_softmax import load_paged_tile, online_softmax_step
from torch_engine.kernels.decode_attention import (PagedPrefix, decode_config_for,
                                                   launch_decode)
from xgr_common.errors import InvalidInputError, require
from xgr_common.layout import MaskMode

_LOG2E = 1.4426950408889634
MODES = {MaskMode.CAUSAL: 0, MaskMode.ITEM_CAUSAL: 3}


@triton.jit
def _paged_prefill_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, cu_ptr, len_ptr, seg_ptr, cached_ptr, table_ptr,
        pk_ptr, pv_ptr,
        s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_tb,
        s_pkp, s_pkt, s_pkh, s_pvp, s_pvt, s_pvh,
        m_tiles, group, qk_scale,
        MODE: tl.constexpr, SEQ_LENS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
        ACC_IN_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid = tl.program_id(0)
    head = tl.program_id(1)
    b = pid // m_tiles
    q0 = (pid % m_tiles) * BLOCK_M
    start = tl.load(cu_ptr + b)
    if SEQ_LENS:
        length = tl.load(len_ptr + b)
    else:
        length = tl.load(cu_ptr + b + 1) - start
    if q0 >= length:
        return
    kvh = head // group
    m_idx = q0 + tl.arange(0, BLOCK_M)
    m_ok = m_idx < length
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (start + m_idx)[:, None] * s_qt + head * s_qh + d[None, :],
                mask=m_ok[:, None], other=0.0)
    # A finite floor instead of -inf keeps exp2(m_old - m_new) defined when a tile is all masked.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n = tl.arange(0, BLOCK_N)
    # The cached part: every query sees every cached key.
    cached = tl.load(cached_ptr + b)
    table_row = table_ptr + b * s_tb
    for k0 in range(0, cached, BLOCK_N):
        kpos = k0 + n
        k_ok = kpos < cached
        k, v = load_paged_tile(pk_ptr + kvh * s_pkh, pv_ptr + kvh * s_pvh, s_pkp, s_pkt, s_pvp,
                               s_pvt, table_row, kpos, k_ok, d, PAGE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = tl.where(k_ok[None, :], s, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, qk_scale, ACC_IN_DOT,
                                            DOT_PRECISION)
    # The suffix under the mask rule.
    q_last = tl.minimum(q0 + BLOCK_M, length) - 1
    seg_q = tl.load(seg_ptr + start + m_idx, mask=m_ok, other=-1)
    seg_last = tl.load(seg_ptr + start + q_last)
    if MODE == 0:
        hi = q_last + 1
    else:
        hi = length
    for n0 in range(0, hi, BLOCK_N):
        seg_first = tl.load(seg_ptr + start + n0)
        if (n0 <= q_last) | (seg_first == seg_last):
            n_idx = n0 + n
            n_ok = n_idx < length
            keys = tl.load(k_ptr + (start + n_idx)[:, None] * s_kt + kvh * s_kh + d[None, :],
                           mask=n_ok[:, None], other=0.0)
            values = tl.load(v_ptr + (start + n_idx)[:, None] * s_vt + kvh * s_vh + d[None, :],
                             mask=n_ok[:, None], other=0.0)
            allowed = n_idx[None, :] <= m_idx[:, None]
            if MODE == 3:
                seg_k = tl.load(seg_ptr + start + n_idx, mask=n_ok, other=-2)
                allowed = allowed | (seg_k[None, :] == seg_q[:, None])
            allowed = allowed & n_ok[None, :]
            s = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION)
            s = tl.where(allowed, s, float("-inf"))
            acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, values, qk_scale,
                                                ACC_IN_DOT, DOT_PRECISION)
    out = acc / tl.maximum(l_i, 1.0e-30)[:, None]
    tl.store(out_ptr + (start + m_idx)[:, None] * s_ot + head * s_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


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


def _run_prefill(q, k, v, cu_seqlens, segment_ids, mode: str, pool_k, pool_v, block_table,
                 cached_lens, max_len, scale, seq_lens) -> torch.Tensor:
    """Checks, the tile from shapes (example sizes when traced), the launch."""
    qk_scale, page = _check_prefill(q, k, v, cu_seqlens, segment_ids, mode, pool_k, pool_v,
                                    block_table, cached_lens, max_len, scale, seq_lens)
    out = torch.empty_like(q)
    total, hq, dim = q.shape
    batch = cu_seqlens.shape[0] - 1
    if isinstance(out.numel(), int) and out.numel() == 0:
        return out
    hint = c.size_hint(batch) * hq * triton.cdiv(max(c.size_hint(max_len), 1), 64)
    block_m, block_n, warps, stages = prefill_tile(hint, q.element_size(), q.device)
    m_tiles = (max_len + block_m - 1) // block_m
    with c.on_device(q.device):
        wrap_triton(_paged_prefill_kernel)[(batch * m_tiles, hq)](
            q, k, v, out, cu_seqlens, cu_seqlens if seq_lens is None else seq_lens,
            segment_ids, cached_lens, block_table, pool_k, pool_v,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), block_table.stride(0),
            pool_k.stride(0), pool_k.stride(1), pool_k.stride(2),
            pool_v.stride(0), pool_v.stride(1), pool_v.stride(2),
            m_tiles, hq // k.shape[1], qk_scale,
            MODE=MODES[MaskMode(mode)], SEQ_LENS=seq_lens is not None, BLOCK_M=block_m,
            BLOCK_N=block_n, HEAD_DIM=dim, PAGE=page, ACC_IN_DOT=True,
            DOT_PRECISION=c.dot_precision(q.dtype), num_warps=warps, num_stages=stages)
    return out


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


def prefill_tile(programs_of_64: int, element_size: int, device: torch.device
                 ) -> tuple[int, int, int, int]:
    """(query rows, keys, warps, stages) of a prefill program, from shapes alone: 64 x 64
    tiles of 16-bit inputs, 32-row tiles when 64-row ones (``programs_of_64`` of them) would
    leave multiprocessors idle, 32 x 32 for float32 (twice the bytes a tile), 16 x 16 under
    the interpreter (many tiles on small tests)."""
    if c.interpreting():
        return 16, 16, 4, 1
    if element_size > 2:
        return 32, 32, 4, 2
    if programs_of_64 < c.multiprocessors(device):
        return 32, 64, 4, 2
    return 64, 64, 4, 2


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


def _run_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table, cached_lens,
                beam_k, beam_v, num_own, scale, seq_lens) -> torch.Tensor:
    """Checks, the split rule from shapes (example sizes when traced), the launch."""
    page = _check_decode(q, shared_k, shared_v, cu_seqlens, pool_k, pool_v, block_table,
                         cached_lens, beam_k, beam_v, num_own, seq_lens)
    batch, width, hq, dim = q.shape
    hkv = shared_k.shape[1]
    scale = c.resolve_scale("paged_decode_attention", scale, dim)
    # The split rule counts every key a request may read: its pages' whole width and its
    # packed prompt (an upper bound, from shapes alone, so the choice captures).
    keys = c.size_hint(shared_k.shape[0], 1024) + (c.size_hint(batch) *
                                                   c.size_hint(block_table.shape[1]) * page)
    config = dataclasses.replace(
        decode_config_for(c.size_hint(batch), width, hq // hkv, hkv, keys, dim, q.device),
        tma=False)
    with c.on_device(q.device):
        return launch_decode(q, shared_k, shared_v, cu_seqlens, beam_k, beam_v, num_own,
                             scale, config, seq_lens=seq_lens,
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
