"""Triton kernels of the engine's attention, each beside its plain-torch reference.

``decode_attention`` (xAttention over shared prompt KV + per-beam KV) and ``prefill_attention``
(segmented-mask prefill over a packed ragged batch) keep the signatures of
``torch_engine.reference``; each is also the torch custom op ``xgr::<name>``.
"""

from torch_engine.kernels.decode_attention import decode_attention
from torch_engine.kernels.prefill_attention import prefill_attention

__all__ = ["decode_attention", "prefill_attention"]
