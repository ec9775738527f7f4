// XgrSemanticIdLookup: ragged item ids -> code tokens through the semantic-ID catalog.
//
// A known item with code path (c_0, ..., c_{levels-1}) becomes the row of token ids
// code_base + l * codebook_size + c_l (xgr_common/layout.py). Unknown items are dropped and
// counted per row. The Torch twin is custom_ops/torch_twins/semantic_ids.py.
#include <cstdint>
#include <limits>
#include <vector>

#include "custom_ops/cc/feature_ops/ragged_checks.h"
#include "custom_ops/cc/feature_ops/semantic_id_table.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
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

absl::Status LookupShape(InferenceContext* c) {
  ShapeHandle table, items, splits;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &table));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &items));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &splits));
  int64_t levels = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("levels", &levels));
  DimensionHandle batch;
  TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &batch));
  c->set_output(0, c->Matrix(InferenceContext::kUnknownDim, levels));
  c->set_output(1, splits);
  c->set_output(2, c->Vector(batch));
  return absl::OkStatus();
}

REGISTER_OP("XgrSemanticIdLookup")
    .Input("table: resource")
    .Input("items: int64")
    .Input("row_splits: int64")
    .Output("code_tokens: int64")
    .Output("code_row_splits: int64")
    .Output("unknown_count: int64")
    .Attr("code_base: int >= 0")
    .Attr("codebook_size: int >= 1")
    .Attr("levels: int >= 1")
    .SetShapeFn(LookupShape)
    .Doc(R"doc(
Maps ragged item ids to semantic-ID code tokens; unknown items are dropped and counted.

table: an initialised XgrSemanticIdTableHandle.
items: int64 [E], item ids, rows concatenated.
row_splits: int64 [B+1].
code_tokens: int64 [E', levels]; token code_base + l * codebook_size + c_l at level l.
code_row_splits: int64 [B+1], rows of code_tokens.
unknown_count: int64 [B], items of each row missing from the catalog.
code_base, codebook_size, levels: the token layout; codebook_size and levels must equal the
  table's.
)doc");

class SemanticIdLookupOp : public OpKernel {
 public:
  explicit SemanticIdLookupOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("code_base", &code_base_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("codebook_size", &codebook_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("levels", &levels_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(codebook_size_, 1, kMaxInt32, "codebook_size"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(levels_, 1, 1 << 20, "levels"));
    // The largest token, code_base + levels * codebook_size - 1, must fit int64.
    OP_REQUIRES_OK(ctx, CheckAttrInRange(
                            code_base_, 0,
                            std::numeric_limits<int64_t>::max() - levels_ * codebook_size_,
                            "code_base"));
  }

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckRank(ctx->input(0), 0, "table"));
    const Tensor& items = ctx->input(1);
    const Tensor& splits = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRank(items, 1, "items"));
    OP_REQUIRES_OK(ctx, CheckRowSplits(splits, items.dim_size(0), "row_splits", "items"));
    tensorflow::ResourceHandle handle;
    OP_REQUIRES_OK(ctx, tensorflow::HandleFromInput(ctx, 0, &handle));
    tensorflow::core::RefCountPtr<SemanticIdTableResource> table;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, handle, &table));
    const std::shared_ptr<const SemanticIdCatalog> catalog = table->catalog();
    OP_REQUIRES(ctx, catalog != nullptr,
                absl::FailedPreconditionError("the semantic-ID table is not initialised"));
    OP_REQUIRES(ctx, catalog->levels == levels_ && catalog->codebook_size == codebook_size_,
                absl::InvalidArgumentError(absl::StrCat(
                    "attributes levels=", levels_, ", codebook_size=", codebook_size_,
                    " do not match the table's levels=", catalog->levels,
                    ", codebook_size=", catalog->codebook_size)));

    const int64_t batch = splits.dim_size(0) - 1;
    const auto it = items.flat<int64_t>();
    const auto rs = splits.flat<int64_t>();
    std::vector<int64_t> rows(it.size());
    std::vector<int64_t> new_splits(batch + 1, 0);
    Tensor* unknown = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({batch}), &unknown));
    auto unk = unknown->flat<int64_t>();
    int64_t found = 0;
    for (int64_t b = 0; b < batch; ++b) {
      unk(b) = 0;
      for (int64_t i = rs(b); i < rs(b + 1); ++i) {
        rows[i] = catalog->Find(it(i));
        if (rows[i] < 0) {
          ++unk(b);
        } else {
          ++found;
        }
      }
      new_splits[b + 1] = found;
    }
    Tensor* tokens = nullptr;
    Tensor* out_splits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({found, levels_}), &tokens));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch + 1}), &out_splits));
    auto tok = tokens->matrix<int64_t>();
    int64_t j = 0;
    for (int64_t i = 0; i < it.size(); ++i) {
      if (rows[i] < 0) continue;
      const int32_t* path = catalog->codes.data() + rows[i] * levels_;
      for (int64_t l = 0; l < levels_; ++l) {
        tok(j, l) = code_base_ + l * codebook_size_ + path[l];
      }
      ++j;
    }
    auto os = out_splits->flat<int64_t>();
    for (int64_t b = 0; b <= batch; ++b) os(b) = new_splits[b];
  }

 private:
  int64_t code_base_ = 0;
  int64_t codebook_size_ = 0;
  int64_t levels_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("XgrSemanticIdLookup").Device(tensorflow::DEVICE_CPU),
                        SemanticIdLookupOp);

}  // namespace
}  // namespace xgr
