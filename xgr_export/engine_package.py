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
from pathlib import Path

import torch

from torch_engine.beam_search import fused_exclusion_tables
from torch_engine.kernel_layers import kernel_model
from torch_engine.search import search_features
from xgr_common.errors import ConfigError, ExportError, require
from xgr_common.layout import MaskMode
from xgr_common.model_card import served_mask
from xgr_common.value_rules import contract_lines
from xgr_export import torch_package
from xgr_export.config import EngineExportConfig

__all__ = ["EngineExportConfig", "RecommendProgram", "example_inputs", "export_engine",
           "table_tensors", "tables_file", "write_tables", "read_tables_source"]


class DeviceTables(torch.nn.Module):
    """Frozen dataclasses of device tables (the catalog's, the fused selection's exclusion
    tables), each tensor once (a tensor shared by two tables is one entry).

    By default they are buffers of the traced module: ``torch.export`` passes them to the
    program as inputs, where the Triton kernels registered with ``torch.library.triton_op``
    accept them (AOTInductor refuses lifted tensor constants as their arguments), and the
    package holds them as constants. ``as_inputs``: they are the program's last inputs instead
    (``names`` in order, ``tensors`` the values to export with), so the package holds none and
    serves any tables of the same sizes. ``get`` rebuilds a dataclass around either."""

    def __init__(self, as_inputs: bool = False, **tables):
        super().__init__()
        self._entries: dict[str, tuple[object, dict] | None] = {}
        self._as_inputs = as_inputs
        self._values: dict[str, torch.Tensor] = {}
        self.names: list[str] = []
        names: dict[int, str] = {}
        for key, table in tables.items():
            if table is None:
                self._entries[key] = None
                continue
            slots = {}
            for f in fields(table):
                value = getattr(table, f.name)
                label = f"{key}.{f.name}"
                if isinstance(value, torch.Tensor):
                    slots[f.name] = self._entry(value, names, label)
                elif (isinstance(value, tuple) and value
                      and all(isinstance(t, torch.Tensor) for t in value)):
                    slots[f.name] = tuple(self._entry(t, names, f"{label}.{i}")
                                          for i, t in enumerate(value))
            self._entries[key] = (table, slots)

    def _entry(self, tensor: torch.Tensor, names: dict[int, str], label: str) -> str:
        name = names.get(id(tensor))
        if name is None:
            name = names[id(tensor)] = label if self._as_inputs else f"table_{len(names)}"
            self.names.append(name)
            if self._as_inputs:
                self._values[name] = tensor
            else:
                self.register_buffer(name, tensor)
        return name

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tables by name, in input order (``as_inputs``)."""
        return dict(self._values)

    def get(self, key: str, bound: dict[str, torch.Tensor] | None = None):
        """The ``key`` dataclass over the buffers, or over ``bound`` (name -> the program's
        table input)."""
        entry = self._entries[key]
        if entry is None:
            return None
        table, slots = entry
        look = bound.__getitem__ if bound is not None else lambda n: getattr(self, n)
        return replace(table, **{
            field: (tuple(look(n) for n in name) if isinstance(name, tuple) else look(name))
            for field, name in slots.items()})


class RecommendProgram(torch.nn.Module):
    """The traceable body of ``Engine.recommend`` with fixed ``beam_width`` and ``top_k``.

    Inputs (the feature graph's outputs): token_ids int32 [B, L], lengths int32 [B],
    segment_ids int32 [B, L], profile_embeds float32 [B, S, hidden], exclude_items int64
    [B, X] (items the engine must not return, -1 = padding; ``tf_frontend.rules``).
    Returns item_ids int64 [B, top_k] (-1 = no item) and scores float32 [B, top_k].

    The profile vectors go where ``engine.config.soft_marker`` says: before the tokens
    (prompt version 1) or at the rows' SOFT markers (version 2).

    prefill_mask: the mask the model was trained with (``xgr_model.json``). Under the causal
    mask the segment ids are taken (the signature stays one for every model) but not read.
    layer_kernels: trace the model as ``Engine.recommend`` runs it on CUDA, through the fused
    layer kernels (``torch_engine.kernel_layers``); off, Inductor fuses the plain layer.
    A sixth input ``beam_slots`` (any dtype, ``[W]``, values unused), when given, sets the
    call's beam width to W instead of ``beam_width``: traced with W dynamic, one program
    serves every width in its range.
    capacity: the catalog padded to these sizes (``torch_engine.catalog.CatalogSize``) and its
    tables taken as a last input ``tables`` (a tuple in ``self.tables.names`` order) instead of
    held as constants: the package then serves any catalog within the capacity. None: the
    engine's catalog is part of the package.
    """

    def __init__(self, engine, beam_width: int, top_k: int,
                 prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL, layer_kernels: bool = False,
                 capacity=None):
        super().__init__()
        self.engine = engine
        # Registered, so its weights become package constants (each once).
        self.model = kernel_model(engine.model) if layer_kernels else engine.model
        catalog, exclusions = catalog_tables(engine, capacity)
        self.tables = DeviceTables(as_inputs=capacity is not None, catalog=catalog,
                                   exclusions=exclusions)
        self.capacity = capacity
        self.beam_width, self.top_k = beam_width, top_k
        self.prefill_mask = served_mask(prefill_mask)

    def search_arguments(self, segment_ids, beam_slots, tables):
        """What every program's search takes beside the inputs: the segment ids (None under
        the causal mask), the beam width, the catalog and exclusion tables (held, or bound
        from the ``tables`` input)."""
        if self.prefill_mask is MaskMode.CAUSAL:
            segment_ids = None
        width = self.beam_width if beam_slots is None else beam_slots.shape[0]
        bound = None if tables is None else dict(zip(self.tables.names, tables))
        return (segment_ids, width, self.tables.get("catalog", bound),
                self.tables.get("exclusions", bound))

    def forward(self, token_ids, lengths, segment_ids, profile_embeds, exclude_items,
                beam_slots=None, tables=None):
        engine = self.engine
        segment_ids, width, catalog, exclusions = self.search_arguments(
            segment_ids, beam_slots, tables)
        item_ids, scores, _ = search_features(
            self.model, catalog, token_ids, lengths, segment_ids, profile_embeds,
            exclude_items, width, self.top_k, engine.options, exclusions,
            engine.config.soft_marker)
        return item_ids, scores.to(torch.float32)


def catalog_tables(engine, capacity=None):
    """The catalog and the fused selection's exclusion tables (None without the fused
    selection) a package searches: the engine's own, or padded to ``capacity``."""
    if capacity is None:
        return engine.catalog, engine.runner.exclusions
    catalog = engine.catalog.padded(capacity)
    if catalog is engine.catalog or engine.runner.exclusions is None:   # built for it already
        return catalog, engine.runner.exclusions
    return catalog, fused_exclusion_tables(catalog)


