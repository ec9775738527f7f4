// XgrCleanSequence: per-row cleaning of a ragged behaviour sequence before it becomes a prompt.
//
// Per row b, in this order:
//   1. keep events with request_time[b] - window_seconds <= timestamp <= request_time[b]
//      (later events are leakage from the future, older ones are stale);
//   2. collapse each run of equal consecutive values into one event that carries the run's
//      LAST timestamp;
//   3. keep the last keep_last events.
// The Torch twin is custom_ops/torch_twins/clean_sequence.py; both must agree exactly.
#include <cstdint>
#include <limits>
#include <vector>

#include "custom_ops/cc/feature_ops/ragged_checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xgr {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;

absl::Status CleanSequenceShape(InferenceContext* c) {
  DimensionHandle splits_dim;
  TF_RETURN_IF_ERROR(TimedSequenceShape(c, &splits_dim));
  c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
  c->set_output(2, c->Vector(splits_dim));
  return absl::OkStatus();
}

REGISTER_OP("XgrCleanSequence")
    .Input("values: int64")
    .Input("timestamps: int64")
    .Input("row_splits: int64")
    .Input("request_time: int64")
    .Output("clean_values: int64")
    .Output("clean_timestamps: int64")
    .Output("clean_row_splits: int64")
    .Attr("window_seconds: int >= 1")
    .Attr("keep_last: int >= 1")
    .SetShapeFn(CleanSequenceShape)
    .Doc(R"doc(
Cleans a ragged behaviour sequence per row: window filter, duplicate-run collapse, keep last N.

values: int64 [E], the event values (item ids), rows concatenated.
timestamps: int64 [E], event times, non-decreasing inside each row.
row_splits: int64 [B+1], row b is values[row_splits[b]:row_splits[b+1]].
request_time: int64 [B], the time each row's request is served.
clean_values: int64 [E'], kept values.
clean_timestamps: int64 [E'], kept timestamps (a collapsed run carries its last timestamp).
clean_row_splits: int64 [B+1].
window_seconds: events older than request_time - window_seconds are dropped.
keep_last: at most this many events are kept per row (the most recent ones).
)doc");

class CleanSequenceOp : public OpKernel {
 public:
  explicit CleanSequenceOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("window_seconds", &window_seconds_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("keep_last", &keep_last_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(window_seconds_, 1,
                                         std::numeric_limits<int64_t>::max(), "window_seconds"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(keep_last_, 1, std::numeric_limits<int64_t>::max(),
                                         "keep_last"));
  }

  void Compute(OpKernelContext* ctx) override {
    absl::StatusOr<TimedSequence> sequence = ReadTimedSequence(ctx);
    OP_REQUIRES_OK(ctx, sequence.status());
    const auto& [val, ts, rs, rt, batch] = *sequence;

    // kept[] collects indices of surviving events; new_splits the per-row boundaries.
    std::vector<int64_t> kept;
    std::vector<int64_t> new_splits(batch + 1, 0);
    std::vector<int64_t> row_kept;
    const int64_t min_int = std::numeric_limits<int64_t>::min();
    for (int64_t b = 0; b < batch; ++b) {
      // The window's lower edge, saturated so a request time near INT64_MIN cannot overflow.
      const int64_t lower =
          rt(b) < min_int + window_seconds_ ? min_int : rt(b) - window_seconds_;
      row_kept.clear();
      for (int64_t i = rs(b); i < rs(b + 1); ++i) {
        if (ts(i) > rt(b) || ts(i) < lower) continue;
        // Same value as the previous surviving event: the run continues, keep the later one.
        if (!row_kept.empty() && val(row_kept.back()) == val(i)) {
          row_kept.back() = i;
        } else {
          row_kept.push_back(i);
        }
      }
      const int64_t n = static_cast<int64_t>(row_kept.size());
      const int64_t start = n > keep_last_ ? n - keep_last_ : 0;
      kept.insert(kept.end(), row_kept.begin() + start, row_kept.end());
      new_splits[b + 1] = static_cast<int64_t>(kept.size());
    }

    const int64_t out_n = static_cast<int64_t>(kept.size());
    Tensor* out_values = nullptr;
    Tensor* out_times = nullptr;
    Tensor* out_splits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({out_n}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({out_n}), &out_times));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({batch + 1}), &out_splits));
    auto ov = out_values->flat<int64_t>();
    auto ot = out_times->flat<int64_t>();
    auto os = out_splits->flat<int64_t>();
    for (int64_t j = 0; j < out_n; ++j) {
      ov(j) = val(kept[j]);
      ot(j) = ts(kept[j]);
    }
    for (int64_t b = 0; b <= batch; ++b) os(b) = new_splits[b];
  }

 private:
  int64_t window_seconds_ = 0;
  int64_t keep_last_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("XgrCleanSequence").Device(tensorflow::DEVICE_CPU),
                        CleanSequenceOp);

}  // namespace
}  // namespace xgr
