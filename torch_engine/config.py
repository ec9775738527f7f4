"""Model and engine configuration: frozen dataclasses that validate themselves, and named presets.

``ModelConfig`` describes a Qwen2/Qwen3-style decoder and converts to and from the fields of a
Hugging Face ``config.json``; ``EngineConfig`` holds the serving-time knobs of ``Engine``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from xgr_common.buckets import BucketPolicy
from xgr_common.errors import ConfigError, require
from xgr_common.layout import TokenLayout
from xgr_common.prompt_spec import PromptSpec

ATTENTION_BACKENDS = ("auto", "torch", "triton")
SELECTION_BACKENDS = ("auto", "torch", "triton")
DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer (RMSNorm, RoPE, GQA attention, SwiGLU MLP).

    ``qk_norm`` adds Qwen3's per-head RMSNorm on queries and keys; ``attention_bias`` adds
    Qwen2's bias on the q/k/v projections.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    qk_norm: bool = False
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    max_position: int = 32_768

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "max_position"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"ModelConfig.{name} must be a positive int, got {value!r}")
        require(self.num_heads % self.num_kv_heads == 0, ConfigError,
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention")
        require(self.head_dim % 2 == 0, ConfigError,
                f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        require(self.rope_theta > 0, ConfigError,
                f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        require(self.rms_norm_eps > 0, ConfigError,
                f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps}")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def architecture(self) -> str:
        """The Hugging Face family whose weight layout this config matches."""
        return "qwen3" if self.qk_norm else "qwen2"

    def to_hf_dict(self) -> dict[str, Any]:
        """Fields of a Hugging Face ``config.json`` (Qwen2 or Qwen3) describing this model."""
        family = self.architecture
        return {
            "architectures": ["Qwen3ForCausalLM" if family == "qwen3" else "Qwen2ForCausalLM"],
            "model_type": family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            # transformers 4.x reads rope_theta, 5.x reads rope_parameters: write both.
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": self.attention_bias,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position,
            "use_sliding_window": False,
        }

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Read a Hugging Face Qwen2/Qwen3 ``config.json`` dict; raises ConfigError otherwise."""
        family = str(hf.get("model_type", ""))
        require(family in ("qwen2", "qwen3"), ConfigError,
                f"config.json model_type must be 'qwen2' or 'qwen3', got {family!r}")
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                               "num_attention_heads", "intermediate_size") if k not in hf]
        require(not missing, ConfigError, f"config.json lacks required fields {missing}")
        rope_type = (hf.get("rope_parameters") or {}).get("rope_type", "default")
        scaling = hf.get("rope_scaling")
        require(rope_type == "default" and not scaling, ConfigError,
                f"only default rotary embeddings are supported, got rope_parameters="
                f"{hf.get('rope_parameters')!r} rope_scaling={scaling!r}")
        require(not hf.get("use_sliding_window", False), ConfigError,
                "sliding-window attention (use_sliding_window=true) is not supported")
        heads = int(hf["num_attention_heads"])
        theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
            intermediate_size=int(hf["intermediate_size"]),
            rope_theta=float(theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            qk_norm=family == "qwen3",
            # Qwen2 always has q/k/v bias; Qwen3 makes it a config field (default off).
            attention_bias=True if family == "qwen2" else bool(hf.get("attention_bias", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position=int(hf.get("max_position_embeddings", 32_768)),
        )

    def replace(self, **changes: Any) -> "ModelConfig":
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        require(not unknown, ConfigError, f"unknown ModelConfig fields {unknown}")
        return replace(self, **changes)


_LAYOUT = TokenLayout()

PRESETS: dict[str, ModelConfig] = {
    # Test-sized: the vocabulary ends at the last code token, hidden matches the profile tower.
    "tiny": ModelConfig(vocab_size=_LAYOUT.code_end, hidden_size=PromptSpec().model_hidden,
                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128, attention_bias=True, max_position=4096),
    "qwen2-0.5b": ModelConfig(vocab_size=151_936, hidden_size=896, num_layers=24, num_heads=14,
                              num_kv_heads=2, head_dim=64, intermediate_size=4864,
                              attention_bias=True, tie_word_embeddings=True),
    # A 7B Qwen2 shape: the model tensor parallelism is for (torch_engine.tensor_parallel).
    "qwen2-7b": ModelConfig(vocab_size=152_064, hidden_size=3584, num_layers=28, num_heads=28,
                            num_kv_heads=4, head_dim=128, intermediate_size=18_944,
                            attention_bias=True, max_position=32_768),
    "qwen3-1.7b": ModelConfig(vocab_size=151_936, hidden_size=2048, num_layers=28, num_heads=16,
                              num_kv_heads=8, head_dim=128, intermediate_size=6144,
                              qk_norm=True, tie_word_embeddings=True, max_position=40_960),
}


def preset(name: str) -> ModelConfig:
    """The named preset; ConfigError lists the known names otherwise."""
    require(name in PRESETS, ConfigError, f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class EngineConfig:
    """Serving-time settings of ``Engine``.

    max_beam_width: largest ``beam_width`` a request may ask for (bounds beam KV memory).
    attention_backend: "triton" (kernels in ``torch_engine.kernels``, CUDA only), "torch"
        (plain PyTorch), or "auto" (triton when importable and on CUDA, else torch).
    dtype: compute dtype name for the model weights and KV ("bfloat16" on GPU, "float32" on
        CPU); None keeps the model's dtype.
    max_exclude: widest per-request ``exclude_items`` row accepted.
    cuda_graphs: on CUDA with static shapes, capture the whole search of each bucketed shape
        (the value rules included) in one CUDA graph and replay it (see ``runner``).
    static_shapes: pack prompts into a fixed ``B * Lmax``-row buffer (see
        ``kv_cache.PackedPrompt``): no host wait anywhere, padding slots computed. None
        (default): on when the engine replays CUDA graphs (CUDA and ``cuda_graphs``), so the
        whole search is one graph; off elsewhere (no padding computed on the CPU). False on
        CUDA runs every search eagerly (graphs need static shapes).
    length_bucket: with captured searches, prompt widths (soft prefix included) are padded
        up to a multiple of this, so prompts of different lengths replay one graph (at most
        ``length_bucket - 1`` padding slots computed per request); see ``bucket_policy``.
    batch_buckets: with captured searches, batches are padded with one-token requests up to
        the next power of two (results of the padding rows are dropped).
    layer_kernels: on CUDA, fold each layer's elementwise steps into
        ``torch_engine.kernels.layer_ops`` launches: the norms' row scales, the bias, the
        split, Qwen3's head norms, the rotary and the KV writes in one; the post-attention
        norm's row scale and SwiGLU in another; the residual adds on the products.
    max_graphs: captured shapes kept (least recently used dropped first).
    selection_backend: beam selection per level: "auto" (the default: triton on CUDA, else
        torch), "torch" (plain PyTorch) or "triton" (``xgr::constrained_topk``, and the
        exclusion and item-expansion kernels; CUDA or the CPU interpreter): a few launches a
        search instead of about a hundred small torch kernels (``benchmarks/README.md`` has
        the figures). It holds a Python custom op, so an engine exported for serving
        (AOTInductor) takes "torch".
    memory_budget: bytes one request may use (``capacity.check_capacity``, before any work);
        on CUDA the free device memory caps it. None: the free device memory on CUDA, no
        check on the CPU.
    soft_marker: where ``recommend``'s soft vectors go. None (prompt version 1): before the
        tokens, each with a position of its own. The layout's SOFT token id
        (``TokenLayout.soft_id``; prompt version 2, ``xgr_common.prompt_v2``): in place of
        each row's SOFT markers, in order, at the markers' positions (the markers count in
        ``lengths``). ``engine_config_for`` picks it from a model's prompt spec.
    """

    max_beam_width: int = 1024
    attention_backend: str = "auto"
    dtype: str | None = None
    max_exclude: int = 4096
    cuda_graphs: bool = True
    static_shapes: bool | None = None
    length_bucket: int = 256
    batch_buckets: bool = True
    layer_kernels: bool = True
    max_graphs: int = 8
    selection_backend: str = "auto"
    memory_budget: int | None = None
    soft_marker: int | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.max_beam_width, int) and self.max_beam_width >= 1, ConfigError,
                f"EngineConfig.max_beam_width must be a positive int, got {self.max_beam_width!r}")
        require(self.attention_backend in ATTENTION_BACKENDS, ConfigError,
                f"EngineConfig.attention_backend must be one of {ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}")
        require(self.dtype is None or self.dtype in DTYPES, ConfigError,
                f"EngineConfig.dtype must be None or one of {DTYPES}, got {self.dtype!r}")
        require(isinstance(self.max_exclude, int) and self.max_exclude >= 0, ConfigError,
                f"EngineConfig.max_exclude must be a non-negative int, got {self.max_exclude!r}")
        require(self.soft_marker is None or (isinstance(self.soft_marker, int)
                                             and not isinstance(self.soft_marker, bool)
                                             and self.soft_marker >= 0), ConfigError,
                f"EngineConfig.soft_marker must be None or a token id, got "
                f"{self.soft_marker!r}")
        require(self.static_shapes in (None, True, False), ConfigError,
                f"EngineConfig.static_shapes must be None, True or False, got "
                f"{self.static_shapes!r}")
        require(isinstance(self.length_bucket, int) and self.length_bucket >= 1, ConfigError,
                f"EngineConfig.length_bucket must be a positive int, got {self.length_bucket!r}")
        require(isinstance(self.max_graphs, int) and self.max_graphs >= 1, ConfigError,
                f"EngineConfig.max_graphs must be a positive int, got {self.max_graphs!r}")
        require(self.selection_backend in SELECTION_BACKENDS, ConfigError,
                f"EngineConfig.selection_backend must be one of {SELECTION_BACKENDS}, "
                f"got {self.selection_backend!r}")
        require(self.memory_budget is None or (isinstance(self.memory_budget, int)
                                               and self.memory_budget >= 1), ConfigError,
                f"EngineConfig.memory_budget must be None or a positive int (bytes), got "
                f"{self.memory_budget!r}")

    @property
    def bucket_policy(self) -> BucketPolicy:
        """``length_bucket`` and ``batch_buckets`` as the shared bucket policy of captured
        searches (``xgr_common.buckets``)."""
        return BucketPolicy(length_multiple=self.length_bucket, pow2_batch=self.batch_buckets)


def engine_config_for(spec, **settings) -> EngineConfig:
    """``EngineConfig(**settings)`` for a model of prompt spec ``spec``
    (``xgr_common.prompt_spec.PromptSpec``): its soft vectors go where its prompt version puts
    them (version 2: at the layout's SOFT markers; version 1: before the tokens)."""
    require("soft_marker" not in settings, ConfigError,
            "engine_config_for takes the soft marker from the prompt spec, not from settings")
    marker = spec.layout.soft_id if spec.version == 2 else None
    return EngineConfig(soft_marker=marker, **settings)

