// The crossing dtypes (torch_runner.h) as torch's scalar types, both ways.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_SCALAR_TYPES_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_SCALAR_TYPES_H_

#include <c10/core/ScalarType.h>

#include "custom_ops/cc/torch_call/torch_runner.h"

namespace xgr {
namespace torch_call {

inline at::ScalarType ToScalarType(ElementType t) {
  switch (t) {
    case ElementType::kFloat32: return at::kFloat;
    case ElementType::kFloat64: return at::kDouble;
    case ElementType::kFloat16: return at::kHalf;
    case ElementType::kBFloat16: return at::kBFloat16;
    case ElementType::kInt8: return at::kChar;
    case ElementType::kUInt8: return at::kByte;
    case ElementType::kInt32: return at::kInt;
    case ElementType::kInt64: return at::kLong;
    case ElementType::kBool: return at::kBool;
  }
  return at::kFloat;
}

inline bool FromScalarType(at::ScalarType s, ElementType* out) {
  for (int i = 0; i <= static_cast<int>(ElementType::kBool); ++i) {
    if (ToScalarType(static_cast<ElementType>(i)) == s) {
      *out = static_cast<ElementType>(i);
      return true;
    }
  }
  return false;
}

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_SCALAR_TYPES_H_
