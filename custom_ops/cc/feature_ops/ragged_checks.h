// Validation shared by the feature ops: ragged row splits, value ranges, attribute bounds.
//
// Every check returns an absl::InvalidArgumentError naming the input and the rule, so kernels
// wrap them in OP_REQUIRES_OK and bad input never reaches indexing code.
#ifndef XGR_CUSTOM_OPS_FEATURE_OPS_RAGGED_CHECKS_H_
#define XGR_CUSTOM_OPS_FEATURE_OPS_RAGGED_CHECKS_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace xgr {

inline absl::Status CheckDtype(const tensorflow::Tensor& t, tensorflow::DataType want,
                               const char* name) {
  if (t.dtype() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be ", tensorflow::DataTypeString(want), ", got ",
        tensorflow::DataTypeString(t.dtype())));
  }
  return absl::OkStatus();
}

inline absl::Status CheckRank(const tensorflow::Tensor& t, int rank, const char* name) {
  if (t.dims() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must have rank ", rank, ", got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

// Row splits of a ragged batch: rank 1, at least one entry, starting at 0, non-decreasing and
// ending at `num_values` (the length of the flat values they index).
inline absl::Status CheckRowSplits(const tensorflow::Tensor& splits, int64_t num_values,
                                   const char* name, const char* values_name) {
  if (absl::Status s = CheckRank(splits, 1, name); !s.ok()) return s;
  const int64_t n = splits.dim_size(0);
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must have at least one entry (batch + 1), got 0"));
  }
  const auto v = splits.flat<int64_t>();
  if (v(0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must start at 0, got ", v(0)));
  }
  for (int64_t i = 1; i < n; ++i) {
    if (v(i) < v(i - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be non-decreasing, got ", name, "[", i - 1, "]=", v(i - 1), " > ",
          name, "[", i, "]=", v(i)));
    }
  }
  if (v(n - 1) != num_values) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must end at the length of ", values_name, " (", num_values, "), got ",
        v(n - 1)));
  }
  return absl::OkStatus();
}

// Every value of an int64 tensor lies in [lo, hi] (token ids become int32 outputs).
inline absl::Status CheckValuesInRange(const tensorflow::Tensor& t, int64_t lo, int64_t hi,
                                       const char* name) {
  const auto v = t.flat<int64_t>();
  for (int64_t i = 0; i < v.size(); ++i) {
    if (v(i) < lo || v(i) > hi) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " values must lie in [", lo, ", ", hi, "], got ", v(i), " at flat index ", i));
    }
  }
  return absl::OkStatus();
}

inline absl::Status CheckAttrInRange(int64_t value, int64_t lo, int64_t hi, const char* name) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute ", name, " must lie in [", lo, ", ", hi, "], got ", value));
  }
  return absl::OkStatus();
}

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_FEATURE_OPS_RAGGED_CHECKS_H_
