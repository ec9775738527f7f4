// XgrAssemblePrompt: context tokens + per-item code tokens -> the engine's padded prompt.
//
// Row layout (xgr_common/prompt_spec.py), with n items kept for the row:
//   BOS PROFILE_START ctx_1..ctx_P            segment 0
//   ITEM_START c_0..c_{levels-1}              segment k+1 for the k-th kept item (0-based)
//   ITEM_START                                segment n+1: the item the engine generates
//   pad_id ...                                segment -1
// L is the longest row, or max_length when it is set (> 0). A row longer than max_length loses
// its OLDEST whole items until it fits; if even zero items do not fit (3 + P > max_length) the
// op fails. The Torch twin is custom_ops/torch_twins/assemble_prompt.py.
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
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status AssemblePromptShape(InferenceContext* c) {
  ShapeHandle context, items, splits;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &context));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &items));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &splits));
  DimensionHandle batch, splits_batch;
  TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &splits_batch));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(context, 0), splits_batch, &batch));
  int64_t max_length = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("max_length", &max_length));
  const int64_t length = max_length > 0 ? max_length : InferenceContext::kUnknownDim;
  c->set_output(0, c->Matrix(batch, length));
  c->set_output(1, c->Vector(batch));
  c->set_output(2, c->Matrix(batch, length));
  return absl::OkStatus();
}

REGISTER_OP("XgrAssemblePrompt")
    .Input("context_tokens: int64")
    .Input("item_tokens: int64")
    .Input("item_row_splits: int64")
    .Output("token_ids: int32")
    .Output("lengths: int32")
    .Output("segment_ids: int32")
    .Attr("bos_id: int >= 0")
    .Attr("profile_start_id: int >= 0")
    .Attr("item_start_id: int >= 0")
    .Attr("pad_id: int >= 0")
    .Attr("max_length: int >= 0 = 0")
    .SetShapeFn(AssemblePromptShape)
    .Doc(R"doc(
Assembles right-padded prompts: BOS PROFILE_START ctx | ITEM_START codes | ... | ITEM_START.

context_tokens: int64 [B, P], token ids in [0, 2^31).
item_tokens: int64 [E', levels], code tokens of each history item, rows concatenated.
item_row_splits: int64 [B+1], rows of item_tokens.
token_ids: int32 [B, L], right-padded with pad_id.
lengths: int32 [B], tokens per row before padding.
segment_ids: int32 [B, L]; 0 profile, k+1 for the k-th kept item, n+1 for the trailing
  ITEM_START, -1 padding.
max_length: 0 for L = the longest row; otherwise L = max_length (at most 2^20) and rows
  that are too long drop their oldest items.
)doc");

class AssemblePromptOp : public OpKernel {
 public:
  explicit AssemblePromptOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bos_id", &bos_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("profile_start_id", &profile_start_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("item_start_id", &item_start_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("pad_id", &pad_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_length", &max_length_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(bos_id_, 0, kMaxInt32, "bos_id"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(profile_start_id_, 0, kMaxInt32, "profile_start_id"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(item_start_id_, 0, kMaxInt32, "item_start_id"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(pad_id_, 0, kMaxInt32, "pad_id"));
    // Bounded so a typo cannot ask for B x 2^31 tokens of output.
    OP_REQUIRES_OK(ctx, CheckAttrInRange(max_length_, 0, kMaxPromptLength, "max_length"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& context = ctx->input(0);
    const Tensor& items = ctx->input(1);
    const Tensor& splits = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRank(context, 2, "context_tokens"));
    OP_REQUIRES_OK(ctx, CheckRank(items, 2, "item_tokens"));
    OP_REQUIRES(ctx, items.dim_size(1) >= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "item_tokens must have at least one level (column), got shape ",
                    items.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckRowSplits(splits, items.dim_size(0), "item_row_splits",
                                       "item_tokens"));
    const int64_t batch = splits.dim_size(0) - 1;
    OP_REQUIRES(ctx, context.dim_size(0) == batch,
                absl::InvalidArgumentError(absl::StrCat(
                    "context_tokens must have one row per prompt (", batch,
                    " from item_row_splits), got shape ", context.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckValuesInRange(context, 0, kMaxInt32, "context_tokens"));
    OP_REQUIRES_OK(ctx, CheckValuesInRange(items, 0, kMaxInt32, "item_tokens"));

    const int64_t num_context = context.dim_size(1);
    const int64_t levels = items.dim_size(1);
    const int64_t item_len = 1 + levels;
    const int64_t fixed = 3 + num_context;  // BOS, PROFILE_START, context, trailing ITEM_START
    OP_REQUIRES(ctx, max_length_ == 0 || fixed <= max_length_,
                absl::InvalidArgumentError(absl::StrCat(
                    "max_length=", max_length_, " cannot hold even a prompt without items: BOS,"
                    " PROFILE_START, ", num_context, " context tokens and ITEM_START need ",
                    fixed)));
    const auto rs = splits.flat<int64_t>();
    // Per row: how many of its newest items are kept.
    std::vector<int64_t> kept(batch);
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t n = rs(b + 1) - rs(b);
      kept[b] = max_length_ > 0 ? std::min(n, (max_length_ - fixed) / item_len) : n;
      OP_REQUIRES(ctx, kept[b] <= (kMaxInt32 - fixed) / item_len,
                  absl::InvalidArgumentError(absl::StrCat(
                      "row ", b, " with ", n, " items would exceed 2^31 - 1 tokens")));
      longest = std::max(longest, fixed + kept[b] * item_len);
    }
    const int64_t length = max_length_ > 0 ? max_length_ : longest;

    Tensor* token_t = nullptr;
    Tensor* length_t = nullptr;
    Tensor* segment_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, length}), &token_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch}), &length_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({batch, length}), &segment_t));
    auto tokens = token_t->matrix<int32_t>();
    auto lengths = length_t->flat<int32_t>();
    auto segments = segment_t->matrix<int32_t>();
    const auto ctx_tok = context.matrix<int64_t>();
    const auto item_tok = items.matrix<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      int64_t pos = 0;
      auto put = [&](int64_t token, int64_t segment) {
        tokens(b, pos) = static_cast<int32_t>(token);
        segments(b, pos) = static_cast<int32_t>(segment);
        ++pos;
      };
      put(bos_id_, 0);
      put(profile_start_id_, 0);
      for (int64_t p = 0; p < num_context; ++p) put(ctx_tok(b, p), 0);
      const int64_t first = rs(b + 1) - kept[b];  // oldest kept item
      for (int64_t k = 0; k < kept[b]; ++k) {
        put(item_start_id_, k + 1);
        for (int64_t l = 0; l < levels; ++l) put(item_tok(first + k, l), k + 1);
      }
      put(item_start_id_, kept[b] + 1);
      lengths(b) = static_cast<int32_t>(pos);
      for (; pos < length; ++pos) {
        tokens(b, pos) = static_cast<int32_t>(pad_id_);
        segments(b, pos) = -1;
      }
    }
  }

 private:
  int64_t bos_id_ = 0;
  int64_t profile_start_id_ = 0;
  int64_t item_start_id_ = 0;
  int64_t pad_id_ = 0;
  int64_t max_length_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("XgrAssemblePrompt").Device(tensorflow::DEVICE_CPU),
                        AssemblePromptOp);

}  // namespace
}  // namespace xgr
