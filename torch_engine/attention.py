"""Attention for the three call sites, with backend dispatch.

* ``padded_attention``: right-padded ``[B, L]`` rows with a mask rule (full forward, training).
* ``prefill_attention``: the packed ragged prompt batch (``PackedPrompt``);
  ``last_token_attention``: its rows at each request's last token only (prefill's last layer).
* ``decode_attention``: one step of W beams over their request's shared prompt KV plus their own
  slots.
* ``cached_prefill_attention``, ``cached_last_token_attention``, ``cached_decode_attention``:
  the same when each request's first tokens come from the prompt cache's pages
  (``kv_cache.CachedPrefix``): the packed prompt is then each request's suffix.

Backends: "triton" calls the kernels of ``torch_engine.kernels`` (same signatures as
``torch_engine.reference``; CUDA only); "torch" is plain PyTorch built on SDPA and batched
matrix products (no Python loop over requests, so it traces).
"""

from __future__ import annotations

import importlib
import math
from typing import Callable

import torch
import torch.nn.functional as F

from xgr_common.errors import ConfigError, require
from torch_engine.kv_cache import CachedPrefix, PackedPrompt
from xgr_common.layout import PAD_SEGMENT, PROFILE_SEGMENT, MaskMode


def dense_mask(segment_ids: torch.Tensor, mode: MaskMode) -> torch.Tensor:
    """``[B, 1, L, L]`` bool mask (True = may attend) for right-padded rows.

    segment_ids: ``[B, L]`` int with ``PAD_SEGMENT`` (-1) on padding. Padding keys are never
    attended; a padding query attends only itself, so no softmax row is empty.
    """
    length = segment_ids.shape[1]
    pos = torch.arange(length, device=segment_ids.device)
    causal = (pos[None, :] <= pos[:, None])[None]
    seg_q, seg_k = segment_ids[:, :, None], segment_ids[:, None, :]
    mode = MaskMode(mode)
    if mode is MaskMode.CAUSAL:
        rule = causal
    elif mode is MaskMode.PREFIX_BIDIRECTIONAL:
        rule = causal | ((seg_q == PROFILE_SEGMENT) & (seg_k == PROFILE_SEGMENT))
    elif mode is MaskMode.SEGMENT_BIDIRECTIONAL:
        rule = seg_q == seg_k
    else:
        rule = causal | (seg_q == seg_k)
    valid = segment_ids != PAD_SEGMENT
    mask = rule & valid[:, None, :]
    eye = torch.eye(length, dtype=torch.bool, device=segment_ids.device)[None]
    return (mask | (eye & ~valid[:, :, None]))[:, None]


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     segment_ids: torch.Tensor | None, mode: MaskMode) -> torch.Tensor:
    """Self-attention of right-padded rows.

    q: ``[B, L, Hq, D]``; k, v: ``[B, L, Hkv, D]``; segment_ids: ``[B, L]`` (-1 = padding) or
    None (every slot valid). Returns ``[B, L, Hq, D]``; rows of padding slots are meaningless.
    """
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = q.shape[2] != k.shape[2]
    if MaskMode(mode) is MaskMode.CAUSAL:
        # Right padding sits after every valid key, so the causal rule already excludes it.
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
    else:
        require(segment_ids is not None, ConfigError,
                f"mask mode {MaskMode(mode).value!r} needs segment_ids")
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=dense_mask(segment_ids, mode),
                                             enable_gqa=gqa)
    return out.transpose(1, 2)


def _kernel(name: str) -> Callable | None:
    """The Triton kernel ``name`` from ``torch_engine.kernels``, or None when unavailable."""
    try:
        package = importlib.import_module("torch_engine.kernels")
        if hasattr(package, name):
            return getattr(package, name)
        return getattr(importlib.import_module(f"torch_engine.kernels.{name}"), name)
    except (ImportError, AttributeError):
        return None


def resolve_backend(name: str, device: torch.device) -> str:
    """"torch" or "triton" for the configured ``name`` ("auto", "torch", "triton")."""
    available = device.type == "cuda" and all(
        _kernel(k) is not None for k in ("prefill_attention", "decode_attention"))
    if name == "auto":
        return "triton" if available else "torch"
    if name == "triton":
        require(available, ConfigError,
                "attention_backend='triton' needs CUDA and the kernels of torch_engine.kernels "
                f"(device is {device}, kernels importable: "
                f"{_kernel('decode_attention') is not None})")
    return name


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      prompt: PackedPrompt, backend: str) -> torch.Tensor:
    """Masked self-attention of each packed request.

    q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]``. Returns ``[T, Hq, D]`` in ``q.dtype``.
    """
    if backend == "triton":
        if _causal_rows(prompt):
            if prompt.request_major:
                return prompt.pack(padded_attention(prompt.unpack(q), prompt.unpack(k),
                                                    prompt.unpack(v), None, MaskMode.CAUSAL))
            return padded_attention(q[None], k[None], v[None], None, MaskMode.CAUSAL)[0]
        return _kernel("prefill_attention")(q, k, v, prompt.prefill_cu_seqlens,
                                            prompt.segment_ids, prompt.mode, None)
    # Plain torch: scatter into the [B, Lmax] rows the caller padded, attend, pack again.
    out = padded_attention(prompt.unpack(q), prompt.unpack(k), prompt.unpack(v),
                           prompt.padded_segments(), prompt.mode)
    return prompt.pack(out)


