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
LAYER_KERNELS = ("off", "on")
MASKS = ("item_causal", "causal")
# Requests drawn from a catalog file to verify with (one batch through both pipelines).
MAX_PROBE_REQUESTS = 1024


def _positive(owner: str, name: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, ConfigError,
            f"{owner}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class EngineExportConfig:
    """What the exported engine serves.

    beam_width, top_k: fixed at export (they size the search); max_batch: largest batch the
    package accepts; device: "cpu" or "cuda[:i]" (the engine's device at run time);
    max_request_exclusions: the most items one request may exclude through the
    ``serving_with_controls`` signature (applied on the device beside its history; 0 leaves
    that signature out).
    beam_widths: the widths a call may ask for (empty: ``beam_width`` only). Given, the
    package takes the width as the length of one more input (``beam_slots``, int8 ``[W]``,
    values unused) and ``beam_width`` is its default; each width must reach ``top_k`` items.
    cuda_graphs: the CUDA graphs TorchCall keeps for a CUDA package, one per shape bucket
    (four times as many with the prompt cache); once they are held, a new shape runs eagerly
    until seen often. Traffic of many history lengths and batch sizes wants more.
    """

    beam_width: int = 16
    top_k: int = 10
    max_batch: int = 1024
    device: str = "cpu"
    max_request_exclusions: int = 256
    beam_widths: tuple[int, ...] = ()
    cuda_graphs: int = 8

    def __post_init__(self) -> None:
        for name in ("beam_width", "top_k", "max_batch", "cuda_graphs"):
            _positive("EngineExportConfig", name, getattr(self, name))
        require(isinstance(self.beam_widths, tuple), ConfigError,
                f"EngineExportConfig.beam_widths must be a tuple of ints, got "
                f"{self.beam_widths!r}")
        for width in self.beam_widths:
            _positive("EngineExportConfig", "beam_widths entry", width)
        require(not self.beam_widths or self.beam_width in self.beam_widths, ConfigError,
                f"EngineExportConfig.beam_width {self.beam_width} is the default width and "
                f"must be one of beam_widths {self.beam_widths}")
        value = self.max_request_exclusions
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                ConfigError, f"EngineExportConfig.max_request_exclusions must be an int >= 0, "
                f"got {value!r}")
        require(self.device == "cpu" or self.device.startswith("cuda"), ConfigError,
                f"EngineExportConfig.device must be 'cpu' or 'cuda[:i]', got {self.device!r}")


