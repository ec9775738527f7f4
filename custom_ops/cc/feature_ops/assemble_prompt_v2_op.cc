// XgrAssemblePromptV2: the prompt contract v2 (xgr_common/prompt_v2.py), a row whose
// frozen long-term part comes first, so its tokens (and its KV) depend on itself alone.
//
// Row layout, with n long-term and m recent items:
//   BOS intro...                                            segment 0
//   ITEM_START c_0..c_{levels-1}          (long-term k)      segment 1 + k
//   before_profile... SOFT x S PROFILE_START ctx_1..ctx_P
//     before_recent...                                      segment n + 1 (profile)
//   ITEM_START c_0..c_{levels-1}          (recent k)         segment n + 2 + k
//   question... ITEM_START                                  segment n + m + 2 (the item to
//                                                           generate)
//   pad_id ...                                              segment -1
// The text spans are token ids of the checkpoint's tokenizer (attrs, possibly empty); the S
// SOFT tokens mark where the engine places the soft-prompt vectors. `frozen_lengths` is the
// length of the frozen prefix (BOS, intro and the long-term items). L is the longest row, or
// max_length when it is set (> 0); a row longer than max_length is refused (never cut: a cut
// would move the frozen part). The Torch twin is custom_ops/torch_twins/assemble_prompt_v2.py.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
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

absl::Status AssemblePromptV2Shape(InferenceContext* c) {
  ShapeHandle long_items, long_splits, context, recent_items, recent_splits;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &long_items));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &long_splits));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &context));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &recent_items));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &recent_splits));
  DimensionHandle batch, splits_dim;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(long_splits, 0), c->Dim(recent_splits, 0), &splits_dim));
  TF_RETURN_IF_ERROR(c->Subtract(splits_dim, 1, &batch));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(context, 0), batch, &batch));
  int64_t max_length = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("max_length", &max_length));
  const int64_t length = max_length > 0 ? max_length : InferenceContext::kUnknownDim;
  c->set_output(0, c->Matrix(batch, length));
  c->set_output(1, c->Vector(batch));
  c->set_output(2, c->Matrix(batch, length));
  c->set_output(3, c->Vector(batch));
  return absl::OkStatus();
}

REGISTER_OP("XgrAssemblePromptV2")
    .Input("long_item_tokens: int64")
    .Input("long_row_splits: int64")
    .Input("context_tokens: int64")
    .Input("recent_item_tokens: int64")
    .Input("recent_row_splits: int64")
    .Output("token_ids: int32")
    .Output("lengths: int32")
    .Output("segment_ids: int32")
    .Output("frozen_lengths: int32")
    .Attr("bos_id: int >= 0")
    .Attr("profile_start_id: int >= 0")
    .Attr("item_start_id: int >= 0")
    .Attr("soft_id: int >= 0")
    .Attr("pad_id: int >= 0")
    .Attr("soft_tokens: int >= 0")
    .Attr("intro: list(int) = []")
    .Attr("before_profile: list(int) = []")
    .Attr("before_recent: list(int) = []")
    .Attr("question: list(int) = []")
    .Attr("max_length: int >= 0 = 0")
    .SetShapeFn(AssemblePromptV2Shape)
    .Doc(R"doc(
Assembles right-padded v2 prompts: BOS intro | long-term items | profile (text, SOFT x S,
PROFILE_START, context, text) | recent items | question ITEM_START.

long_item_tokens: int64 [E_long, levels], code tokens of the long-term items, rows
  concatenated (oldest first); long_row_splits: int64 [B+1].
context_tokens: int64 [B, P].
recent_item_tokens: int64 [E_recent, levels]; recent_row_splits: int64 [B+1].
token_ids, segment_ids: int32 [B, L]; lengths: int32 [B]; frozen_lengths: int32 [B], the
  tokens of the frozen prefix (BOS, intro, long-term items).
soft_tokens: SOFT markers where the engine places the soft-prompt vectors.
intro, before_profile, before_recent, question: text token ids (may be empty).
max_length: 0 for L = the longest row; otherwise L = max_length (at most 2^20) and a longer
  row is refused.
)doc");

