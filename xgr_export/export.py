"""``export_saved_model``: the whole pipeline as one TF SavedModel that embeds the engine.

What a team owns goes in: its checkpoint with ``xgr_model.json`` (``xgr_common.model_card``),
its catalog file (``xgr_checkpoint.catalog_file``) and its trained feature graph
(``xgr_export.feature_graphs``); each is read and checked before the long compile starts. (No
files: the synthetic world and a randomly initialised preset.) Then ``Engine.recommend`` is
packaged with ``torch.export`` + AOTInductor for the target device (``engine_package``, with
the card's prefill mask), feature graph -> TorchCall -> post-processing saved as one
SavedModel (``saved_model``) and, with ``verify_requests``, checked in a fresh process against
the in-process pipeline in the same dtype (``check``). Serve the result with ``xgr serve`` or
TF Serving (op linked in, see ``migration_guide/tf_serving.md``), or load it anywhere with
``import custom_ops`` + ``tf.saved_model.load``.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tf_frontend.feature_graph import features_from_world
from tf_frontend.pipeline_spec import PipelineConfig
from torch_engine.catalog import Catalog, CatalogSize
from torch_engine.config import EngineConfig, engine_config_for, preset
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_checkpoint.catalog_file import read_catalog
from xgr_common.errors import ConfigError, ExportError, require
from xgr_common.layout import MaskMode
from xgr_common.model_card import ModelCard
from xgr_common.prompt_spec import PromptSpec
from xgr_export.cached_package import export_cached_engine
from xgr_export.check import PipelineCheck, check_against_python
from xgr_export.config import ExportConfig
from xgr_export.catalog_version import EngineRecord, link_package, require_codes_kept
from xgr_export.engine_package import (check_search_sizes, exclusion_width, export_engine,
                                       table_tensors, tables_file, write_tables)
from xgr_export.feature_graphs import SavedFeatureGraph, check_contract, load_feature_graph
from xgr_export.probe_requests import probe_features
from xgr_export.saved_model import export_pipeline, require_empty_folder
from xgr_export.torch_package import is_triton_op
from xgr_world.synthetic import make_world

CONTRACT_PROBES = 8   # requests the feature graph is checked with before the compile

__all__ = ["ExportConfig", "ExportReport", "Sources", "build_engine", "export_saved_model",
           "resolve_attention", "resolve_layer_kernels", "resolve_selection",
           "synthetic_sources", "team_sources"]


@dataclass(frozen=True)
class ExportReport:
    """What one export built, how long it took (seconds) and, with ``verify_requests``, how
    the reloaded SavedModel compared (``check``; None when not asked)."""

    saved_model: Path
    engine_signature: str     # the package's calling contract, as TorchCall reads it
    model: str
    catalog: str              # the catalog file, or "synthetic"
    feature_graph: str        # the trained graph's file or folder, or "untrained reference"
    prefill_mask: str
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
    selection_backend: str = "torch"
    layer_kernels: bool = False
    capacity: dict | None = None       # the catalog capacity (None: compiled into the package)
    engine_from: str | None = None     # the SavedModel whose package this export reused
    package_shared: bool = False       # its package file hard-linked, not copied
    prompt_version: int = 1            # the card's prompt contract (xgr_common.prompt_spec)
    prompt_cache: bool = False         # the runtime keeps a prompt-KV cache for the package

    @property
    def ok(self) -> bool:
        """Saved, and equal to the in-process pipeline when that was checked."""
        return self.check is None or self.check.ok

    def to_json(self) -> dict:
        report = {"saved_model": str(self.saved_model), "model": self.model,
                  "catalog": self.catalog, "feature_graph": self.feature_graph,
                  "prefill_mask": self.prefill_mask, "prompt_version": self.prompt_version,
                  "device": self.device, "attention_backend": self.attention_backend,
                  "selection_backend": self.selection_backend,
                  "layer_kernels": self.layer_kernels,
                  "dtype": self.dtype, "num_items": self.num_items,
                  "max_prompt_tokens": self.max_prompt_tokens, "beam_width": self.beam_width,
                  "top_k": self.top_k, "top_n": self.top_n, "torch": self.torch_version,
                  "setup_seconds": self.setup_seconds, "package_seconds": self.package_seconds,
                  "package_bytes": self.package_bytes,
                  "capacity": self.capacity, "engine_from": self.engine_from,
                  "package_shared": self.package_shared, "prompt_cache": self.prompt_cache,
                  "engine_signature": self.engine_signature}
        if self.check is not None:
            report["verify"] = self.check.to_json()
        return report


@dataclass(frozen=True)
class Sources:
    """What an export serves, read and checked before anything compiles: the prompt contract,
    the prefill mask, the catalog arrays, the feature graph, the requests to verify with
    (None when not asked) and the probe requests the SavedModel's warm-up file replays."""

    spec: PromptSpec
    prefill_mask: MaskMode
    item_ids: np.ndarray
    item_codes: np.ndarray
    graph: object
    requests: dict | None
    catalog: str
    feature_graph: str
    probes: dict | None = None


