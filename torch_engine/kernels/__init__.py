"""Triton kernels of the engine's attention, each beside its plain-torch reference.

``decode_attention`` (xAttention over shared prompt KV + per-beam KV), ``prefill_attention``
(segmented-mask prefill over a packed ragged batch) and ``constrained_topk`` (one beam-search
level: CSR-masked log-softmax and per-request top-k) keep the signatures of
``torch_engine.reference``; each is also the torch custom op ``xgr::<name>``.

Beside them, launches that the engine calls outside tracing, each equal to the torch code it
replaces: ``layer_ops`` (a decoder layer's elementwise steps, rotary rows; also traced ops for
packages that ask for them, ``torch_engine.kernel_layers``), ``input_rules`` (the value rules
of a request), ``exclusions`` (excluded rows and exhausted prefixes) and ``item_expansion``
(final paths to items); the last two are traced ops as well, for the fused selection.
"""

from xgr_common.import_order import check_triton_importable

check_triton_importable()

from torch_engine.kernels.constrained_topk import constrained_topk  # noqa: E402
from torch_engine.kernels.decode_attention import decode_attention  # noqa: E402
from torch_engine.kernels.prefill_attention import prefill_attention  # noqa: E402

__all__ = ["constrained_topk", "decode_attention", "prefill_attention"]