def table_tensors(engine, capacity) -> dict[str, torch.Tensor]:
    """The tables file's tensors of ``engine``'s catalog padded to ``capacity``: the names and
    sizes a package exported with that capacity reads."""
    catalog, exclusions = catalog_tables(engine, capacity)
    return DeviceTables(as_inputs=True, catalog=catalog, exclusions=exclusions).tensors()


def example_inputs(engine, spec, batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Full-length prompts shaped like the feature graph's outputs for ``spec`` (a
    ``PromptSpec``; ``example_row``), every row alike; the profile vectors zero; the first
    catalog item excluded. Full length, because the Triton kernels pick their tiles from the
    example sizes the program is traced with."""
    tokens, segments = example_row(spec)
    token_ids = torch.tensor([tokens] * batch, dtype=torch.int32)
    lengths = torch.full((batch,), len(tokens), dtype=torch.int32)
    segment_ids = torch.tensor([segments] * batch, dtype=torch.int32)
    embeds = torch.zeros(batch, spec.profile_tokens, engine.model.config.hidden_size)
    first = int(engine.catalog.item_lookup_ids[0])
    # Two columns: torch.export fixes a size-1 example axis, so one column would pin the
    # exclusion width to 1 (the ``exclude`` dim still accepts 1 at run time).
    exclude = torch.tensor([[first, -1]] * batch, dtype=torch.int64)
    return token_ids, lengths, segment_ids, embeds, exclude


def example_row(spec, code: int = 0) -> tuple[list[int], list[int]]:
    """(tokens, segment ids) of the longest row the feature graph emits for ``spec``, every
    item on code path ``code``. Version 1: BOS, PROFILE_START, a context token, ``keep_last``
    items (each in its own segment), the trailing ITEM_START. Version 2
    (``XgrAssemblePromptV2``'s layout): BOS and the intro, the long-term items, the profile
    block (its text, the SOFT markers, PROFILE_START, a context token, its text), the recent
    items, the question and the trailing ITEM_START."""
    layout = spec.layout
    item = [layout.item_start_id] + [layout.code_token(level, code)
                                     for level in range(layout.levels)]
    if spec.prompt_v2 is None:
        tokens, segments = [layout.bos_id, layout.profile_start_id, spec.context_token(0)], \
            [0, 0, 0]
        for k in range(spec.keep_last):
            tokens += item
            segments += [k + 1] * len(item)
        return tokens + [layout.item_start_id], segments + [spec.keep_last + 1]
    split, spans = spec.prompt_v2.split, spec.prompt_v2.spans
    tokens = [layout.bos_id, *spans.intro]
    segments = [0] * len(tokens)
    segment = 0
    for _ in range(split.long_term_items):
        segment += 1
        tokens += item
        segments += [segment] * len(item)
    segment += 1
    profile = [*spans.before_profile, *[layout.soft_id] * spec.profile_tokens,
               layout.profile_start_id, spec.context_token(0), *spans.before_recent]
    tokens += profile
    segments += [segment] * len(profile)
    for _ in range(split.recent_items):
        segment += 1
        tokens += item
        segments += [segment] * len(item)
    segment += 1
    tail = [*spans.question, layout.item_start_id]
    return tokens + tail, segments + [segment] * len(tail)


def export_engine(engine, spec, out_path: str | os.PathLike,
                  config: EngineExportConfig = EngineExportConfig(),
                  cache_dir: str | os.PathLike | None = None,
                  prefill_mask: MaskMode = MaskMode.ITEM_CAUSAL,
                  layer_kernels: bool = False, capacity=None) -> torch_package.Package:
    """``torch.export`` + AOTInductor of ``engine.recommend`` into ``out_path`` (``.pt2``),
    dynamic in batch (1..max_batch), prompt length (up to ``token_bound``) and excluded
    items (1..``exclusion_width``), prefilling with ``prefill_mask``; ``layer_kernels``: the
    fused layer kernels in the package (CUDA). ``capacity`` (a ``CatalogSize``): the catalog's
    tables become inputs padded to it, written to ``tables_file(out_path)``
    (``write_tables``), so a new catalog within it needs no new package."""
    check_engine_for_export(engine, spec, config)
    program = RecommendProgram(engine, config.beam_width, config.top_k, prefill_mask,
                               layer_kernels, capacity)
    dynamic = dynamic_inputs(spec, config, token_bound(engine))
    inputs = example_inputs(engine, spec)
    if config.beam_widths:
        # The width is the length of beam_slots, a dimension torch.export bounds itself.
        inputs += (torch.zeros(config.beam_width, dtype=torch.int8),)
        dynamic += ({0: torch.export.Dim.DYNAMIC},)
    elif capacity is not None:
        inputs, dynamic = inputs + (None,), dynamic + (None,)
    if capacity is not None:
        tables = tuple(program.tables.tensors().values())
        inputs += (tables,)
        dynamic += (tuple(None for _ in tables),)
    exported = torch_package.export_program(program, inputs, dynamic, config.device)
    if config.beam_widths:
        require_widths_traced(exported, config.beam_widths)
    # token_ids and segment_ids share their length; the trace names them apart (Dim.DYNAMIC),
    # so the contract ties them: a mismatch is refused instead of read out of bounds.
    package = torch_package.package_aoti(
        exported, out_path, config.device, cache_dir, same_dims=[((0, 1), (2, 1))],
        rules=engine_rules(engine, program.prefill_mask), replay=engine_replay(engine, spec),
        tables=tuple(program.tables.names) if capacity is not None else ())
    require_served_sizes(package, spec, config)
    if capacity is not None:
        write_tables(tables_file(out_path), program.tables.tensors(), capacity, engine.catalog)
    return package


def require_served_sizes(package: torch_package.Package, spec,
                         config: EngineExportConfig) -> None:
    """``ExportError`` unless the package's contract takes the largest sizes the feature graph
    sends it: ``config.max_batch`` rows, prompts of ``spec.max_prompt_tokens`` and exclusion
    rows of the card's whole history plus a request's own exclusions. A narrower range would
    refuse a valid request when served; the export refuses it instead."""
    ranges = {name: (lo, hi) for name, lo, hi in package.ranges}
    widest = exclusion_width(spec, config)
    for label, (index, dim), need in (("batch", (0, 0), config.max_batch),
                                      ("prompt length", (0, 1), spec.max_prompt_tokens),
                                      ("exclusion row", (4, 1), widest)):
        size = package.inputs[index].dims[dim]
        lo, hi = (size, size) if isinstance(size, int) else ranges.get(size, (None, None))
        require(hi is not None and lo <= need <= hi, ExportError,
                f"the package takes a {label} of {lo}..{hi} (input {index} dim {dim}), the "
                f"feature graph can send {need}: a request of that size would be refused "
                f"when served")


def check_engine_for_export(engine, spec, config: EngineExportConfig) -> None:
    """What an export checks of its engine before the trace: the soft vectors placed as the
    card's prompt version places them, the engine on the target's device type, the card's
    longest prompt within the model's positions and its history within the engine's
    exclusion width, the search sizes (``check_search_sizes``); ``ConfigError`` naming the
    mismatch."""
    marker = spec.layout.soft_id if spec.version == 2 else None
    require(engine.config.soft_marker == marker, ConfigError,
            f"the model's card says prompt version {spec.version}, whose soft vectors go "
            f"{'at the SOFT markers' if marker is not None else 'before the tokens'}; the "
            f"engine has EngineConfig.soft_marker={engine.config.soft_marker} (build it with "
            f"torch_engine.config.engine_config_for(spec))")
    require(engine.device.type == torch.device(config.device).type, ConfigError,
            f"engine lives on {engine.device}, the export targets {config.device}; move the "
            f"engine first (the package runs where it was compiled)")
    # TorchCall's positions rule, for the longest row the graph emits: a card whose prompts
    # the model cannot hold would refuse its users' full histories when served.
    levels, max_position = engine.catalog.levels, engine.model.config.max_position
    positions = spec.profile_tokens + spec.max_prompt_tokens + levels - 1
    require(positions <= max_position, ConfigError,
            f"the card's longest prompt ({spec.max_prompt_tokens} tokens) with its "
            f"{spec.profile_tokens} soft tokens and {levels - 1} generated codes needs "
            f"{positions} positions; the model has max_position {max_position}: keep fewer "
            f"history items in the card or serve a model with a longer context")
    widest = exclusion_width(spec, config)
    require(widest <= engine.config.max_exclude, ConfigError,
            f"a request may exclude {widest} items (the card's {spec.max_history_items} history "
            f"items, a padding column and max_request_exclusions="
            f"{config.max_request_exclusions}); the engine takes at most "
            f"EngineConfig.max_exclude={engine.config.max_exclude}")
    check_search_sizes(engine, config)


def exclusion_width(spec, config: EngineExportConfig) -> int:
    """The widest ``exclude_items`` row a served request sends the package: the card's whole
    history (``tf_frontend.rules.history_exclusion``), its padding column and a request's own
    exclusions."""
    return spec.max_history_items + 1 + config.max_request_exclusions


# Upper bounds of the dimensions the runtime sizes per call. AOTInductor gives a kernel 32-bit
# indexing when its sizes have no upper bound and the trace's example fits in 2**31 elements,
# and a served size past that (a prompt-KV pool over 4 GiB in 16 bits, a long batch's packed
# KV) then reads and writes out of bounds on the device. With a bound, it keeps 32 bits where
# the bound proves they suffice and takes 64 bits wherever the bound can pass 2**31.
MAX_POOL_PAGES = 1 << 24       # a billion cached tokens: past any device's memory


def bounded_dim(max_size: int):
    """A dimension ``torch.export`` derives itself (``Dim.DYNAMIC``: the engine's code
    refines it with guards a named range cannot state, e.g. min(32 + 16 L, 64 + 32 L)), with
    a finite upper bound (see ``MAX_POOL_PAGES``)."""
    return torch.export.Dim.DYNAMIC(max=max_size)


def token_bound(engine) -> int:
    """The widest token dimension a served call can have (prompt, suffix, block table): the
    model's positions, which TorchCall's positions rule already holds every prompt within."""
    return engine.model.config.max_position


def dynamic_inputs(spec, config: EngineExportConfig, max_tokens: int) -> tuple[dict, ...]:
    """``torch.export``'s dynamic dimensions of the five engine inputs: the batch up to
    ``config.max_batch``, the prompt length up to ``max_tokens`` (``token_bound``), the
    excluded items (the history and a request's own)."""
    batch = torch.export.Dim("batch", min=1, max=config.max_batch)
    length = bounded_dim(max_tokens)
    exclude = torch.export.Dim("exclude", min=1, max=exclusion_width(spec, config))
    return ({0: batch, 1: length}, {0: batch}, {0: batch, 1: length}, {0: batch},
            {0: batch, 1: exclude})


def check_search_sizes(engine, config: EngineExportConfig) -> None:
    """The host checks of ``recommend()`` that the package does not run, for its fixed sizes:
    each width within the engine's limit and able to reach ``top_k`` items of the engine's
    catalog (its real sizes); ``ConfigError`` names the width and the bound."""
    catalog = engine.catalog
    for width in config.beam_widths or (config.beam_width,):
        require(width <= engine.config.max_beam_width, ConfigError,
                f"beam_width {width} exceeds EngineConfig.max_beam_width "
                f"{engine.config.max_beam_width}")
        reachable = catalog.reachable_items(width)
        require(config.top_k <= reachable, ConfigError,
                f"top_k {config.top_k} exceeds the {reachable} items beam_width {width} can "
                f"reach (catalog of {catalog.size.items} items, at most "
                f"{catalog.size.items_per_path} per path)")


def tables_file(package_path: str | os.PathLike) -> Path:
    """Where a package's tables file lives: beside it, ``<name>.tables.pt``."""
    package_path = Path(package_path)
    return package_path.with_name(f"{package_path.stem}.tables.pt")


def write_tables(path: str | os.PathLike, tables: dict[str, torch.Tensor], capacity,
                 catalog) -> Path:
    """The tables file TorchCall loads (``torch.save`` of name -> tensor, read in C++ by
    ``torch::jit::pickle_load``): the padded tables, each its own compact CPU copy; beside
    them, for the next catalog version's checks, the capacity (``capacity`` JSON) and the real
    catalog as ``source.item_ids`` / ``source.item_codes``."""
    import json

    import numpy as np

    real = catalog.unpadded().to("cpu")
    rows = real.item_lookup_rows
    ids = real.item_lookup_ids
    codes = np.empty((ids.shape[0], catalog.levels), dtype=np.int64)
    # Each item's path from its row in path_items: the path index by binary search, then its
    # codes up the prefix chain.
    prefix = torch.searchsorted(real.path_indptr, rows, right=True) - 1
    for level in reversed(range(catalog.levels)):
        codes[:, level] = real.level_codes[level][prefix].numpy()
        prefix = real.level_parents[level][prefix]
    payload = {name: t.detach().to("cpu").contiguous().clone() for name, t in tables.items()}
    payload["source.item_ids"] = ids.clone()
    payload["source.item_codes"] = torch.from_numpy(codes)
    payload["capacity"] = json.dumps(capacity.to_json())
    path_out = Path(path)
    torch.save(payload, path_out)
    return path_out


def read_tables_source(path: str | os.PathLike):
    """(capacity, item ids, item codes) of a tables file ``write_tables`` wrote."""
    import json

    from torch_engine.catalog import CatalogSize

    payload = torch.load(path, map_location="cpu", weights_only=True)
    require(isinstance(payload, dict) and "capacity" in payload, ExportError,
            f"{path} is not a tables file written by the export (no capacity)")
    return (CatalogSize.from_json(json.loads(payload["capacity"])),
            payload["source.item_ids"].numpy(), payload["source.item_codes"].numpy())


def require_widths_traced(exported: torch.export.ExportedProgram,
                          widths: tuple[int, ...]) -> None:
    """Every named width inside the range torch.export derived for ``beam_slots`` (the
    search's shape rules bound it, e.g. by top_k), else ``ExportError`` naming the range;
    then that range narrowed to the named widths' span, which the package's contract (and so
    TorchCall, before anything runs) enforces."""
    from torch.utils._sympy.value_ranges import ValueRanges

    placeholders = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    slots = placeholders[exported.graph_signature.user_inputs[5]]
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
    # The prompt width is padded with the soft vectors' slots where they take their own
    # (version 1); a version 2 row holds their markers already.
    soft_slots = spec.profile_tokens if spec.version == 1 else 0
    buckets = [torch_package.Bucket(0, 1, policy.length_multiple, soft_slots),
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