def _causal_rows(prompt: PackedPrompt) -> bool:
    """A causal batch packed request-major (``static=True``), or a lone causal request: its
    packed rows are ``[B, Lmax]`` rows as they stand (views, no copy), each request's padding
    after its tokens, where causal attention never lets a token see it. So the library's
    causal kernel takes them (``padded_attention``): SDPA's choice there (cuDNN on Hopper) is
    faster than the Triton kernel for long prompts and for batches. Not while tracing: an
    exported package keeps the Triton op."""
    return (prompt.mode is MaskMode.CAUSAL
            and (prompt.request_major or prompt.lengths.shape[0] == 1)
            and not torch.compiler.is_compiling())


def last_token_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         prompt: PackedPrompt, backend: str, last: torch.Tensor) -> torch.Tensor:
    """The rows of ``prefill_attention`` at each request's last token, ``[B, Hq, D]``.

    q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]``; last: ``[B]`` the packed rows of those tokens
    (``prompt.last_rows()``, which the caller also needs). Where the mask rule lets the last
    token attend its whole request (``MaskMode.last_sees_request``), one query row per request
    against the prompt's keys (the decode kernel with no own tokens) replaces T query rows: at
    a 5000-token prompt, a few microseconds instead of a whole layer's attention.
    """
    if not prompt.mode.last_sees_request:
        return prefill_attention(q, k, v, prompt, backend)[last]
    rows = q[last][:, None]                                       # [B, 1, Hq, D]
    # No own tokens: the beam KV arguments are shape holders that are never read.
    none = k.new_empty((rows.shape[0], 1, 1, *k.shape[1:]))
    return decode_attention(rows, k, v, prompt, none, none, 0, backend)[:, 0]


def split_counters(batch: int, width: int, num_heads: int, num_kv_heads: int,
                   total_tokens: int, head_dim: int, device: torch.device, backend: str,
                   cached: CachedPrefix | None = None) -> torch.Tensor | None:
    """Zeroed split counters that every ``decode_attention`` call of one shape (with
    ``cached``: every ``cached_decode_attention`` call over its pages) can share, each call
    leaving them at zero: one fill a search instead of one per layer and step. None when
    the Triton kernel does not split that shape, for the torch backend, or while tracing."""
    if backend != "triton" or torch.compiler.is_compiling():
        return None
    if cached is not None:   # the paged decode's split rule also counts the pages
        total_tokens = _paged().decode_keys(total_tokens, batch, cached.block_table.shape[1],
                                            cached.pool.shape[3])
    module = importlib.import_module("torch_engine.kernels.decode_tiling")
    count = module.merge_counters(batch, width, num_heads, num_kv_heads, total_tokens,
                                  head_dim, device)
    return torch.zeros(count, dtype=torch.int32, device=device) if count else None


