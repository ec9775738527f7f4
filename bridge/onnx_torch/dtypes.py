"""ONNX TensorProto element types <-> torch dtypes (the subset Torch can hold)."""

from __future__ import annotations

import torch

from xgr_common.errors import ConversionError

# onnx.TensorProto.DataType values; spelled out so the interpreter needs no onnx import.
ONNX_TO_TORCH: dict[int, torch.dtype] = {
    1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32,
    7: torch.int64, 9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16,
}
ONNX_TYPE_NAMES = {8: "string", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128"}


def torch_dtype(onnx_type: int, where: str) -> torch.dtype:
    """The torch dtype of ONNX element type ``onnx_type``; ``where`` names the tensor in errors."""
    if onnx_type not in ONNX_TO_TORCH:
        name = ONNX_TYPE_NAMES.get(onnx_type, f"type {onnx_type}")
        raise ConversionError(f"{where}: ONNX element type {name} has no Torch dtype "
                              f"(supported: {sorted(str(d) for d in ONNX_TO_TORCH.values())})")
    return ONNX_TO_TORCH[onnx_type]
