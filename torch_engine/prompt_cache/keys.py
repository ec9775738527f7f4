"""Content digests of frozen prompt parts: what a cache entry is found by.

An entry's digest covers the tokens and segment ids of the frozen part from its first token,
and a scope: the model's weights, the mask rule and the code space (the token layout). So a
client cannot make the cache serve KV that does not belong to its prompt (it sends no key the
cache trusts), a changed long-term block changes every digest from that block on, a new model
version misses every old entry, and a catalog-only version (codes of existing items never
change) keeps them.

A frozen part is cached at its safe boundaries: where the KV of the tokens before does not
depend on the tokens after. Under the item-causal rule a token also attends later tokens of
its own segment, so the boundaries are segment starts. Under the causal rule every token
would do; the cache takes item starts there too (the caller derives segments from the
layout's ITEM_START tokens), so a frozen part that grew by a block finds its old end.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from xgr_common.layout import MaskMode

DIGEST_BYTES = 16


@dataclass(frozen=True)
class CacheScope:
    """What, beside the tokens, decides a cached KV: ``model`` (the weights' fingerprint or a
    deployed version name), ``code_space`` (the token layout) and the mask rule."""

    model: str
    code_space: str
    mode: MaskMode

    def root(self) -> "hashlib._Hash":
        h = hashlib.blake2b(digest_size=DIGEST_BYTES)
        for part in (self.model, self.code_space, MaskMode(self.mode).value):
            data = part.encode()
            h.update(len(data).to_bytes(4, "little"))
            h.update(data)
        return h


def model_fingerprint(model: torch.nn.Module) -> str:
    """A fingerprint of a model's configuration and weights: each parameter's name, shape,
    dtype and two weighted sums taken in float64 on the parameter's device (a few hundred
    milliseconds for billions of weights on a GPU, no copy to the host)."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(repr(getattr(model, "config", None)).encode())
    sums = []
    for name, param in model.named_parameters():
        h.update(f"{name}:{tuple(param.shape)}:{param.dtype}".encode())
        flat = param.detach().flatten().double()
        ramp = torch.arange(1, flat.numel() + 1, device=flat.device, dtype=torch.float64)
        sums.append(torch.stack([flat.sum(), (flat * ramp.remainder(9973)).sum()]))
    if sums:
        h.update(np.ascontiguousarray(torch.stack(sums).cpu().numpy()).tobytes())
    return h.hexdigest()


def scope_of(model: torch.nn.Module, layout, mode: MaskMode,
             model_version: str | None = None) -> CacheScope:
    """The scope of ``model`` serving ``layout`` (a ``TokenLayout``) under ``mode``;
    ``model_version``, when given, names the model instead of its weights' fingerprint."""
    name = model_version if model_version is not None else model_fingerprint(model)
    return CacheScope(model=name, code_space=repr(layout), mode=MaskMode(mode))


def safe_boundaries(segments: np.ndarray, frozen: int) -> list[int]:
    """The lengths (ascending, ending at ``frozen``) at which a frozen part of ``frozen``
    tokens may be cut: its segment starts."""
    if frozen <= 0:
        return []
    seg = segments[:frozen]
    return (np.nonzero(seg[1:] != seg[:-1])[0] + 1).tolist() + [frozen]


_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1


def token_records(tokens: np.ndarray, segments: np.ndarray) -> tuple[memoryview, int]:
    """The bytes a frozen part is hashed as, and the bytes of one token's record: per token
    its id and its segment id relative to the part's first (so equal layouts hash alike).
    A prefix of n tokens is the first ``n`` records, so one running hash serves every
    prefix. Records are two int32 when every value fits (any valid prompt: ids below the
    vocabulary size), else two int64; the digests cover the record size, so no
    out-of-range prompt hashes like an in-range one (such a prompt fails the value rules
    anyway, and a failed batch keeps nothing)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    seg = np.asarray(segments, dtype=np.int64)
    if seg.size:
        seg = seg - seg[0]
    pairs = np.stack([tokens, seg], axis=1)
    if not pairs.size or (pairs.min() >= _INT32_MIN and pairs.max() <= _INT32_MAX):
        return memoryview(np.ascontiguousarray(pairs, dtype=np.int32)).cast("B"), 8
    return memoryview(np.ascontiguousarray(pairs)).cast("B"), 16


def prefix_digest(scope: CacheScope, records: tuple[memoryview, int], length: int) -> bytes:
    """The digest of the prefix of ``length`` tokens (``token_records``)."""
    return prefix_digests(scope, records, [length])[0]


def prefix_digests(scope: CacheScope, records: tuple[memoryview, int], boundaries: list[int]
                   ) -> list[bytes]:
    """``prefix_digest`` at each of ``boundaries`` (ascending): one running hash, copied at
    each boundary."""
    data, size = records
    h = scope.root()
    h.update(bytes([size]))          # the record format: the two never hash alike
    digests, start = [], 0
    for end in boundaries:
        h.update(data[start * size:end * size])
        digests.append(h.copy().digest())
        start = end
    return digests