class AssemblePromptV2Op : public OpKernel {
 public:
  explicit AssemblePromptV2Op(OpKernelConstruction* ctx) : OpKernel(ctx) {
    for (const char* name : {"bos_id", "profile_start_id", "item_start_id", "soft_id",
                             "pad_id"}) {
      int64_t id = 0;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &id));
      OP_REQUIRES_OK(ctx, CheckAttrInRange(id, 0, kMaxInt32, name));
      ids_.push_back(id);
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("soft_tokens", &soft_tokens_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(soft_tokens_, 0, kMaxPromptLength, "soft_tokens"));
    for (const char* name : {"intro", "before_profile", "before_recent", "question"}) {
      std::vector<int64_t> span;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &span));
      OP_REQUIRES(ctx, static_cast<int64_t>(span.size()) <= kMaxPromptLength,
                  absl::InvalidArgumentError(absl::StrCat(name, " has ", span.size(),
                                                          " tokens; at most 2^20")));
      for (int64_t token : span) OP_REQUIRES_OK(ctx, CheckAttrInRange(token, 0, kMaxInt32, name));
      spans_.push_back(span);
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_length", &max_length_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(max_length_, 0, kMaxPromptLength, "max_length"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& long_items = ctx->input(0);
    const Tensor& long_splits = ctx->input(1);
    const Tensor& context = ctx->input(2);
    const Tensor& recent_items = ctx->input(3);
    const Tensor& recent_splits = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckRank(long_items, 2, "long_item_tokens"));
    OP_REQUIRES_OK(ctx, CheckRank(context, 2, "context_tokens"));
    OP_REQUIRES_OK(ctx, CheckRank(recent_items, 2, "recent_item_tokens"));
    const int64_t levels = long_items.dim_size(1);
    OP_REQUIRES(ctx, levels >= 1 && recent_items.dim_size(1) == levels,
                absl::InvalidArgumentError(absl::StrCat(
                    "long_item_tokens and recent_item_tokens must have the same number (>= 1) "
                    "of levels (columns), got shapes ", long_items.shape().DebugString(), " and ",
                    recent_items.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckRowSplits(long_splits, long_items.dim_size(0), "long_row_splits",
                                       "long_item_tokens"));
    OP_REQUIRES_OK(ctx, CheckRowSplits(recent_splits, recent_items.dim_size(0),
                                       "recent_row_splits", "recent_item_tokens"));
    const int64_t batch = long_splits.dim_size(0) - 1;
    OP_REQUIRES(ctx, recent_splits.dim_size(0) == batch + 1 && context.dim_size(0) == batch,
                absl::InvalidArgumentError(absl::StrCat(
                    "long_row_splits, recent_row_splits and context_tokens must describe the "
                    "same ", batch, " rows, got shapes ", long_splits.shape().DebugString(), ", ",
                    recent_splits.shape().DebugString(), " and ",
                    context.shape().DebugString())));
    OP_REQUIRES_OK(ctx, CheckValuesInRange(context, 0, kMaxInt32, "context_tokens"));
    OP_REQUIRES_OK(ctx, CheckValuesInRange(long_items, 0, kMaxInt32, "long_item_tokens"));
    OP_REQUIRES_OK(ctx, CheckValuesInRange(recent_items, 0, kMaxInt32, "recent_item_tokens"));

    const int64_t num_context = context.dim_size(1);
    const int64_t item_len = 1 + levels;
    // BOS, the spans, SOFT x S, PROFILE_START, the context, the trailing ITEM_START.
    int64_t fixed = 3 + soft_tokens_ + num_context;
    for (const auto& span : spans_) fixed += static_cast<int64_t>(span.size());
    const auto ls = long_splits.flat<int64_t>();
    const auto rs = recent_splits.flat<int64_t>();
    std::vector<int64_t> row_length(batch);
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t items = (ls(b + 1) - ls(b)) + (rs(b + 1) - rs(b));
      OP_REQUIRES(ctx, items <= (kMaxInt32 - fixed) / item_len,
                  absl::InvalidArgumentError(absl::StrCat(
                      "row ", b, " with ", items, " items would exceed 2^31 - 1 tokens")));
      row_length[b] = fixed + items * item_len;
      OP_REQUIRES(ctx, max_length_ == 0 || row_length[b] <= max_length_,
                  absl::InvalidArgumentError(absl::StrCat(
                      "row ", b, " needs ", row_length[b], " tokens, more than max_length=",
                      max_length_, "; the history split's budgets must fit the prompt (a cut "
                      "would move the frozen long-term part)")));
      longest = std::max(longest, row_length[b]);
    }
    const int64_t length = max_length_ > 0 ? max_length_ : longest;

    Tensor *token_t = nullptr, *length_t = nullptr, *segment_t = nullptr, *frozen_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, length}), &token_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch}), &length_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({batch, length}), &segment_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({batch}), &frozen_t));
    auto tokens = token_t->matrix<int32_t>();
    auto segments = segment_t->matrix<int32_t>();
    auto lengths = length_t->flat<int32_t>();
    auto frozen = frozen_t->flat<int32_t>();
    const auto ctx_tok = context.matrix<int64_t>();
    const auto long_tok = long_items.matrix<int64_t>();
    const auto recent_tok = recent_items.matrix<int64_t>();
    const int64_t bos = ids_[0], profile_start = ids_[1], item_start = ids_[2], soft = ids_[3],
                  pad = ids_[4];
    for (int64_t b = 0; b < batch; ++b) {
      int64_t pos = 0;
      auto put = [&](int64_t token, int64_t segment) {
        tokens(b, pos) = static_cast<int32_t>(token);
        segments(b, pos) = static_cast<int32_t>(segment);
        ++pos;
      };
      auto put_items = [&](const auto& tok, int64_t from, int64_t to, int64_t first_segment) {
        for (int64_t i = from; i < to; ++i) {
          put(item_start, first_segment + (i - from));
          for (int64_t l = 0; l < levels; ++l) put(tok(i, l), first_segment + (i - from));
        }
      };
      put(bos, 0);
      for (int64_t token : spans_[0]) put(token, 0);
      const int64_t n = ls(b + 1) - ls(b), m = rs(b + 1) - rs(b);
      put_items(long_tok, ls(b), ls(b + 1), 1);
      frozen(b) = static_cast<int32_t>(pos);
      for (int64_t token : spans_[1]) put(token, n + 1);
      for (int64_t s = 0; s < soft_tokens_; ++s) put(soft, n + 1);
      put(profile_start, n + 1);
      for (int64_t p = 0; p < num_context; ++p) put(ctx_tok(b, p), n + 1);
      for (int64_t token : spans_[2]) put(token, n + 1);
      put_items(recent_tok, rs(b), rs(b + 1), n + 2);
      for (int64_t token : spans_[3]) put(token, n + m + 2);
      put(item_start, n + m + 2);
      lengths(b) = static_cast<int32_t>(pos);
      for (; pos < length; ++pos) {
        tokens(b, pos) = static_cast<int32_t>(pad);
        segments(b, pos) = -1;
      }
    }
  }

 private:
  std::vector<int64_t> ids_;                 // bos, profile_start, item_start, soft, pad
  std::vector<std::vector<int64_t>> spans_;  // intro, before_profile, before_recent, question
  int64_t soft_tokens_ = 0;
  int64_t max_length_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("XgrAssemblePromptV2").Device(tensorflow::DEVICE_CPU),
                        AssemblePromptV2Op);

}  // namespace
}  // namespace xgr
