"""Building blocks of the Qwen2/Qwen3 decoder: RMSNorm, rotary embeddings, one decoder layer.

The layer is split around attention (``project_qkv`` then ``finish``) so the same weights serve
the padded full forward, the packed prefill and the per-beam decode step, each of which calls
its own attention in between. Parameter names follow Hugging Face's so state dicts map 1:1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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


def rotary_inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """The rotary frequencies ``1 / theta ** (2j / head_dim)``, ``[head_dim / 2]`` float32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                            / head_dim))


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin ``[..., head_dim]`` for integer ``positions [...]`` (computed in
    float32): the sin of the first half of the dimensions is negated, the form
    ``apply_rotary`` takes (Hugging Face's ``rotate_half`` sign folded in once per pass
    instead of once per layer and tensor).

    Computed from the positions on the fly (no cached table), so any position works and the
    function traces without data-dependent shapes.
    """
    inv_freq = rotary_inv_freq(head_dim, theta, positions.device)
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., heads, head_dim]`` by per-token ``cos`` and signed ``sin``
    ``[..., head_dim]`` (from ``rotary_cos_sin``): ``x * cos + rotate_half(x) * sin`` with
    ``rotate_half(x) = [-x2, x1]``, as ``[x2, x1] * signed sin`` (three kernels, not five)."""
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return torch.addcmul(x * cos[..., None, :], swapped, sin[..., None, :])


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


@dataclass(frozen=True)
class FusedProjections:
    """Concatenated copies of a layer's q/k/v and gate/up weights: one matrix product each
    instead of three and two (on a GPU each product is a launch, and small-batch decode is
    launch-bound). The RMSNorm before each product has its weight folded into the copy's
    columns (``W * g``), so the norm itself is a plain ``x / rms(x)``, and the layer kernels
    can defer even that: ``(x @ (W * g)^T) / rms(x)`` row by row, applied by the kernel that
    reads the product (``torch_engine.kernels.layer_ops``). ``sources`` and ``versions``
    identify the parameters copied (norm weights included): the copies are used only while
    those parameter objects are unchanged (same objects, same in-place version counters), so
    training or loading weights afterwards falls back to the separate products.

    qkv_weight: ``[(Hq + 2 Hkv) * D, hidden]``, the input norm folded in; qkv_bias:
    ``[(Hq + 2 Hkv) * D]`` or None; gate_up_weight: ``[2 * intermediate, hidden]``, the
    post-attention norm folded in; kernels: on CUDA, fold the elementwise steps between the
    products into ``torch_engine.kernels.layer_ops`` launches.
    """

    sources: tuple[torch.Tensor, ...]
    versions: tuple[int, ...]
    # Each source's storage when copied: ``Module.to`` (a dtype or device change) gives a
    # parameter new data without counting a version.
    pointers: tuple[int, ...]
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor
    kernels: bool = True

    def current(self) -> bool:
        """True while every source parameter is the one copied, unmodified, in place."""
        return all(p._version == v and p.data_ptr() == at for p, v, at in
                   zip(self.sources, self.versions, self.pointers))