def team_sources(config: ExportConfig) -> Sources:
    """The team's files of ``config``: the model card, the catalog file and the feature graph,
    each refused with an error naming the file and the field or row at fault."""
    card = ModelCard.read(config.model)
    if config.mask is not None:
        require(MaskMode(config.mask) is card.prefill_mask, ConfigError,
                f"mask {config.mask!r} contradicts {config.model}/xgr_model.json prefill_mask "
                f"{card.prefill_mask.value!r}: a model is served with the mask it was trained "
                f"with")
    spec, layout = card.spec, card.spec.layout
    catalog = read_catalog(config.catalog, layout.levels, layout.codebook_size)
    graph = load_feature_graph(config.feature_graph, spec, catalog.item_ids,
                               catalog.item_codes, seed=config.seed)
    probes = probe_features(catalog.item_ids, spec, CONTRACT_PROBES, config.seed)
    check_contract(graph, probes, spec, card.vocab_size, f"feature graph {config.feature_graph}")
    requests = (probe_features(catalog.item_ids, spec, config.verify_requests, config.seed + 1)
                if config.verify_requests else None)
    return Sources(spec=spec, prefill_mask=card.prefill_mask, item_ids=catalog.item_ids,
                   item_codes=catalog.item_codes, graph=graph, requests=requests,
                   catalog=str(config.catalog), feature_graph=str(config.feature_graph),
                   probes=probes)


def synthetic_sources(config: ExportConfig) -> Sources:
    """The synthetic world's catalog and users, the reference graph with an untrained tower."""
    world = make_world(config.world)
    default = PromptSpec()
    spec = PromptSpec(model_hidden=preset(config.preset).hidden_size,
                      keep_last=config.keep_last or default.keep_last,
                      window_seconds=(config.window_days * 86400 if config.window_days
                                      else default.window_seconds))
    graph = load_feature_graph(None, spec, world.item_ids, world.item_codes, seed=config.seed)
    requests = (features_from_world(world, slice(0, config.verify_requests))
                if config.verify_requests else None)
    probes = features_from_world(world, slice(0, min(CONTRACT_PROBES, config.world.num_users)))
    return Sources(spec=spec, prefill_mask=MaskMode(config.mask or "item_causal"),
                   item_ids=world.item_ids, item_codes=world.item_codes, graph=graph,
                   requests=requests, catalog="synthetic", feature_graph="untrained reference",
                   probes=probes)


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
    import torch_engine.kernels.paged_attention  # noqa: F401  (and the prompt cache's)

    embeddable = all(is_triton_op(name) for name in
                     ("xgr::decode_attention", "xgr::prefill_attention",
                      "xgr::paged_prefill_attention", "xgr::paged_decode_attention"))
    return "triton" if embeddable else "torch"


# The fused selection's ops: the package holds them when each is a torch.library.triton_op.
FUSED_SELECTION_OPS = ("xgr::constrained_topk", "xgr::excluded_rows", "xgr::exhausted_prefixes",
                       "xgr::expand_items")


def resolve_selection(device: str) -> str:
    """The beam selection to export: on CUDA the fused selection, exclusion and item-expansion
    kernels (what ``Engine.recommend`` runs there) when AOTInductor can embed them; elsewhere,
    and on a CPU package, the plain-torch selection."""
    if not device.startswith("cuda"):
        return "torch"
    import torch_engine.kernels.exclusions  # noqa: F401  (registers the xgr:: ops)
    import torch_engine.kernels.item_expansion  # noqa: F401

    return "triton" if all(is_triton_op(name) for name in FUSED_SELECTION_OPS) else "torch"