def decode_attention(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                     prompt: PackedPrompt, beam_k: torch.Tensor, beam_v: torch.Tensor,
                     num_own: int, backend: str,
                     counters: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step: each beam attends its prompt and its first ``num_own`` own slots.

    q: ``[B, W, Hq, D]``; shared_k, shared_v: ``[T, Hkv, D]`` packed prompt KV;
    beam_k, beam_v: ``[B, W, S, Hkv, D]``; counters: from ``split_counters`` for this shape,
    or None. Returns ``[B, W, Hq, D]`` in ``q.dtype``.
    """
    if backend == "triton":
        if counters is not None and not torch.compiler.is_compiling():
            module = importlib.import_module("torch_engine.kernels.decode_attention")
            return module.decode_attention_counted(q, shared_k, shared_v, prompt.cu_seqlens,
                                                   beam_k, beam_v, num_own, counters,
                                                   seq_lens=prompt.seq_lens)
        return _kernel("decode_attention")(q, shared_k, shared_v, prompt.cu_seqlens,
                                           beam_k, beam_v, num_own, None, prompt.seq_lens)
    return _decode_torch(q, prompt.unpack(shared_k), prompt.unpack(shared_v), prompt.valid,
                         beam_k, beam_v, num_own)


def _decode_torch(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, valid: torch.Tensor,
                  beam_k: torch.Tensor, beam_v: torch.Tensor, num_own: int) -> torch.Tensor:
    """Plain-torch decode step over padded shared rows ``keys, vals [B, N, Hkv, D]`` with
    ``valid [B, N]``, then each beam's first ``num_own`` slots."""
    batch, width, hq, dim = q.shape
    hkv = keys.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(dim)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32  # softmax precision
    # All beams (x the query heads of one KV head) of a request form one matrix against the
    # shared prompt: a GEMM with W * group rows per KV head instead of W separate GEMVs.
    rows = q.view(batch, width, hkv, group, dim)
    grouped = rows.permute(0, 2, 1, 3, 4).reshape(batch, hkv, width * group, dim)
    keys = keys.permute(0, 2, 3, 1)                               # [B, Hkv, D, N]
    vals = vals.transpose(1, 2)                                   # [B, Hkv, N, D]
    s_shared = (grouped @ keys).to(work) * scale                   # [B, Hkv, W*g, N]
    s_shared = s_shared.masked_fill(~valid[:, None, None, :], float("-inf"))
    own_k, own_v = beam_k[:, :, :num_own], beam_v[:, :, :num_own]  # [B, W, n, Hkv, D]
    s_own = torch.einsum("bwhgd,bwnhd->bhwgn", rows, own_k).to(work) * scale
    s_own = s_own.reshape(batch, hkv, width * group, num_own)
    probs = torch.softmax(torch.cat([s_shared, s_own], dim=-1), dim=-1).to(q.dtype)
    p_shared, p_own = probs.split([s_shared.shape[-1], num_own], dim=-1)
    out = p_shared @ vals                                         # [B, Hkv, W*g, D]
    out = out + torch.einsum("bhwgn,bwnhd->bhwgd",
                             p_own.reshape(batch, hkv, width, group, num_own),
                             own_v).reshape(batch, hkv, width * group, dim)
    return out.view(batch, hkv, width, group, dim).permute(0, 2, 1, 3, 4).reshape(
        batch, width, hq, dim)


def cached_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             prompt: PackedPrompt, cached: CachedPrefix, layer: int,
                             backend: str) -> torch.Tensor:
    """``prefill_attention`` of each request's suffix (``prompt``) over its cached tokens
    (all visible: the cache keeps only parts every later token may see) and itself under the
    mask rule. q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]``. Returns ``[T, Hq, D]``."""
    keys, values = cached.layer(layer)
    if backend == "triton":
        return _paged().paged_prefill_attention(
            q, k, v, prompt.prefill_cu_seqlens, prompt.segment_ids, prompt.mode, keys, values,
            cached.block_table, cached.lengths, prompt.valid.shape[1])
    ck, cv, cvalid = cached.gathered(layer)
    qs, ks, vs = prompt.unpack(q), prompt.unpack(k), prompt.unpack(v)
    width = qs.shape[1]
    own = dense_mask(prompt.padded_segments(), prompt.mode)              # [B, 1, Ls, Ls]
    mask = torch.cat([cvalid[:, None, None, :].expand(-1, 1, width, -1), own], dim=-1)
    kt = torch.cat([ck.to(k.dtype), ks], dim=1).transpose(1, 2)
    vt = torch.cat([cv.to(v.dtype), vs], dim=1).transpose(1, 2)
    out = F.scaled_dot_product_attention(qs.transpose(1, 2), kt, vt, attn_mask=mask,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return prompt.pack(out.transpose(1, 2))


def cached_last_token_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                prompt: PackedPrompt, cached: CachedPrefix, layer: int,
                                backend: str, last: torch.Tensor) -> torch.Tensor:
    """``last_token_attention`` with cached tokens: each request's last token attends its
    whole prompt (both look-back rules), so one decode row per request does it."""
    rows = q[last][:, None]                                       # [B, 1, Hq, D]
    none = k.new_empty((rows.shape[0], 1, 1, *k.shape[1:]))
    return cached_decode_attention(rows, k, v, prompt, cached, layer, none, none, 0,
                                   backend)[:, 0]


def cached_decode_attention(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                            prompt: PackedPrompt, cached: CachedPrefix, layer: int,
                            beam_k: torch.Tensor, beam_v: torch.Tensor, num_own: int,
                            backend: str, counters: torch.Tensor | None = None
                            ) -> torch.Tensor:
    """``decode_attention`` whose shared stage covers each request's cached tokens, then its
    suffix (``shared_k, shared_v``), then each beam's own slots; counters: from
    ``split_counters`` with ``cached`` for this shape, or None."""
    keys, values = cached.layer(layer)
    if backend == "triton":
        if counters is not None and not torch.compiler.is_compiling():
            return _paged().paged_decode_attention_counted(
                q, shared_k, shared_v, prompt.cu_seqlens, keys, values, cached.block_table,
                cached.lengths, beam_k, beam_v, num_own, counters, None, prompt.seq_lens)
        return _paged().paged_decode_attention(
            q, shared_k, shared_v, prompt.cu_seqlens, keys, values, cached.block_table,
            cached.lengths, beam_k, beam_v, num_own, None, prompt.seq_lens)
    ck, cv, cvalid = cached.gathered(layer)
    return _decode_torch(q, torch.cat([ck.to(shared_k.dtype), prompt.unpack(shared_k)], 1),
                         torch.cat([cv.to(shared_v.dtype), prompt.unpack(shared_v)], 1),
                         torch.cat([cvalid, prompt.valid], 1), beam_k, beam_v, num_own)


def _paged():
    return importlib.import_module("torch_engine.kernels.paged_attention")