def fold_norm(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` with each input column scaled by ``norm_weight [in]``, rounded once
    to ``weight``'s dtype: ``rms_norm(x, g) @ W^T == (x / rms(x)) @ (W * g)^T``."""
    wide = torch.float64 if weight.dtype == torch.float64 else torch.float32
    return (weight.to(wide) * norm_weight.to(wide)[None, :]).to(weight.dtype)


def unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x)`` over the last axis (an RMSNorm whose weight lives in the next product)."""
    return F.rms_norm(x, (x.shape[-1],), None, eps)


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    # Its CUDA kernel writes keys and values into the caller's buffers (``project_qkv_into``);
    # ``KernelLayer``, traced, returns new ones instead.
    returns_new_kv = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # A plain attribute, not a buffer: not in the state dict, not traced by torch.export.
        self.fused: FusedProjections | None = None

    def fuse_projections(self, kernels: bool = True) -> None:
        """Build ``self.fused`` from the current weights (see ``FusedProjections``); the
        copies are kept while still current, so engines sharing a model share them (a
        captured CUDA graph reads the copies it was captured with)."""
        # A row-parallel output projection (tensor_parallel) must all-reduce between its
        # product and the residual add, which the kernel that folds both into one launch
        # skips: such a layer keeps the fused products but not the layer kernels.
        kernels = kernels and not getattr(self.self_attn.o_proj, "reduces", False)
        fused = self.fused
        if fused is not None and fused.current() and all(
                a is b for a, b in zip(fused.sources, self._sources())):
            if fused.kernels != kernels:
                self.fused = replace(fused, kernels=kernels)
            return
        attn, mlp = self.self_attn, self.mlp
        sources = self._sources()
        with torch.no_grad():
            qkv_w = fold_norm(torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                         attn.v_proj.weight]), self.input_layernorm.weight)
            qkv_b = (torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
                     if attn.q_proj.bias is not None else None)
            gate_up = fold_norm(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                                self.post_attention_layernorm.weight)
        self.fused = FusedProjections(tuple(sources), tuple(p._version for p in sources),
                                      tuple(p.data_ptr() for p in sources), qkv_w, qkv_b,
                                      gate_up, kernels)

    def _live_fused(self) -> FusedProjections | None:
        """The fused copies when usable: current, and not while tracing (``torch.export`` and
        ``torch.compile`` see the separate products and fuse on their own)."""
        fused = self.fused
        if fused is None or torch.compiler.is_compiling():
            return None
        same = all(a is b for a, b in zip(fused.sources, self._sources()))
        return fused if same and fused.current() else None

    def runs_kernels(self, t: torch.Tensor) -> bool:
        """Whether a pass over ``t`` runs the fused layer kernels (``fuse_projections`` with
        kernels, copies current, not tracing, ``t`` on CUDA)."""
        fused = self._live_fused()
        return fused is not None and fused.kernels and t.is_cuda

    def _sources(self) -> list[torch.Tensor]:
        attn, mlp = self.self_attn, self.mlp
        found = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                 mlp.gate_proj.weight, mlp.up_proj.weight, self.input_layernorm.weight,
                 self.post_attention_layernorm.weight]
        if attn.q_proj.bias is not None:
            found += [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        return found

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values of ``x [..., hidden]`` with rotary applied.

        cos, sin: ``[..., head_dim]`` for the tokens of ``x``. Returns q ``[..., Hq, D]`` and
        k, v ``[..., Hkv, D]`` in ``x.dtype``.
        """
        cfg, attn = self.config, self.self_attn
        lead = x.shape[:-1]
        fused = self._live_fused()
        if fused is not None:
            heads = cfg.num_heads + cfg.num_kv_heads
            h = unit_rms_norm(x, cfg.rms_norm_eps)
            qkv = F.linear(h, fused.qkv_weight, fused.qkv_bias).view(
                *lead, heads + cfg.num_kv_heads, cfg.head_dim)
            v = qkv[..., heads:, :]
            if not cfg.qk_norm:
                # Queries and keys side by side: one rotary pass over both.
                qk = apply_rotary(qkv[..., :heads, :], cos, sin)
                return qk[..., :cfg.num_heads, :], qk[..., cfg.num_heads:, :], v
            q, k = qkv[..., :cfg.num_heads, :], qkv[..., cfg.num_heads:heads, :]
            q, k = attn.q_norm(q), attn.k_norm(k)
            return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v
        h = self.input_layernorm(x)
        q = attn.q_proj(h).view(*lead, cfg.num_heads, cfg.head_dim)
        k = attn.k_proj(h).view(*lead, cfg.num_kv_heads, cfg.head_dim)
        v = attn.v_proj(h).view(*lead, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def project_qkv_into(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         k_out: torch.Tensor, v_out: torch.Tensor) -> torch.Tensor:
        """``project_qkv`` writing keys and values into ``k_out, v_out [..., Hkv, D]`` (e.g.
        a beam-KV slot) and returning the queries ``[..., Hq, D]``; on CUDA with fused
        kernels one launch does the split, the norms, the rotary and both writes."""
        fused = self._live_fused()
        if fused is not None and fused.kernels and x.is_cuda:
            return self._qkv_kernel(x, cos, sin, fused, k_out, v_out)
        q, k, v = self.project_qkv(x, cos, sin)
        k_out.copy_(k)
        v_out.copy_(v)
        return q

    def _qkv_kernel(self, x, cos, sin, fused: FusedProjections, k_out, v_out) -> torch.Tensor:
        from torch_engine.kernels import layer_ops
        cfg, attn = self.config, self.self_attn
        x = x.contiguous()
        # The input norm's weight is in the product; its row scale and the bias are applied
        # by the kernel that splits and rotates the product (no norm launch).
        qkv = F.linear(x, fused.qkv_weight)
        norms = (attn.q_norm.weight, attn.k_norm.weight) if cfg.qk_norm else (None, None)
        return layer_ops.qkv_rotary(qkv, cos, sin, cfg.num_heads, cfg.num_kv_heads, k_out,
                                    v_out, *norms, eps=cfg.rms_norm_eps, inputs=x,
                                    input_eps=cfg.rms_norm_eps, bias=fused.qkv_bias)

    def finish(self, x: torch.Tensor, attended: torch.Tensor, owned: bool = False
               ) -> torch.Tensor:
        """The rest of the layer: ``x [..., hidden]`` plus output projection of
        ``attended [..., Hq, D]``, then the MLP block. ``owned``: x is the caller's own
        contiguous buffer, which the CUDA kernel path may then update in place (the residual
        stream of the engine's passes after their first layer); otherwise x is left as it is.
        """
        fused = self._live_fused()
        if fused is not None and fused.kernels and x.is_cuda:
            return self._finish_kernels(x, attended, fused, owned)
        delta = self.self_attn.o_proj(attended.flatten(-2))
        x = x + delta
        if fused is None:
            return x + self.mlp(self.post_attention_layernorm(x))
        h = unit_rms_norm(x, self.config.rms_norm_eps)
        gate, up = F.linear(h, fused.gate_up_weight).chunk(2, dim=-1)
        return x + self.mlp.down_proj(F.silu(gate) * up)

    def _finish_kernels(self, x, attended, fused: FusedProjections, owned: bool
                        ) -> torch.Tensor:
        from torch_engine.kernels import layer_ops
        size = x.shape[-1]
        flat = attended.reshape(-1, attended.shape[-2] * attended.shape[-1])
        out_weight = self.self_attn.o_proj.weight.t()
        # Both residual adds ride on their products (beta = 1): into x itself when the caller
        # owns it, else into one new buffer (the library copies x there first). This path
        # serves inference only: the kernels have no autograd.
        if owned and x.is_contiguous():
            s = x
            s.view(-1, size).addmm_(flat, out_weight)
        else:
            s = torch.addmm(x.reshape(-1, size), flat, out_weight).view(x.shape)
        # The post-attention norm's weight is in the gate/up product; silu_mul applies its row
        # scale (no norm launch).
        act = layer_ops.silu_mul(F.linear(s, fused.gate_up_weight), s,
                                 self.config.rms_norm_eps)
        s.view(-1, size).addmm_(act.view(-1, act.shape[-1]), self.mlp.down_proj.weight.t())
        return s