def resolve_layer_kernels(requested: str, device: str) -> bool:
    """Whether the package runs the fused layer kernels (``torch_engine.kernel_layers``):
    ``on`` for CUDA (``ExportConfig`` refuses it for the CPU), when AOTInductor can embed
    them (each a ``torch.library.triton_op``); ``off`` never."""
    if requested == "off" or not device.startswith("cuda"):
        return False
    from torch_engine.kernels.layer_ops import LAYER_OPS

    require(all(is_triton_op(name) for name in LAYER_OPS), ExportError,
            f"layer_kernels 'on': AOTInductor cannot embed {LAYER_OPS} here (not all are "
            f"torch.library.triton_op in torch {torch.__version__})")
    return True


def build_engine(config: ExportConfig, sources: Sources, attention: str,
                 selection: str) -> Engine:
    """The engine an export packages (and checks against): the model, the catalog of
    ``sources``, the resolved attention and selection backends."""
    device, dtype = torch.device(config.engine.device), getattr(torch, config.resolved_dtype)
    model = (Model.from_pretrained(config.model, dtype=dtype, device=device) if config.model
             else Model.from_preset(config.preset, seed=config.seed, dtype=dtype, device=device))
    catalog = Catalog.from_arrays(sources.item_ids, sources.item_codes, sources.spec.layout)
    return Engine(model, catalog, engine_config_for(
        sources.spec, attention_backend=attention, selection_backend=selection,
        max_exclude=max(EngineConfig().max_exclude,
                        exclusion_width(sources.spec, config.engine)),
        max_graphs=config.engine.cuda_graphs))


def pipeline_config_for(config: ExportConfig, spec, prompt_cache: bool) -> PipelineConfig:
    """The SavedModel's pipeline settings: the export's search and lists, and a server that
    accepts history rows of up to twice what the card keeps (the default guard, or more for a
    card that keeps a long history: a full history must never be refused)."""
    search = config.engine
    return PipelineConfig(top_n=config.top_n,
                          max_request_exclusions=search.max_request_exclusions,
                          beam_widths=search.beam_widths,
                          beam_width=search.beam_width if search.beam_widths else None,
                          prompt_cache=prompt_cache,
                          max_history_events=max(PipelineConfig().max_history_events,
                                                 2 * spec.max_history_items + 2))


