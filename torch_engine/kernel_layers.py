"""A model as an exported engine package runs it: the fused layer kernels as traced ops.

``Engine.recommend`` on CUDA runs each decoder layer as 4 matrix products (the q/k/v and
gate/up weights concatenated, each RMSNorm's weight folded into the product after it:
``layers.FusedProjections``), attention and 2 elementwise kernels, plus one kernel for the
rotary rows and one for the final norm (``torch_engine.kernels.layer_ops``). A traced program
reaches the same kernels only through ops that AOTInductor can compile into its package
(``layer_ops.traced_*``, ``torch.library.triton_op``s), and only tensors that are buffers or
parameters of the traced module may be their arguments (AOTInductor refuses lifted constants
there).

``kernel_model(model)`` gives that program's model: a structural copy of ``model`` sharing
every tensor, whose layers (``KernelLayer``) hold the fused copies as buffers and no longer
hold the separate q/k/v, gate/up and norm weights, so the package carries each weight once.
The copy is for tracing (and for tests, eagerly); it computes what the engine's kernel path
computes, kernel for kernel.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from torch_engine.layers import DecoderLayer
from xgr_common.errors import ConfigError, require


class KernelLayer(nn.Module):
    """A decoder layer with its fused weights as buffers, run through the layer ops.

    Built from a ``DecoderLayer`` whose ``fused`` copies are current (``fuse_projections``);
    the two methods the model's passes call, ``project_qkv_into`` and ``finish``, keep the
    ``DecoderLayer`` signatures.
    """

    def __init__(self, layer: DecoderLayer):
        super().__init__()
        fused = layer.fused
        require(fused is not None and fused.current(), ConfigError,
                "kernel layers need the layer's fused projection copies, current "
                "(Model.fuse_projections after the weights are final)")
        attn, cfg = layer.self_attn, layer.config
        self.config = cfg
        self.register_buffer("qkv_weight", fused.qkv_weight)
        self.register_buffer("qkv_bias", fused.qkv_bias)
        self.register_buffer("gate_up_weight", fused.gate_up_weight)
        # Shared with the source layer: the package holds them once.
        self.o_weight = attn.o_proj.weight
        self.down_weight = layer.mlp.down_proj.weight
        self.q_norm_weight = attn.q_norm.weight if cfg.qk_norm else None
        self.k_norm_weight = attn.k_norm.weight if cfg.qk_norm else None

    def runs_kernels(self, t: torch.Tensor) -> bool:
        """Always: this layer exists to run them."""
        return True

    # Its keys and values come back as new tensors (a traced program is functional): a pass
    # that keeps them takes them as they are rather than copying them into buffers of its own.
    returns_new_kv = True

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[..., Hq, D]``, keys and values ``[..., Hkv, D]`` of ``x [..., hidden]``
        (one or two leading axes): one product, one ``qkv_rotary``."""
        from torch_engine.kernels import layer_ops
        cfg = self.config
        x = x.contiguous()
        qkv = F.linear(x, self.qkv_weight)
        return layer_ops.traced_qkv_rotary(
            qkv, cos, sin, x, self.qkv_bias, self.q_norm_weight, self.k_norm_weight,
            cfg.num_heads, cfg.num_kv_heads, cfg.rms_norm_eps, cfg.rms_norm_eps)

    def project_qkv_into(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         k_out: torch.Tensor, v_out: torch.Tensor) -> torch.Tensor:
        """``project_qkv`` with the keys and values written into ``k_out, v_out
        [..., Hkv, D]`` (a beam-KV slot); returns the queries."""
        q, k, v = self.project_qkv(x, cos, sin)
        k_out.copy_(k)
        v_out.copy_(v)
        return q

    def finish(self, x: torch.Tensor, attended: torch.Tensor, owned: bool = False
               ) -> torch.Tensor:
        """``x`` plus the output projection of ``attended [..., Hq, D]``, then the MLP block:
        the residual adds ride on the products, ``silu_mul`` applies the post-attention norm's
        row scale. ``owned`` is accepted for the ``DecoderLayer`` signature: a traced program
        is functional, and Inductor decides what it updates in place."""
        from torch_engine.kernels import layer_ops
        size = x.shape[-1]
        flat = attended.reshape(-1, attended.shape[-2] * attended.shape[-1])
        s = torch.addmm(x.reshape(-1, size), flat, self.o_weight.t())
        act = layer_ops.traced_silu_mul(F.linear(s, self.gate_up_weight), s,
                                        self.config.rms_norm_eps)
        return torch.addmm(s, act, self.down_weight.t()).view(x.shape)


def _structural_copy(module: nn.Module) -> nn.Module:
    """A new module object with copies of ``module``'s registries and the same tensors."""
    clone = copy.copy(module)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    clone._modules = dict(module._modules)
    return clone


def kernel_model(model):
    """``model`` (a ``torch_engine.model.Model`` after ``fuse_projections`` with kernels) as
    an exported package runs it with the layer kernels: the same embedding, final norm and
    head, ``KernelLayer``s, the rotary frequencies as a buffer. Shares every tensor; the
    source model is left as it is."""
    first = model.model.layers[0].fused
    require(first is not None and first.kernels
            and getattr(model, "rotary_freqs", None) is not None, ConfigError,
            "kernel_model needs Model.fuse_projections(kernels=True) first")
    clone = _structural_copy(model)
    decoder = _structural_copy(model.model)
    decoder.layers = nn.ModuleList(KernelLayer(layer) for layer in model.model.layers)
    clone.model = decoder
    freqs = clone.__dict__.pop("rotary_freqs")
    clone.register_buffer("rotary_freqs", freqs)
    return clone
