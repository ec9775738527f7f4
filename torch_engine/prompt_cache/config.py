"""The prompt cache's settings and the shape of the KV it stores."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xgr_common.errors import ConfigError, require


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class PromptCacheConfig:
    """How much memory the cache may hold and how it pages it.

    device_bytes: the pool on the engine's device, allocated once when the cache is made (so
        the cache never asks for memory while a request runs); host_bytes: the host-RAM tier
        that evicted entries move to (0: none; pinned memory on CUDA); page_tokens: tokens per
        page (a power of two >= 16: the attention kernels load a page as one key tile);
        split_run_tokens: what a second search of a batch costs, in prompt tokens of prefill
        work: a batch of hits and misses runs its hits apart when that saves more (0: whenever
        it saves anything; the TorchCall runtime's XGR_PROMPT_CACHE_SPLIT_TOKENS).
    """

    device_bytes: int
    host_bytes: int = 0
    page_tokens: int = 64
    split_run_tokens: int = 512

    def __post_init__(self) -> None:
        require(_whole(self.device_bytes) and self.device_bytes >= 1, ConfigError,
                f"PromptCacheConfig.device_bytes must be a positive int (bytes), got "
                f"{self.device_bytes!r}")
        require(_whole(self.host_bytes) and self.host_bytes >= 0, ConfigError,
                f"PromptCacheConfig.host_bytes must be an int >= 0 (bytes), got "
                f"{self.host_bytes!r}")
        require(_whole(self.split_run_tokens) and self.split_run_tokens >= 0, ConfigError,
                f"PromptCacheConfig.split_run_tokens must be an int >= 0 (tokens), got "
                f"{self.split_run_tokens!r}")
        pt = self.page_tokens
        require(_whole(pt) and pt >= 16 and pt & (pt - 1) == 0, ConfigError,
                f"PromptCacheConfig.page_tokens must be a power of two >= 16, got {pt!r}")


@dataclass(frozen=True)
class KVGeometry:
    """What one cached token holds: keys and values of every layer."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of_model(cls, config, dtype: torch.dtype) -> "KVGeometry":
        """The geometry of a ``ModelConfig``'s KV in ``dtype``."""
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, dtype)

    @property
    def token_bytes(self) -> int:
        """Bytes of KV per cached token (keys and values, all layers)."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype.itemsize

    def page_bytes(self, page_tokens: int) -> int:
        return self.token_bytes * page_tokens
