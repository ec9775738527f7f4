"""The prompt-KV cache: a user's frozen long-term prompt part computed once and reused.

``PromptCache`` keeps the keys and values of frozen prompt parts (``xgr_common.prompt_v2``) in
a paged pool on the engine's device (``pool``), with an optional host-RAM tier
(``host_tier``); entries are found by content digests (``keys``), never by a name a client
sends. ``Engine.recommend(..., frozen_lengths=...)`` reads and fills it; the attention over
the cached pages is ``torch_engine.attention.cached_prefill_attention`` and
``cached_decode_attention``. See ``docs/prompt_cache.md``.
"""

from torch_engine.prompt_cache.cache import PromptCache, Reservation
from torch_engine.prompt_cache.config import KVGeometry, PromptCacheConfig
from torch_engine.prompt_cache.keys import CacheScope, scope_of

__all__ = ["CacheScope", "KVGeometry", "PromptCache", "PromptCacheConfig", "Reservation",
           "scope_of"]
