"""Plain-PyTorch references of every kernel: the definitions the Triton kernels are tested against.

Slow and simple on purpose; computed in float32 (float64 when given float64).
"""

from torch_engine.reference.constrained_topk import constrained_topk
from torch_engine.reference.decode_attention import attend_with_lse, decode_attention, merge_states
from torch_engine.reference.input_rules import input_rules
from torch_engine.reference.layer_ops import qkv_rotary, row_scale, silu_mul
from torch_engine.reference.paged_attention import paged_decode_attention, paged_prefill_attention
from torch_engine.reference.prefill_attention import prefill_attention, request_mask

__all__ = ["attend_with_lse", "constrained_topk", "decode_attention", "input_rules",
           "merge_states", "paged_decode_attention", "paged_prefill_attention", "prefill_attention", "qkv_rotary", "request_mask", "row_scale",
           "silu_mul"]
