"""Will a request fit the device? An estimate before any work, and out-of-memory containment.

``estimate_request`` adds up what one ``Engine.recommend`` call allocates on top of the
resident weights and catalog: the shared prompt KV, the per-beam KV (plus the copy a beam
reorder makes), the largest layer activations of prefill and of a decode step, the attention
scores of the plain-torch backend, the level logits and the selection buffers of the chosen
selection backend, and the item expansion. ``check_capacity`` estimates a batch of one shape
(the ``Footprint`` holds what else the estimate depends on: the model, its dtype, the catalog's
levels and codebook, the backends), compares it with the free device memory
(``torch.cuda.mem_get_info`` plus what PyTorch's allocator caches but does not use) or, on the
CPU, ``EngineConfig.memory_budget``, and raises ``CapacityError`` with the breakdown.
``run_contained`` turns an out-of-memory error inside a batch into ``CapacityError`` after
releasing what the batch held, so the next request runs normally.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, fields
from typing import Callable, TypeVar

import torch

from torch_engine.config import ModelConfig
from xgr_common.buckets import Bucket
from xgr_common.errors import CapacityError

T = TypeVar("T")
_OOM = (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),
        torch.cuda.OutOfMemoryError)
# Peak bytes per (beam, code) candidate of one level. The torch path (constrain, rank and
# drop_exhausted) holds fp32 copies plus int64 child ids and search positions (the CPU
# profiler's peaks stay below this bound). The fused kernel holds the fp32 logits, its fp32
# totals and int32 child ids.
_CANDIDATE_BYTES = {"torch": 64, "triton": 4 + 4 + 4}
_MIB = 2.0 ** 20


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one request needs beyond the weights, by part."""

    shared_kv: int
    beam_kv: int
    activations: int
    attention_scores: int
    logits_and_selection: int
    item_expansion: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def describe(self) -> str:
        """One line per part, in MiB."""
        parts = [f"{f.name} {getattr(self, f.name) / _MIB:,.1f} MiB" for f in fields(self)]
        return ", ".join(parts)


def estimate_request(config: ModelConfig, element_size: int, batch: int, prompt_rows: int,
                     longest: int, width: int, top_k: int, levels: int, codebook_size: int,
                     exclude_width: int, attention: str = "torch", selection: str = "torch"
                     ) -> MemoryEstimate:
    """Bytes of one search.

    element_size: bytes of the compute dtype; prompt_rows: packed prompt rows ``T`` (use the
    padded ``B * Lmax`` the CUDA-graph buffers hold); longest: ``Lmax`` (soft prefix
    included); attention, selection: the resolved backends ("torch" | "triton").
    """
    kv_heads, head_dim, layers = config.num_kv_heads, config.head_dim, config.num_layers
    shared = 2 * layers * prompt_rows * kv_heads * head_dim * element_size
    slots = max(levels - 1, 1)
    beam_slots = 2 * layers * batch * width * slots * kv_heads * head_dim * element_size
    # A reorder gathers the written slots of every layer before writing them back.
    beam = beam_slots + beam_slots * max(levels - 2, 0) // slots
    # Widest activation row of a layer: residual, normed input, q/k/v, attention output and
    # the MLP's gate, up and product; prefill rows are T tokens, decode rows B * W beams.
    per_row = (4 * config.hidden_size + (config.num_heads + 2 * kv_heads) * head_dim
               + config.num_heads * head_dim + 3 * config.intermediate_size) * element_size
    # The prompt's input vectors stay alive through prefill, padded and packed (two rows):
    # without them the estimate falls short of the peak at small beam widths.
    embeddings = 2 * prompt_rows * config.hidden_size * element_size
    activations = max(prompt_rows, batch * width) * per_row + embeddings
    scores = 0
    if attention == "torch":
        # fp32 score and probability matrices: prefill [B, Hq, L, L], decode [B, Hq, W, L].
        scores = 2 * 4 * batch * config.num_heads * longest * max(longest, width)
    candidates = batch * width * codebook_size
    selection_bytes = candidates * _CANDIDATE_BYTES[selection]
    # expand_items: about ten [B, top_k + X] int64/fp32 work tensors.
    expansion = 10 * 8 * batch * (top_k + max(exclude_width, 1))
    return MemoryEstimate(shared_kv=shared, beam_kv=beam, activations=activations,
                          attention_scores=scores, logits_and_selection=selection_bytes,
                          item_expansion=expansion)


def available_bytes(device: torch.device, budget: int | None) -> int | None:
    """Free bytes for a request: on CUDA the driver's free memory plus the allocator's cached
    but unused blocks; elsewhere ``budget`` (None: unchecked)."""
    if device.type != "cuda":
        return budget
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + cached) if budget is None else min(int(free + cached), budget)


def check_fits(estimate: MemoryEstimate, available: int | None, what: str) -> None:
    """Raise ``CapacityError`` naming the numbers when ``estimate`` exceeds ``available``."""
    if available is None or estimate.total <= available:
        return
    raise CapacityError(
        f"{what} needs about {estimate.total / _MIB:,.1f} MiB but {available / _MIB:,.1f} MiB "
        f"are available ({estimate.describe()}); lower beam_width, top_k, the batch or the "
        "prompt length")


def run_contained(work: Callable[[], T], device: torch.device, what: str) -> T:
    """``work()``, with an out-of-memory error turned into ``CapacityError`` once the failed
    work's tensors are released (its traceback is dropped first: it holds their frames)."""
    message = None
    try:
        return work()
    except _OOM as error:
        message = str(error).split("\n")[0]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    raise CapacityError(f"{what} ran out of device memory and was dropped ({message}); the "
                        "engine is ready for the next request")


@dataclass(frozen=True)
class Footprint:
    """What a search's memory depends on besides the batch's shape: the model's config, the
    bytes of its compute dtype, the catalog's levels and codebook size, and the resolved
    attention and selection backends ("torch" | "triton")."""

    config: ModelConfig
    element_size: int
    levels: int
    codebook_size: int
    attention: str = "torch"
    selection: str = "torch"

    def estimate(self, rows: int, length: int, exclude_width: int, width: int, top_k: int
                 ) -> MemoryEstimate:
        """``estimate_request`` of ``rows`` requests of ``length`` prompt slots (soft prefix
        included) packed at full width (``rows * length`` rows, what the static buffers
        hold), ``exclude_width`` exclusion columns, beam ``width`` and ``top_k``."""
        return estimate_request(self.config, self.element_size, rows, rows * length, length,
                                width, top_k, self.levels, self.codebook_size, exclude_width,
                                self.attention, self.selection)


def check_capacity(footprint: Footprint, shape: Bucket, width: int, top_k: int,
                   device: torch.device, budget: int | None) -> MemoryEstimate:
    """Estimate a search of ``shape`` (rows, prompt slots with the soft prefix, exclusion
    columns) at beam ``width`` and ``top_k``, and refuse it with ``CapacityError`` when it
    cannot fit ``available_bytes(device, budget)``; returns the estimate."""
    rows, length = shape.rows, shape.prompt_slots
    estimate = footprint.estimate(rows, length, shape.excluded, width, top_k)
    check_fits(estimate, available_bytes(device, budget),
               f"a batch of {rows} requests (beam_width {width}, top_k {top_k}, "
               f"{rows} x {length} prompt slots)")
    return estimate
