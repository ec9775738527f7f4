"""Building blocks of the Qwen2/Qwen3 decoder: RMSNorm, rotary embeddings, one decoder layer.

The layer is split around attention (``project_qkv`` then ``finish``) so the same weights serve
the padded full forward, the packed prefill and the per-beam decode step, each of which calls
its own attention in between. Parameter names follow Hugging Face's so state dicts map 1:1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_engine.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm (one fused op; float32 inside, like Hugging Face's Qwen2/Qwen3)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.shape = (size,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.shape, self.weight, self.eps)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[..., head_dim]`` for integer ``positions [...]`` (computed in float32).

    Computed from the positions on the fly (no cached table), so any position works and the
    function traces without data-dependent shapes.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., heads, head_dim]`` by per-token ``cos, sin [..., head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


class Attention(nn.Module):
    """The projections of grouped-query self-attention (the attention itself is external)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hq, hkv, dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, hq * dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, hkv * dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, hkv * dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(hq * dim, config.hidden_size, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(dim, config.rms_norm_eps)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values of ``x [..., hidden]`` with rotary applied.

        cos, sin: ``[..., head_dim]`` for the tokens of ``x``. Returns q ``[..., Hq, D]`` and
        k, v ``[..., Hkv, D]`` in ``x.dtype``.
        """
        cfg, attn = self.config, self.self_attn
        h = self.input_layernorm(x)
        lead = h.shape[:-1]
        q = attn.q_proj(h).view(*lead, cfg.num_heads, cfg.head_dim)
        k = attn.k_proj(h).view(*lead, cfg.num_kv_heads, cfg.head_dim)
        v = attn.v_proj(h).view(*lead, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer: ``x [..., hidden]`` plus output projection of
        ``attended [..., Hq, D]``, then the MLP block."""
        x = x + self.self_attn.o_proj(attended.flatten(-2))
        return x + self.mlp(self.post_attention_layernorm(x))
