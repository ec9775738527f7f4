// XgrSplitHistory: a behaviour sequence split into a frozen long-term part and a recent part
// (prompt contract v2, xgr_common/prompt_v2.py).
//
// Time is cut into blocks of block_seconds; block k holds the timestamps in
// [k * block_seconds, (k + 1) * block_seconds). For row b the request's block is
// open = floor(request_time[b] / block_seconds). Per row, in this order:
//   1. events after request_time[b] are dropped (leakage from the future);
//   2. each run of equal consecutive values inside one block collapses into its last event;
//   3. recent part: the events of the open block, at most recent_items (the newest);
//   4. long-term part: the events of the closed blocks open - long_term_blocks .. open - 1,
//      whole blocks from the newest back while they fit long_term_items (when the newest
//      closed block alone is larger, its newest long_term_items events).
// So the long-term part is a function of closed blocks only: it changes when the request
// time enters a new block (a block closes, the oldest may retire), never with a new event.
// The Torch twin is custom_ops/torch_twins/split_history.py; both must agree exactly.
#include <algorithm>
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

// Floor division (timestamps may be negative).
int64_t BlockOf(int64_t t, int64_t block) {
  const int64_t q = t / block;
  return (t % block != 0 && t < 0) ? q - 1 : q;
}

absl::Status SplitHistoryShape(InferenceContext* c) {
  DimensionHandle splits_dim;
  TF_RETURN_IF_ERROR(TimedSequenceShape(c, &splits_dim));
  c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  c->set_output(1, c->Vector(splits_dim));
  c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
  c->set_output(3, c->Vector(splits_dim));
  return absl::OkStatus();
}

REGISTER_OP("XgrSplitHistory")
    .Input("values: int64")
    .Input("timestamps: int64")
    .Input("row_splits: int64")
    .Input("request_time: int64")
    .Output("long_values: int64")
    .Output("long_row_splits: int64")
    .Output("recent_values: int64")
    .Output("recent_row_splits: int64")
    .Attr("block_seconds: int >= 1")
    .Attr("long_term_blocks: int >= 1")
    .Attr("long_term_items: int >= 0")
    .Attr("recent_items: int >= 1")
    .SetShapeFn(SplitHistoryShape)
    .Doc(R"doc(
Splits a ragged behaviour sequence per row into a long-term part made of closed time blocks
(stable until the request time enters the next block) and the recent part of the open block.

values: int64 [E], the event values (item ids), rows concatenated.
timestamps: int64 [E], event times, non-decreasing inside each row.
row_splits: int64 [B+1], row b is values[row_splits[b]:row_splits[b+1]].
request_time: int64 [B], the time each row's request is served.
long_values, long_row_splits: the long-term part, ragged, oldest first.
recent_values, recent_row_splits: the recent part, ragged, oldest first.
block_seconds: the length of a block.
long_term_blocks: closed blocks the long-term part may draw from (the newest ones).
long_term_items: the most long-term events per row (whole blocks, newest first).
recent_items: the most recent events per row (the newest).
)doc");

class SplitHistoryOp : public OpKernel {
 public:
  explicit SplitHistoryOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    OP_REQUIRES_OK(ctx, ctx->GetAttr("block_seconds", &block_seconds_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("long_term_blocks", &long_term_blocks_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("long_term_items", &long_term_items_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("recent_items", &recent_items_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(block_seconds_, 1, kMax, "block_seconds"));
    // Bounded so open - long_term_blocks cannot overflow for any request time.
    OP_REQUIRES_OK(ctx, CheckAttrInRange(long_term_blocks_, 1, int64_t{1} << 40,
                                         "long_term_blocks"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(long_term_items_, 0, kMax, "long_term_items"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(recent_items_, 1, kMax, "recent_items"));
  }

  void Compute(OpKernelContext* ctx) override {
    absl::StatusOr<TimedSequence> sequence = ReadTimedSequence(ctx);
    OP_REQUIRES_OK(ctx, sequence.status());
    const auto& [val, ts, rs, rt, batch] = *sequence;

    std::vector<int64_t> long_kept, recent_kept, long_splits(batch + 1, 0),
        recent_splits(batch + 1, 0);
    std::vector<int64_t> row, row_blocks;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t open = BlockOf(rt(b), block_seconds_);
      // Saturated: a request time near INT64_MIN cannot overflow.
      const int64_t oldest = open < std::numeric_limits<int64_t>::min() + long_term_blocks_
                                 ? std::numeric_limits<int64_t>::min()
                                 : open - long_term_blocks_;
      // The surviving events of the row (steps 1 and 2) and their blocks, oldest first.
      row.clear();
      row_blocks.clear();
      for (int64_t i = rs(b); i < rs(b + 1); ++i) {
        if (ts(i) > rt(b)) break;  // non-decreasing: the rest is in the future too
        const int64_t block = BlockOf(ts(i), block_seconds_);
        if (block < oldest) continue;  // retired
        if (!row.empty() && row_blocks.back() == block && val(row.back()) == val(i)) {
          row.back() = i;  // the run continues inside the block: keep its last event
          continue;
        }
        row.push_back(i);
        row_blocks.push_back(block);
      }
      // Step 3: the open block's events are a suffix of the row.
      int64_t first_recent = static_cast<int64_t>(row.size());
      while (first_recent > 0 && row_blocks[first_recent - 1] == open) --first_recent;
      const int64_t recent_count = static_cast<int64_t>(row.size()) - first_recent;
      const int64_t recent_start =
          first_recent + std::max<int64_t>(0, recent_count - recent_items_);
      recent_kept.insert(recent_kept.end(), row.begin() + recent_start, row.end());
      recent_splits[b + 1] = static_cast<int64_t>(recent_kept.size());
      // Step 4: whole closed blocks from the newest back.
      int64_t start = first_recent;
      while (start > 0) {
        int64_t block_start = start;
        while (block_start > 0 && row_blocks[block_start - 1] == row_blocks[start - 1]) {
          --block_start;
        }
        const int64_t taken = first_recent - block_start;
        if (taken > long_term_items_) {
          // The newest closed block alone is too large: its newest events.
          if (start == first_recent) start = first_recent - long_term_items_;
          break;
        }
        start = block_start;
      }
      long_kept.insert(long_kept.end(), row.begin() + start, row.begin() + first_recent);
      long_splits[b + 1] = static_cast<int64_t>(long_kept.size());
    }

    Emit(ctx, 0, val, long_kept, long_splits);
    Emit(ctx, 2, val, recent_kept, recent_splits);
  }

 private:
  static void Emit(OpKernelContext* ctx, int first_output,
                   const tensorflow::TTypes<int64_t>::ConstFlat& val,
                   const std::vector<int64_t>& kept, const std::vector<int64_t>& splits) {
    Tensor* out_values = nullptr;
    Tensor* out_splits = nullptr;
    const int64_t n = static_cast<int64_t>(kept.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(first_output, TensorShape({n}), &out_values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(first_output + 1,
                                             TensorShape({static_cast<int64_t>(splits.size())}),
                                             &out_splits));
    auto ov = out_values->flat<int64_t>();
    auto os = out_splits->flat<int64_t>();
    for (int64_t j = 0; j < n; ++j) ov(j) = val(kept[j]);
    for (size_t b = 0; b < splits.size(); ++b) os(b) = splits[b];
  }

  int64_t block_seconds_ = 1;
  int64_t long_term_blocks_ = 1;
  int64_t long_term_items_ = 0;
  int64_t recent_items_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("XgrSplitHistory").Device(tensorflow::DEVICE_CPU),
                        SplitHistoryOp);

}  // namespace
}  // namespace xgr
