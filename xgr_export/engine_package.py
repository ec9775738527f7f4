"""Package ``Engine.recommend`` for the TorchCall op: ``torch.export`` of its device part, then
AOTInductor (or TorchScript) for the target device.

The exported program is ``torch_engine.search.search_features``: the feature graph's tensors
sanitised by the value rules (``xgr_common.value_rules``), then the same search functions
``Engine.recommend`` runs. The host checks of shapes and the one read of the rules' verdict
are not traced; the package's contract records the rules (``rule`` lines) beside its shapes.
Needs torch, never TensorFlow: a GPU machine without TF packages engines too.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace

import torch

from torch_engine.kernel_layers import kernel_model
from torch_engine.search import search_features
from xgr_common.errors import ConfigError, ExportError, require
from xgr_common.layout import MaskMode
from xgr_common.model_card import served_mask
from xgr_common.value_rules import contract_lines
from xgr_export import torch_package
from xgr_export.config import EngineExportConfig

__all__ = ["EngineExportConfig", "RecommendProgram", "example_inputs", "export_engine"]


class DeviceTables(torch.nn.Module):
    """Frozen dataclasses of device tables (the catalog's, the fused selection's exclusion
    tables) held as buffers of the traced module: ``torch.export`` then passes them to the
    program as inputs, where the Triton kernels registered with ``torch.library.triton_op``
    accept them (AOTInductor refuses lifted tensor constants as their arguments). ``get``
    rebuilds a dataclass around the buffers; a tensor shared by two tables is one buffer."""

    def __init__(self, **tables):
        super().__init__()
        self._entries: dict[str, tuple[object, dict] | None] = {}
        names: dict[int, str] = {}
        for key, table in tables.items():
            if table is None:
                self._entries[key] = None
                continue
            slots = {}
            for f in fields(table):
                value = getattr(table, f.name)
                if isinstance(value, torch.Tensor):
                    slots[f.name] = self._buffer(value, names)
                elif (isinstance(value, tuple) and value
                      and all(isinstance(t, torch.Tensor) for t in value)):
                    slots[f.name] = tuple(self._buffer(t, names) for t in value)
            self._entries[key] = (table, slots)

    def _buffer(self, tensor: torch.Tensor, names: dict[int, str]) -> str:
        name = names.get(id(tensor))
        if name is None:
            name = names[id(tensor)] = f"table_{len(names)}"
            self.register_buffer(name, tensor)
        return name

    def get(self, key: str):
        entry = self._entries[key]
        if entry is None:
            return None
        table, slots = entry
        return replace(table, **{
            field: (tuple(getattr(self, n) for n in name) if isinstance(name, tuple)
                    else getattr(self, name)) for field, name in slots.items()})


class RecommendProgram(torch.nn.Module):
    """The traceable body of ``Engine.recommend`` with fixed ``beam_width`` and ``top_k``.

    Inputs (the feature graph's outputs): token_ids int32 [B, L], lengths int32 [B],
    segment_ids int32 [B, L], profile_embeds float32 [B, S, hidden], exclude_items int64
    [B, X] (items the engine must not return, -1 = padding; ``tf_frontend.rules``).
    Returns item_ids int64 [B, top_k] (-1 = no item) and scores float32 [B, top_k].

    prefill_mask: the mask the model was trained with (``xgr_model.json``). Under the causal
    mask the segment ids are taken (the signature stays one for every model) but not read.
    layer_kernels: trace the model as ``Engine.recommend`` runs it on CUDA, through the fused
    layer kernels (``torch_engine.kernel_layers``); off, Inductor fuses the plain layer.
    A sixth input ``beam_slots`` (any dtype, ``[W]``, values unused), when given, sets the
    call's beam width to W instead of ``beam_width``: traced with W dynamic, one program
    serves every width in its range.
    """

    def __init__(self, engine, beam_width: int, top_k: int,
                 prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL, layer_kernels: bool = False):
        super().__init__()
        self.engine = engine
        # Registered, so its weights become package constants (each once).
        self.model = kernel_model(engine.model) if layer_kernels else engine.model
        self.tables = DeviceTables(catalog=engine.catalog, exclusions=engine.runner.exclusions)
        self.beam_width, self.top_k = beam_width, top_k
        self.prefill_mask = served_mask(prefill_mask)

    def forward(self, token_ids, lengths, segment_ids, profile_embeds, exclude_items,
                beam_slots=None):
        engine = self.engine
        if self.prefill_mask is MaskMode.CAUSAL:
            segment_ids = None
        width = self.beam_width if beam_slots is None else beam_slots.shape[0]
        item_ids, scores, _ = search_features(
            self.model, self.tables.get("catalog"), token_ids, lengths, segment_ids,
            profile_embeds, exclude_items, width, self.top_k, engine.options,
            self.tables.get("exclusions"))
        return item_ids, scores.to(torch.float32)


def example_inputs(engine, spec, batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Full-length prompts shaped like the feature graph's outputs for ``spec`` (a
    ``PromptSpec``): BOS, PROFILE_START, a context token, ``spec.keep_last`` history items
    (code path 0, 0, 0; each in its own segment) and the trailing ITEM_START; the first catalog
    item excluded. Full length, because the Triton kernels pick their tiles from the example
    sizes the program is traced with."""
    layout = spec.layout
    first = int(engine.catalog.item_lookup_ids[0])
    item = [layout.item_start_id] + [layout.code_token(level, 0)
                                     for level in range(layout.levels)]
    tokens = [layout.bos_id, layout.profile_start_id, spec.context_token(0)]
    segments = [0, 0, 0]
    for k in range(spec.keep_last):
        tokens += item
        segments += [k + 1] * len(item)
    tokens.append(layout.item_start_id)
    segments.append(spec.keep_last + 1)
    token_ids = torch.tensor([tokens] * batch, dtype=torch.int32)
    lengths = torch.full((batch,), len(tokens), dtype=torch.int32)
    segment_ids = torch.tensor([segments] * batch, dtype=torch.int32)
    embeds = torch.zeros(batch, spec.profile_tokens, engine.model.config.hidden_size)
    # Two columns: torch.export fixes a size-1 example axis, so one column would pin the
    # exclusion width to 1 (the ``exclude`` dim still accepts 1 at run time).
    exclude = torch.tensor([[first, -1]] * batch, dtype=torch.int64)
    return token_ids, lengths, segment_ids, embeds, exclude


def export_engine(engine, spec, out_path: str | os.PathLike,
                  config: EngineExportConfig = EngineExportConfig(),
                  cache_dir: str | os.PathLike | None = None,
                  prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL,
                  layer_kernels: bool = False) -> torch_package.Package:
    """``torch.export`` + AOTInductor of ``engine.recommend`` into ``out_path`` (``.pt2``),
    dynamic in batch (1..max_batch), prompt length and excluded items (1..spec.keep_last + 1
    + config.max_request_exclusions: the history ``tf_frontend.rules.history_exclusion`` emits
    and a request's own exclusions), prefilling with ``prefill_mask``; ``layer_kernels``: the
    fused layer kernels in the package (CUDA)."""
    require(engine.device.type == torch.device(config.device).type, ConfigError,
            f"engine lives on {engine.device}, the export targets {config.device}; move the "
            f"engine first (the package runs where it was compiled)")
    # The host checks of recommend() do not run in the package: check the fixed sizes now.
    catalog = engine.catalog
    for width in config.beam_widths or (config.beam_width,):
        require(width <= engine.config.max_beam_width, ConfigError,
                f"beam_width {width} exceeds EngineConfig.max_beam_width "
                f"{engine.config.max_beam_width}")
        reachable = catalog.reachable_items(width)
        require(config.top_k <= reachable, ConfigError,
                f"top_k {config.top_k} exceeds the {reachable} items beam_width {width} can "
                f"reach (catalog of {catalog.num_items} items, at most "
                f"{catalog.max_items_per_path} per path)")
    program = RecommendProgram(engine, config.beam_width, config.top_k, prefill_mask,
                               layer_kernels)
    # Dim.DYNAMIC lets torch.export derive the prompt lengths the engine's code supports (a
    # named range fails on guards sympy cannot prove, e.g. min(32 + 16 L, 64 + 32 L)).
    batch = torch.export.Dim("batch", min=1, max=config.max_batch)
    length = torch.export.Dim.DYNAMIC
    exclude = torch.export.Dim("exclude", min=1,
                               max=spec.keep_last + 1 + config.max_request_exclusions)
    dynamic = ({0: batch, 1: length}, {0: batch}, {0: batch, 1: length}, {0: batch},
               {0: batch, 1: exclude})
    inputs = example_inputs(engine, spec)
    if config.beam_widths:
        # The width is the length of beam_slots, a dimension torch.export bounds itself.
        inputs += (torch.zeros(config.beam_width, dtype=torch.int8),)
        dynamic += ({0: torch.export.Dim.DYNAMIC},)
    exported = torch_package.export_program(program, inputs, dynamic, config.device)
    if config.beam_widths:
        require_widths_traced(exported, config.beam_widths)
    # token_ids and segment_ids share their length; the trace names them apart (Dim.DYNAMIC),
    # so the contract ties them: a mismatch is refused instead of read out of bounds.
    return torch_package.package_aoti(exported, out_path, config.device, cache_dir,
                                      same_dims=[((0, 1), (2, 1))],
                                      rules=engine_rules(engine, program.prefill_mask),
                                      replay=engine_replay(engine, spec))


def require_widths_traced(exported: torch.export.ExportedProgram,
                          widths: tuple[int, ...]) -> None:
    """Every named width inside the range torch.export derived for ``beam_slots`` (the
    search's shape rules bound it, e.g. by top_k), else ``ExportError`` naming the range;
    then that range narrowed to the named widths' span, which the package's contract (and so
    TorchCall, before anything runs) enforces."""
    from torch.utils._sympy.value_ranges import ValueRanges

    slots = [n for n in exported.graph.nodes if n.op == "placeholder"][-1]
    size = slots.meta["val"].shape[0]
    require(not isinstance(size, int), ExportError,
            f"the traced search fixed its beam width to {size}: it cannot serve {widths}")
    symbol = size.node.expr
    span = exported.range_constraints[symbol]
    low = int(span.lower)
    high = int(span.upper) if span.upper.is_finite else max(widths)
    outside = [w for w in widths if not low <= w <= high]
    require(not outside, ExportError,
            f"beam widths {outside} are outside [{low}, {high}], the widths the traced search "
            f"serves (its shape rules bound them); name widths inside that range")
    exported.range_constraints[symbol] = ValueRanges(min(widths), max(widths))


def engine_replay(engine, spec) -> torch_package.Replay:
    """How TorchCall runs ``RecommendProgram`` on CUDA: ``Engine.recommend``'s buckets
    (``EngineConfig.bucket_policy``: rows to a power of two, the prompt with its soft prefix
    to a multiple of the length bucket, exclusion columns to a power of two), padded as the
    engine pads (one-token rows, empty exclusions: ``lengths`` 1, ``exclude_items`` -1), each
    bucket's search replayed as one CUDA graph. On the CPU every call runs at its own shape."""
    cfg = engine.config
    if engine.device.type != "cuda" or not cfg.cuda_graphs:
        return torch_package.Replay()
    policy = cfg.bucket_policy
    buckets = [torch_package.Bucket(0, 1, policy.length_multiple, spec.profile_tokens),
               torch_package.Bucket(4, 1)]
    if policy.pow2_batch:
        buckets.insert(0, torch_package.Bucket(0, 0))
    return torch_package.Replay(buckets=tuple(buckets), pads=((1, 1), (4, -1)),
                                graphs=cfg.max_graphs)


def engine_rules(engine, prefill_mask: MaskMode) -> list[str]:
    """The value rules of ``RecommendProgram``'s inputs as contract lines, with the input
    positions and the model's limits TorchCall checks them with (segment order only where the
    mask reads segments)."""
    cfg = engine.model.config
    parameters = {"tokens": 0, "lengths": 1, "segments": 2, "embeds": 3, "exclude": 4,
                  "vocab": cfg.vocab_size, "levels": engine.catalog.levels,
                  "max_position": cfg.max_position}
    skip = ("segment_order",) if prefill_mask is MaskMode.CAUSAL else ()
    return contract_lines(parameters, skip, host=True)
