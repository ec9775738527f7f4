"""The Qwen2/Qwen3-style decoder with the three entry points the engine needs.

* ``forward``: padded ``[B, L]`` rows -> full-vocabulary logits (training, parity checks).
* ``prefill``: a packed ragged prompt batch -> shared prompt KV + each request's last hidden.
* ``decode_step``: the current token of every beam -> its hidden, writing one beam KV slot.
``level_logits`` applies the LM head to one level's codebook rows only.

Module and parameter names equal Hugging Face's (``model.layers.N.self_attn.q_proj.weight``),
so checkpoints load without a name map (see ``torch_engine.weights``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torch_engine import attention as attn
from torch_engine.config import ModelConfig, preset
from xgr_common.errors import InvalidInputError, require
from torch_engine.kv_cache import BeamKV, CachedPrefix, PackedPrompt, SharedKV
from torch_engine.layers import DecoderLayer, RMSNorm, rotary_cos_sin, rotary_inv_freq
from xgr_common.layout import MaskMode


class Decoder(nn.Module):
    """Embedding, layers and final norm (Hugging Face's ``model`` submodule)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Model(nn.Module):
    """Decoder-only language model; ``lm_head`` shares the embedding when tied."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # ----------------------------------------------------------------- construction and I/O
    @classmethod
    def from_preset(cls, name: str, seed: int = 0, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> "Model":
        """Randomly initialised model of a named preset (``from_config``)."""
        return cls.from_config(preset(name), seed, dtype, device)

    @classmethod
    def from_config(cls, config: ModelConfig, seed: int = 0, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> "Model":
        """Randomly initialised model of ``config`` (normal(0, 0.02) like HF's init), in eval
        mode."""
        model = cls(config)
        model.init_weights(seed)
        return model.to(device=device, dtype=dtype or torch.float32).eval()

    def init_weights(self, seed: int) -> None:
        """Deterministic normal(0, 0.02) weights, zero biases, unit norms, drawn where the
        weights live (on a GPU: seconds, not minutes, for billions of weights; the values
        depend on the device's generator)."""
        device = next(self.parameters()).device
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.endswith(".bias"):
                    param.zero_()
                else:
                    param.copy_(torch.randn(param.shape, generator=gen, device=device) * 0.02)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None) -> "Model":
        """Load a Hugging Face Qwen2/Qwen3 directory (config.json + safetensors, sharded too)."""
        from torch_engine.weights import load_pretrained
        return load_pretrained(cls, path, dtype=dtype, device=device)

    def save_pretrained(self, path: str | Path, max_shard_bytes: int | None = None) -> None:
        """Write config.json + safetensors in Hugging Face's layout (sharded when asked)."""
        from torch_engine.weights import save_pretrained
        save_pretrained(self, path, max_shard_bytes=max_shard_bytes)

    def fuse_projections(self, kernels: bool = True) -> None:
        """Give every layer concatenated q/k/v and gate/up weight copies for serving (see
        ``layers.FusedProjections``; used while the weights stay unchanged), and on CUDA the
        fused elementwise kernels when ``kernels``."""
        for layer in self.model.layers:
            layer.fuse_projections(kernels)
        # The rotary frequencies the fused cos/sin kernel reads, made once here (outside any
        # graph capture) on the weights' device.
        device = self.lm_head.weight.device
        self.rotary_freqs = rotary_inv_freq(self.config.head_dim, self.config.rope_theta,
                                            device)

    # -------------------------------------------------------------------------- pieces
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[..., hidden]`` of integer ``input_ids [...]``."""
        return self.model.embed_tokens(input_ids)

    def level_logits(self, hidden: torch.Tensor, start: int, end: int, widen: bool = True
                     ) -> torch.Tensor:
        """Logits ``[..., end - start]`` over vocabulary rows ``[start, end)`` (one codebook),
        in float32 (in the product's dtype unless ``widen``: for a consumer that widens on
        load, one cast launch less); ``hidden [..., hidden]`` already normalised."""
        logits = hidden @ self.lm_head.weight[start:end].T
        return logits.float() if widen else logits

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype, repeat: int = 1):
        """cos and signed sin of ``positions [...]``, each repeated ``repeat`` times:
        ``[*positions.shape, repeat, D]`` (``[*positions.shape, D]`` when ``repeat`` is 1).
        One launch on CUDA with the fused kernels (``layer_ops.rotary_cos_sin``)."""
        freqs = getattr(self, "rotary_freqs", None)
        if (self._layer_kernels(positions) and freqs is not None
                and freqs.device == positions.device):
            from torch_engine.kernels import layer_ops
            run = (layer_ops.traced_rotary_cos_sin if torch.compiler.is_compiling()
                   else layer_ops.rotary_cos_sin)
            return run(positions, freqs, dtype, repeat)
        if repeat > 1:
            positions = positions[..., None].expand(*positions.shape, repeat)
        return rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    # ------------------------------------------------------------------------- forward
    def forward(self, input_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None,
                mode: MaskMode = MaskMode.CAUSAL) -> torch.Tensor:
        """Full-vocabulary logits ``[B, L, vocab]`` (float32) of right-padded rows.

        Give exactly one of ``input_ids [B, L]`` (int) and ``inputs_embeds [B, L, hidden]``.
        segment_ids: ``[B, L]`` int, -1 on padding (see ``xgr_common.layout``); None means
        every slot is a token. Logits at padding slots are meaningless.
        """
        require((input_ids is None) != (inputs_embeds is None), InvalidInputError,
                "forward needs exactly one of input_ids and inputs_embeds")
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        require(x.dim() == 3 and x.shape[-1] == self.config.hidden_size, InvalidInputError,
                f"inputs must give [B, L, {self.config.hidden_size}] embeddings, got "
                f"{tuple(x.shape)}")
        if segment_ids is not None:
            require(tuple(segment_ids.shape) == tuple(x.shape[:2]), InvalidInputError,
                    f"segment_ids shape {tuple(segment_ids.shape)} must equal "
                    f"{tuple(x.shape[:2])}")
        positions = torch.arange(x.shape[1], device=x.device)
        cos, sin = self._rotary(positions, x.dtype)
        for index, layer in enumerate(self.model.layers):
            q, k, v = layer.project_qkv(x, cos, sin)
            # From the second layer on, x is this pass's own residual buffer.
            x = layer.finish(x, attn.padded_attention(q, k, v, segment_ids, mode),
                             owned=index > 0)
        hidden = self.model.norm(x)
        return (hidden @ self.lm_head.weight.T).float()

    # ------------------------------------------------------------ engine entry points
    def prefill(self, embeds: torch.Tensor, prompt: PackedPrompt, backend: str = "torch",
                cached: CachedPrefix | None = None) -> tuple[torch.Tensor, SharedKV]:
        """Run the packed prompts once.

        embeds: ``[T, hidden]`` packed input vectors. Returns the normalised hidden state of
        each request's last token ``[B, hidden]`` and the shared KV (per layer ``[T, Hkv, D]``).
        cached: each request's first tokens from the prompt cache; ``prompt`` is then the
        suffixes (their positions start after the cached tokens) and attends them too.
        """
        cos, sin = self._rotary(prompt.positions, embeds.dtype)
        cfg = self.config
        # With a prompt cache the suffix KV may be stored into pages: one buffer for every
        # layer lets the store copy it without concatenating the layers first (inference
        # only: autograd cannot record writes into views of one buffer).
        packed = cached is not None and not torch.is_grad_enabled()
        shared = SharedKV([], [], embeds.new_empty(
            (len(self.model.layers), 2, embeds.shape[0], cfg.num_kv_heads, cfg.head_dim))
            if packed else None)
        x = embeds
        *early, final = self.model.layers
        for index, layer in enumerate(early):
            q, k, v = self._prompt_qkv(layer, x, cos, sin, shared)
            # embeds is the caller's; from the second layer on x is this pass's own buffer.
            attended = (attn.prefill_attention(q, k, v, prompt, backend) if cached is None
                        else attn.cached_prefill_attention(q, k, v, prompt, cached, index,
                                                           backend))
            x = layer.finish(x, attended, owned=index > 0)
        # The last layer's keys and values serve every prompt token, but only each request's
        # last token reads its output: its attention, output projection and MLP run on those
        # B rows instead of all T.
        q, k, v = self._prompt_qkv(final, x, cos, sin, shared)
        last = prompt.last_rows()
        attended = (attn.last_token_attention(q, k, v, prompt, backend, last) if cached is None
                    else attn.cached_last_token_attention(q, k, v, prompt, cached,
                                                          len(early), backend, last))
        return self._final_norm(final.finish(x[last], attended, owned=True)), shared

    def _prompt_qkv(self, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    shared: SharedKV) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of the packed prompt ``x [T, hidden]`` at one layer; the
        keys and values (``[T, Hkv, D]``) are appended to ``shared``."""
        cfg = self.config
        if shared.packed is None and layer.returns_new_kv:
            # A traced layer's keys and values are new tensors already: kept as they are
            # (a copy into buffers of the pass's own is a kernel a layer in the program).
            q, k, v = layer.project_qkv(x, cos, sin)
            shared.keys.append(k)
            shared.values.append(v)
            return q, k, v
        # Own buffers: views of the fused projection would keep all its heads alive.
        if shared.packed is not None:
            index = len(shared.keys)
            k, v = shared.packed[index, 0], shared.packed[index, 1]
        else:
            k = x.new_empty((x.shape[0], cfg.num_kv_heads, cfg.head_dim))
            v = torch.empty_like(k)
        q = layer.project_qkv_into(x, cos, sin, k, v)
        shared.keys.append(k)
        shared.values.append(v)
        return q, k, v

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, shared: SharedKV,
                    prompt: PackedPrompt, beams: BeamKV, slot: int,
                    backend: str = "torch", counters: torch.Tensor | None = None,
                    cached: CachedPrefix | None = None) -> torch.Tensor:
        """One token per beam: ``tokens [B, W]`` at ``positions [B]`` (same for all beams of a
        request). Writes beam KV ``slot`` and attends the prompt plus slots ``0..slot``;
        ``counters``: the attention's shared split counters (``attention.split_counters``);
        cached: the prompts' cached first tokens (``prefill``'s), attended before ``shared``.
        Returns the normalised hidden ``[B, W, hidden]``.
        """
        x = self.embed(tokens)
        cos, sin = self._rotary(positions, x.dtype, repeat=tokens.shape[1])
        # [B, W, D] also for one beam (the rotary drops a repeat of 1, and [B, D] would
        # broadcast against the batch).
        cos, sin = cos.reshape(*tokens.shape, -1), sin.reshape(*tokens.shape, -1)
        for index, layer in enumerate(self.model.layers):
            q = layer.project_qkv_into(x, cos, sin, *beams.slot(index, slot))
            beam_k, beam_v = beams.layer(index)
            if cached is None:
                out = attn.decode_attention(q, shared.keys[index], shared.values[index],
                                            prompt, beam_k, beam_v, slot + 1, backend, counters)
            else:
                out = attn.cached_decode_attention(q, shared.keys[index], shared.values[index],
                                                   prompt, cached, index, beam_k, beam_v,
                                                   slot + 1, backend, counters)
            x = layer.finish(x, out, owned=True)      # x: the embeddings, then its own sums
        return self._final_norm(x)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm; one ``layer_ops.rms_norm`` launch with the fused kernels."""
        norm = self.model.norm
        if self._layer_kernels(x):
            from torch_engine.kernels import layer_ops
            run = (layer_ops.traced_rms_norm if torch.compiler.is_compiling()
                   else layer_ops.rms_norm)
            return run(x, norm.weight, norm.eps)
        return norm(x)

    def _layer_kernels(self, t: torch.Tensor) -> bool:
        """Whether a pass over ``t`` runs the fused layer kernels: ``DecoderLayer``s with
        current kernel copies outside tracing on CUDA, or the ``KernelLayer``s of
        ``torch_engine.kernel_layers.kernel_model`` (traced, or eagerly in tests)."""
        return self.model.layers[0].runs_kernels(t)