def export_saved_model(config: ExportConfig,
                       progress: Callable[[str], None] = lambda line: None) -> ExportReport:
    """Reads and checks the sources, builds, packages, saves and (with
    ``config.verify_requests``) checks one SavedModel in ``config.out``; ``progress`` hears a
    line per phase. Raises ``ExportError``, ``ConfigError`` or ``CatalogError`` (naming the
    file, field or size at fault) before anything is saved."""
    out = require_empty_folder(config.out)
    started = time.perf_counter()
    reused = EngineRecord.read(config.engine_from) if config.engine_from else None
    if reused is not None:   # the engine as the reused package was built
        config = replace(config, engine=reused.engine, dtype=reused.dtype,
                         attention_backend=reused.attention_backend,
                         layer_kernels=reused.layer_kernels, mask=reused.prefill_mask)
    attention = resolve_attention(config.attention_backend, config.engine.device)
    selection = resolve_selection(config.engine.device)
    layer_kernels = resolve_layer_kernels(config.layer_kernels, config.engine.device)
    progress(f"reading {'the team files' if config.model else 'the synthetic world'} ...")
    sources = team_sources(config) if config.model else synthetic_sources(config)
    engine = build_engine(config, sources, attention, selection)
    spec = sources.spec
    capacity = catalog_capacity(config, reused, sources, engine.catalog.size)
    if capacity is not None:
        # The engine over the padded catalog, padded once: the package reads these tables and
        # the verification searches them (a padded search equals Engine.recommend over them).
        engine = Engine(engine.model, engine.catalog.padded(capacity), engine.config)
    setup_seconds = time.perf_counter() - started
    search = config.engine
    prompt_cache = (config.prompt_cache if reused is None
                    else reused.package.cache_runtime is not None)
    pipeline_config = pipeline_config_for(config, spec, prompt_cache)
    with tempfile.TemporaryDirectory(prefix="xgr_export_") as tmp:
        started = time.perf_counter()
        if reused is None:
            progress(f"exporting Engine.recommend ({config.model_name}, {engine.dtype}, "
                     f"{attention} attention, {selection} selection, "
                     f"{'fused layer kernels' if layer_kernels else 'Inductor layers'}, "
                     f"{sources.prefill_mask.value} mask, beam_width {search.beam_width}, "
                     f"top_k {search.top_k}{', prompt cache' if prompt_cache else ''}) for "
                     f"{search.device}; AOTInductor takes a while ...")
            build = export_cached_engine if prompt_cache else export_engine
            package = build(engine, spec, Path(tmp) / "engine.pt2", search, config.cache_dir,
                            sources.prefill_mask, layer_kernels, capacity)
            tables = tables_file(package.path) if capacity is not None else None
        else:
            progress(f"reusing the engine package of {config.engine_from}; writing the new "
                     f"catalog's tables ...")
            check_search_sizes(engine, search)
            package = reused.package
            named = table_tensors(engine, capacity)
            require(tuple(named) == package.tables, ExportError,
                    f"the engine here builds the tables {tuple(named)}, the reused package "
                    f"reads {package.tables}: export on a machine like the first export's")
            tables = write_tables(Path(tmp) / reused.tables.name, named, capacity,
                                  engine.catalog)
        package_seconds = time.perf_counter() - started
        package_bytes = package.path.stat().st_size
        # The probe requests become the warm-up file: a server replays them before the version
        # serves (a package that does not load never serves; each batch size's bucket is
        # captured before the first client).
        saved = export_pipeline(out, sources.graph, package, pipeline_config,
                                warmup_features=sources.probes, tables=tables)
        shared = False
        if capacity is not None:
            EngineRecord(saved, replace(package, path=saved / "assets" / package.path.name),
                         saved / "assets" / tables.name, capacity, search, config.resolved_dtype,
                         attention, "on" if layer_kernels else "off",
                         sources.prefill_mask.value).write()
        if reused is not None:
            shared = link_package(saved / "assets" / package.path.name, reused.package.path)
    check = None
    if sources.requests is not None:
        progress(f"verifying {config.verify_requests} requests in a fresh process ...")
        graph = (sources.graph.reloaded() if isinstance(sources.graph, SavedFeatureGraph)
                 else sources.graph)
        check = check_against_python(saved, graph, engine, pipeline_config,
                                     sources.requests, search.beam_width, search.top_k,
                                     sources.prefill_mask)
    return ExportReport(
        saved_model=saved, engine_signature=package.signature, model=config.model_name,
        catalog=sources.catalog, feature_graph=sources.feature_graph,
        prefill_mask=sources.prefill_mask.value, device=search.device,
        attention_backend=attention, selection_backend=selection, layer_kernels=layer_kernels,
        dtype=str(engine.dtype).removeprefix("torch."),
        num_items=len(sources.item_ids), max_prompt_tokens=spec.max_prompt_tokens,
        prompt_version=spec.version,
        beam_width=search.beam_width, top_k=search.top_k, top_n=config.top_n,
        torch_version=torch.__version__, setup_seconds=setup_seconds,
        package_seconds=package_seconds, package_bytes=package_bytes, check=check,
        capacity=None if capacity is None else capacity.to_json(),
        engine_from=config.engine_from, package_shared=shared, prompt_cache=prompt_cache)


def catalog_capacity(config: ExportConfig, reused: EngineRecord | None, sources: Sources,
                     size: CatalogSize) -> CatalogSize | None:
    """The catalog capacity of the package: the reused package's (the new catalog checked
    against the served catalog's codes; padding to it checks the sizes), the catalog's
    ``size`` grown by ``catalog_headroom``, or None (the catalog compiled into the package)."""
    if reused is not None:
        require_codes_kept(*reused.source_catalog(), sources.item_ids, sources.item_codes)
        return reused.capacity
    if not config.catalog_headroom:
        return None
    return CatalogSize.with_headroom(size, float(config.catalog_headroom),
                                     sources.spec.layout.codebook_size)