@dataclass(frozen=True)
class ExportConfig:
    """One SavedModel of the whole pipeline: feature graph -> engine package -> rules.

    A team's export names its files: ``model`` (a Hugging Face Qwen2/Qwen3 folder with its
    ``xgr_model.json``: layout, prompt contract, prefill mask), ``catalog`` (a catalog file,
    ``xgr_checkpoint.catalog_file``) and ``feature_graph`` (the trained reference graph's
    ``.safetensors`` weights or a SavedModel folder, ``xgr_export.feature_graphs``). Without
    ``model`` and ``catalog`` the export is of the synthetic world (``world``) with a randomly
    initialised ``preset``: a smoke test of the toolchain, not a model.

    out: the SavedModel folder (must not exist or be empty).
    mask: the prefill mask; None takes the model card's (item-causal for a preset); given, it
        must equal the card's.
    keep_last, window_days: the prompt contract of a preset export (None: 50 items, 90 days);
        a model's come from its card.
    engine: the search the package serves (beam width, top_k, largest batch, device).
    top_n: items per request after the business rules.
    dtype: engine weights and activations; None: bfloat16 on CUDA, float32 on the CPU.
    attention_backend: "auto" takes the Triton kernels on CUDA when AOTInductor can embed
        them (registered with ``torch.library.triton_op``), else plain torch; "triton" insists.
    layer_kernels: "on" puts the fused layer kernels in the package
        (``torch_engine.kernel_layers``: what ``Engine.recommend`` runs on CUDA; CUDA only,
        they are Triton kernels); "off" (the default) leaves the layer to Inductor, which
        served faster on the H200 (``docs/notes/gpu_serving.md``).
    cache_dir: compiled packages by content hash (None: no cache).
    catalog_headroom: 0 compiles the catalog into the package; >= 1 pads its tables to that
        many times the catalog's sizes and makes them the package's inputs, loaded from a
        tables file: a later catalog within the capacity needs no new package (engine_from).
    engine_from: a SavedModel exported with catalog_headroom whose engine package this export
        reuses (no compile): the catalog and feature graph are this export's, the engine's
        settings (search sizes, device, dtype, backends) the reused one's
        (``xgr_export.catalog_version``).
    verify_requests: after saving, send this many requests (the world's users, or requests
        drawn from the catalog) through the SavedModel in a fresh process (TF + custom_ops
        only) and through the in-process pipeline with the engine in the same dtype.
    prompt_cache: the engine keeps a prompt-KV cache of the version 2 prompt's frozen
        long-term part in TorchCall's runtime (``xgr_export.cached_package``); the signature
        then takes each request's ``user_key``. A catalog version (engine_from) keeps the
        reused package's choice.
    """

    out: str | os.PathLike
    model: str | None = None
    catalog: str | None = None
    feature_graph: str | None = None
    mask: str | None = None
    preset: str = "tiny"
    seed: int = 0
    world: WorldConfig = field(default_factory=WorldConfig)
    keep_last: int | None = None
    window_days: int | None = None
    engine: EngineExportConfig = field(default_factory=lambda: EngineExportConfig(top_k=12))
    top_n: int = 8
    dtype: str | None = None
    attention_backend: str = "auto"
    layer_kernels: str = "off"
    cache_dir: str | None = None
    verify_requests: int = 0
    catalog_headroom: float = 0.0
    engine_from: str | None = None
    prompt_cache: bool = False

    def __post_init__(self) -> None:
        require(isinstance(self.out, (str, os.PathLike)) and str(self.out) != "", ConfigError,
                f"ExportConfig.out must name a folder, got {self.out!r}")
        headroom = self.catalog_headroom
        require(isinstance(headroom, (int, float)) and (headroom == 0 or headroom >= 1),
                ConfigError, f"ExportConfig.catalog_headroom must be 0 (the catalog compiled "
                f"into the package) or >= 1 (tables padded to that many times the catalog's "
                f"sizes), got {headroom!r}")
        require(self.engine_from is None or headroom == 0, ConfigError,
                "ExportConfig.engine_from reuses a package and its catalog capacity: leave "
                "catalog_headroom unset")
        require(self.engine_from is None or not self.prompt_cache, ConfigError,
                "ExportConfig.engine_from reuses a package, with its prompt cache or without: "
                "leave prompt_cache unset")
        _positive("ExportConfig", "top_n", self.top_n)
        for name in ("keep_last", "window_days"):
            if getattr(self, name) is not None:
                _positive("ExportConfig", name, getattr(self, name))
                require(self.model is None, ConfigError,
                        f"ExportConfig.{name} is the model's, from its xgr_model.json: leave it "
                        f"unset with model")
        require((self.model is None) == (self.catalog is None), ConfigError,
                "ExportConfig.model and ExportConfig.catalog go together: a team's checkpoint "
                "serves its own catalog file (neither: the synthetic world and a preset)")
        require(self.feature_graph is None or self.model is not None, ConfigError,
                "ExportConfig.feature_graph needs model and catalog (the synthetic world's "
                "graph is built with it)")
        require(self.model is None or self.feature_graph is not None, ConfigError,
                "ExportConfig.feature_graph must name the trained feature graph (its "
                ".safetensors weights or a SavedModel folder): an untrained profile tower "
                "would serve noise as the soft prompt")
        require(self.mask is None or self.mask in MASKS, ConfigError,
                f"ExportConfig.mask must be one of {MASKS}, got {self.mask!r}")
        require(self.dtype is None or self.dtype in DTYPES, ConfigError,
                f"ExportConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        require(self.attention_backend in ATTENTION_BACKENDS, ConfigError,
                f"ExportConfig.attention_backend must be one of {ATTENTION_BACKENDS}, got "
                f"{self.attention_backend!r}")
        require(not self.engine.beam_widths or self.engine.max_request_exclusions > 0,
                ConfigError, f"ExportConfig.engine.beam_widths {self.engine.beam_widths} are "
                f"chosen through serving_with_controls, which max_request_exclusions 0 leaves "
                f"out")
        require(self.layer_kernels in LAYER_KERNELS, ConfigError,
                f"ExportConfig.layer_kernels must be one of {LAYER_KERNELS}, got "
                f"{self.layer_kernels!r}")
        require(self.layer_kernels != "on" or self.engine.device.startswith("cuda"),
                ConfigError, "ExportConfig.layer_kernels 'on' needs a CUDA export (engine."
                f"device is {self.engine.device!r}): the layer kernels are Triton kernels")
        limit, bound = ((self.world.num_users, "world.num_users") if self.model is None
                        else (MAX_PROBE_REQUESTS, "the probe request limit"))
        require(isinstance(self.verify_requests, int) and
                0 <= self.verify_requests <= limit, ConfigError,
                f"ExportConfig.verify_requests must be in [0, {bound}={limit}], got "
                f"{self.verify_requests!r}")

    @property
    def model_name(self) -> str:
        """The Hugging Face directory, else the preset."""
        return self.model or self.preset

    @property
    def resolved_dtype(self) -> str:
        """``dtype``, or the device's default: bfloat16 on CUDA, float32 on the CPU."""
        if self.dtype is not None:
            return self.dtype
        return "bfloat16" if self.engine.device.startswith("cuda") else "float32"
