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
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace xgr {

// The longest prompt row the assembly ops emit (custom_ops.feature_ops.MAX_PROMPT_LENGTH).
constexpr int64_t kMaxPromptLength = int64_t{1} << 20;

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

// Shape inference of a timed ragged sequence's inputs (values, timestamps, row_splits,
// request_time: all rank 1, values and timestamps of one length, row_splits one longer than
// request_time); `splits_dim` is the row_splits length (batch + 1).
inline absl::Status TimedSequenceShape(tensorflow::shape_inference::InferenceContext* c,
                                       tensorflow::shape_inference::DimensionHandle* splits_dim) {
  tensorflow::shape_inference::ShapeHandle values, timestamps, splits, request_time;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &values));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &timestamps));
  TF_RETURN_IF_ERROR(c->Merge(values, timestamps, &values));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &splits));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &request_time));
  tensorflow::shape_inference::DimensionHandle batch_plus_one;
  TF_RETURN_IF_ERROR(c->Add(c->Dim(request_time, 0), 1, &batch_plus_one));
  return c->Merge(c->Dim(splits, 0), batch_plus_one, splits_dim);
}

// A timed ragged sequence (values, timestamps, row_splits, request_time), the inputs of the
// history ops: ranks, lengths that agree, valid splits, one request time per row, and
// timestamps non-decreasing inside each row.
inline absl::Status CheckTimedSequence(const tensorflow::Tensor& values,
                                       const tensorflow::Tensor& timestamps,
                                       const tensorflow::Tensor& splits,
                                       const tensorflow::Tensor& request_time) {
  if (absl::Status s = CheckRank(values, 1, "values"); !s.ok()) return s;
  if (absl::Status s = CheckRank(timestamps, 1, "timestamps"); !s.ok()) return s;
  if (absl::Status s = CheckRank(request_time, 1, "request_time"); !s.ok()) return s;
  const int64_t num_events = values.dim_size(0);
  if (timestamps.dim_size(0) != num_events) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timestamps must have the length of values (", num_events, "), got ",
        timestamps.dim_size(0)));
  }
  if (absl::Status s = CheckRowSplits(splits, num_events, "row_splits", "values"); !s.ok()) {
    return s;
  }
  const int64_t batch = splits.dim_size(0) - 1;
  if (request_time.dim_size(0) != batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_time must have one entry per row (", batch, "), got ",
        request_time.dim_size(0)));
  }
  const auto ts = timestamps.flat<int64_t>();
  const auto rs = splits.flat<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = rs(b) + 1; i < rs(b + 1); ++i) {
      if (ts(i) < ts(i - 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "timestamps must be non-decreasing inside each row; row ", b, " has timestamps[",
            i - 1, "]=", ts(i - 1), " > timestamps[", i, "]=", ts(i)));
      }
    }
  }
  return absl::OkStatus();
}

// The history ops' first four inputs (values, timestamps, row_splits, request_time), checked
// by CheckTimedSequence, as flat views, with the number of rows.
struct TimedSequence {
  tensorflow::TTypes<int64_t>::ConstFlat values, timestamps, row_splits, request_time;
  int64_t batch;
};

inline absl::StatusOr<TimedSequence> ReadTimedSequence(tensorflow::OpKernelContext* ctx) {
  const tensorflow::Tensor& values = ctx->input(0);
  const tensorflow::Tensor& timestamps = ctx->input(1);
  const tensorflow::Tensor& splits = ctx->input(2);
  const tensorflow::Tensor& request_time = ctx->input(3);
  if (absl::Status s = CheckTimedSequence(values, timestamps, splits, request_time); !s.ok()) {
    return s;
  }
  return TimedSequence{values.flat<int64_t>(), timestamps.flat<int64_t>(),
                       splits.flat<int64_t>(), request_time.flat<int64_t>(),
                       splits.dim_size(0) - 1};
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
