"""What an export builds: ``ExportConfig`` (the whole SavedModel) and ``EngineExportConfig``
(the engine package inside it). Plain data, no torch or TensorFlow: a command line can build
and check them before anything heavy loads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from xgr_common.errors import ConfigError, require
from xgr_world.synthetic import WorldConfig

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("torch", "triton", "auto")


def _positive(owner: str, name: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, ConfigError,
            f"{owner}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class EngineExportConfig:
    """What the exported engine serves.

    beam_width, top_k: fixed at export (they size the search); max_batch: largest batch the
    package accepts; device: "cpu" or "cuda[:i]" (the engine's device at run time).
    """

    beam_width: int = 16
    top_k: int = 10
    max_batch: int = 1024
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("beam_width", "top_k", "max_batch"):
            _positive("EngineExportConfig", name, getattr(self, name))
        require(self.device == "cpu" or self.device.startswith("cuda"), ConfigError,
                f"EngineExportConfig.device must be 'cpu' or 'cuda[:i]', got {self.device!r}")


@dataclass(frozen=True)
class ExportConfig:
    """One SavedModel of the whole pipeline over the synthetic world's catalog.

    out: the SavedModel folder (must not exist or be empty).
    model: a Hugging Face Qwen2/Qwen3 directory; None: a randomly initialised ``preset``.
    seed: seeds the model and the feature graph (the world has its own, ``world.seed``).
    world: the synthetic catalog, and the users whose requests ``verify_requests`` sends.
    keep_last, window_days: the prompt contract (``PromptSpec``): history items kept per
        prompt (4 + 4 x keep_last tokens at most) and the age beyond which events drop.
    engine: the search the package serves (beam width, top_k, largest batch, device).
    top_n: items per request after the business rules.
    dtype: engine weights and activations; float32 keeps the SavedModel's items equal to the
        in-process pipeline's.
    attention_backend: "auto" takes the Triton kernels on CUDA when AOTInductor can embed
        them (registered with ``torch.library.triton_op``), else plain torch; "triton" insists.
    cache_dir: compiled packages by content hash (None: no cache).
    verify_requests: after saving, send this many of the world's users through the SavedModel
        in a fresh process (TF + custom_ops only) and through the in-process pipeline.
    """

    out: str | os.PathLike
    model: str | None = None
    preset: str = "tiny"
    seed: int = 0
    world: WorldConfig = field(default_factory=WorldConfig)
    keep_last: int = 50
    window_days: int = 90
    engine: EngineExportConfig = field(default_factory=lambda: EngineExportConfig(top_k=12))
    top_n: int = 8
    dtype: str = "float32"
    attention_backend: str = "auto"
    cache_dir: str | None = None
    verify_requests: int = 0

    def __post_init__(self) -> None:
        require(isinstance(self.out, (str, os.PathLike)) and str(self.out) != "", ConfigError,
                f"ExportConfig.out must name a folder, got {self.out!r}")
        for name in ("keep_last", "window_days", "top_n"):
            _positive("ExportConfig", name, getattr(self, name))
        require(self.dtype in DTYPES, ConfigError,
                f"ExportConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        require(self.attention_backend in ATTENTION_BACKENDS, ConfigError,
                f"ExportConfig.attention_backend must be one of {ATTENTION_BACKENDS}, got "
                f"{self.attention_backend!r}")
        require(isinstance(self.verify_requests, int) and
                0 <= self.verify_requests <= self.world.num_users, ConfigError,
                f"ExportConfig.verify_requests must be in [0, world.num_users="
                f"{self.world.num_users}], got {self.verify_requests!r}")

    @property
    def model_name(self) -> str:
        """The Hugging Face directory, else the preset."""
        return self.model or self.preset
