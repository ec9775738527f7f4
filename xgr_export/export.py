"""``export_saved_model``: the whole pipeline as one TF SavedModel that embeds the engine.

Builds the synthetic world's catalog and feature graph and an engine (a Hugging Face
directory, else a randomly initialised preset), packages ``Engine.recommend`` with
``torch.export`` + AOTInductor for the target device (``xgr_export.engine_package``), saves
feature graph -> TorchCall -> post-processing as one SavedModel (``xgr_export.saved_model``)
and, with ``verify_requests``, checks it in a fresh process against the in-process pipeline
(``xgr_export.check``). Serve the result with ``xgr serve`` or TF Serving (op linked in, see
``migration_guide/tf_serving.md``), or load it anywhere with ``import custom_ops`` +
``tf.saved_model.load``.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from tf_frontend.feature_graph import FeatureGraph
from tf_frontend.pipeline_spec import PipelineConfig
from torch_engine.catalog import Catalog
from torch_engine.config import EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.prompt_spec import PromptSpec
from xgr_export.check import PipelineCheck, check_against_python
from xgr_export.config import ExportConfig
from xgr_export.engine_package import export_engine
from xgr_export.saved_model import export_pipeline, require_empty_folder
from xgr_export.torch_package import is_triton_op
from xgr_world.synthetic import make_world

__all__ = ["ExportConfig", "ExportReport", "export_saved_model", "resolve_attention"]


@dataclass(frozen=True)
class ExportReport:
    """What one export built, how long it took (seconds) and, with ``verify_requests``, how
    the reloaded SavedModel compared (``check``; None when not asked)."""

    saved_model: Path
    engine_signature: str     # the package's calling contract, as TorchCall reads it
    model: str
    device: str
    attention_backend: str
    dtype: str
    num_items: int
    max_prompt_tokens: int
    beam_width: int
    top_k: int
    top_n: int
    torch_version: str
    setup_seconds: float
    package_seconds: float
    package_bytes: int
    check: PipelineCheck | None = None

    @property
    def ok(self) -> bool:
        """Saved, and equal to the in-process pipeline when that was checked."""
        return self.check is None or self.check.ok

    def to_json(self) -> dict:
        report = {"saved_model": str(self.saved_model), "preset": self.model,
                  "device": self.device, "attention_backend": self.attention_backend,
                  "dtype": self.dtype, "num_items": self.num_items,
                  "max_prompt_tokens": self.max_prompt_tokens, "beam_width": self.beam_width,
                  "top_k": self.top_k, "top_n": self.top_n, "torch": self.torch_version,
                  "setup_seconds": self.setup_seconds, "package_seconds": self.package_seconds,
                  "package_bytes": self.package_bytes,
                  "engine_signature": self.engine_signature}
        if self.check is not None:
            report["verify"] = self.check.to_json()
        return report


def resolve_attention(requested: str, device: str) -> str:
    """The attention backend to export: ``auto`` takes the Triton kernels on CUDA, in every
    dtype, when the package can embed them (registered with ``torch.library.triton_op``): the
    plain-torch attention graph is much larger for Inductor's single-threaded front end, so
    its compile takes far longer."""
    if requested != "auto":
        return requested
    if not device.startswith("cuda"):
        return "torch"
    import torch_engine.kernels  # noqa: F401  (registers the xgr:: ops)

    embeddable = all(is_triton_op(name) for name in
                     ("xgr::decode_attention", "xgr::prefill_attention"))
    return "triton" if embeddable else "torch"


def _build_engine(config: ExportConfig, world, attention: str) -> Engine:
    device, dtype = torch.device(config.engine.device), getattr(torch, config.dtype)
    model = (Model.from_pretrained(config.model, dtype=dtype, device=device) if config.model
             else Model.from_preset(config.preset, seed=config.seed, dtype=dtype, device=device))
    # The plain-torch selection: the fused one is a Python custom op, which AOTInductor cannot
    # put in the package.
    return Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes),
                  EngineConfig(attention_backend=attention, selection_backend="torch"))


def export_saved_model(config: ExportConfig,
                       progress: Callable[[str], None] = lambda line: None) -> ExportReport:
    """Builds, packages, saves and (with ``config.verify_requests``) checks one SavedModel in
    ``config.out``; ``progress`` hears one line before the long compile. Raises ``ExportError``
    or ``ConfigError`` (naming the size or setting at fault) before anything is saved."""
    out = require_empty_folder(config.out)
    started = time.perf_counter()
    attention = resolve_attention(config.attention_backend, config.engine.device)
    world = make_world(config.world)
    engine = _build_engine(config, world, attention)
    spec = PromptSpec(model_hidden=engine.model.config.hidden_size, keep_last=config.keep_last,
                      window_seconds=config.window_days * 86400)
    setup_seconds = time.perf_counter() - started
    search = config.engine
    progress(f"exporting Engine.recommend ({config.model_name}, {attention} attention, "
             f"beam_width {search.beam_width}, top_k {search.top_k}) for {search.device}; "
             f"AOTInductor takes a while ...")
    pipeline_config = PipelineConfig(top_n=config.top_n)
    graph = FeatureGraph(spec, world.item_ids, world.item_codes, seed=config.seed)
    with tempfile.TemporaryDirectory(prefix="xgr_export_") as tmp:
        started = time.perf_counter()
        package = export_engine(engine, spec, Path(tmp) / "engine.pt2", search, config.cache_dir)
        package_seconds = time.perf_counter() - started
        package_bytes = package.path.stat().st_size
        saved = export_pipeline(out, graph, package, pipeline_config)
    check = None
    if config.verify_requests:
        check = check_against_python(saved, graph, engine, pipeline_config, world,
                                     config.verify_requests, search.beam_width, search.top_k)
    return ExportReport(
        saved_model=saved, engine_signature=package.signature, model=config.model_name,
        device=search.device, attention_backend=attention,
        dtype=str(engine.dtype).removeprefix("torch."), num_items=config.world.num_items,
        max_prompt_tokens=spec.max_prompt_tokens, beam_width=search.beam_width,
        top_k=search.top_k, top_n=config.top_n, torch_version=torch.__version__,
        setup_seconds=setup_seconds, package_seconds=package_seconds,
        package_bytes=package_bytes, check=check)
