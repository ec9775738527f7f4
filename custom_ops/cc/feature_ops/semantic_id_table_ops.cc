// Ops that create and fill the semantic-ID catalog resource (see semantic_id_table.h).
//
// XgrSemanticIdTableHandle names a table in the resource manager (like HashTableV2); one of
// the init ops builds its catalog, from a catalog file (the SavedModel asset route, so a large
// catalog is never a graph constant) or from two arrays. Initialising again replaces the
// catalog atomically; lookups already running keep the catalog they started with.
#include <memory>
#include <string>

#include "custom_ops/cc/feature_ops/ragged_checks.h"
#include "custom_ops/cc/feature_ops/semantic_id_table.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xgr {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::ResourceHandle;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("XgrSemanticIdTableHandle")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
A handle to a semantic-ID catalog (item id -> code path) in the resource manager.

table: the resource handle; initialise it with XgrSemanticIdTableInitFromFile or
  XgrSemanticIdTableInitFromArrays before looking items up.
shared_name: the table's name; must be non-empty (tables with the same name are one table).
)doc");

class TableHandleOp : public tensorflow::ResourceHandleOp<SemanticIdTableResource> {
 public:
  explicit TableHandleOp(OpKernelConstruction* ctx) : ResourceHandleOp(ctx) {
    std::string shared_name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name));
    OP_REQUIRES(ctx, !shared_name.empty(),
                absl::InvalidArgumentError("attribute shared_name must be non-empty"));
  }
};

REGISTER_KERNEL_BUILDER(Name("XgrSemanticIdTableHandle").Device(tensorflow::DEVICE_CPU),
                        TableHandleOp);

// Looks the table up, creating an empty resource on first use.
absl::Status TableForInit(OpKernelContext* ctx,
                          tensorflow::core::RefCountPtr<SemanticIdTableResource>* table) {
  ResourceHandle handle;
  TF_RETURN_IF_ERROR(tensorflow::HandleFromInput(ctx, 0, &handle));
  return tensorflow::LookupOrCreateResource<SemanticIdTableResource>(
      ctx, handle, table, [](SemanticIdTableResource** out) {
        *out = new SemanticIdTableResource();
        return absl::OkStatus();
      });
}

absl::Status InitFromArraysShape(InferenceContext* c) {
  ShapeHandle unused, ids, codes;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &ids));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &codes));
  tensorflow::shape_inference::DimensionHandle n;
  return c->Merge(c->Dim(ids, 0), c->Dim(codes, 0), &n);
}

REGISTER_OP("XgrSemanticIdTableInitFromArrays")
    .Input("table: resource")
    .Input("item_ids: int64")
    .Input("codes: int64")
    .Attr("codebook_size: int >= 1")
    .SetShapeFn(InitFromArraysShape)
    .Doc(R"doc(
Fills a semantic-ID table from arrays (small catalogs, tests).

item_ids: int64 [N], unique.
codes: int64 [N, levels], each in [0, codebook_size).
)doc");

class InitFromArraysOp : public OpKernel {
 public:
  explicit InitFromArraysOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("codebook_size", &codebook_size_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(codebook_size_, 1, kMaxInt32, "codebook_size"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(1);
    const Tensor& codes = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRank(ctx->input(0), 0, "table"));
    OP_REQUIRES_OK(ctx, CheckRank(ids, 1, "item_ids"));
    OP_REQUIRES_OK(ctx, CheckRank(codes, 2, "codes"));
    OP_REQUIRES(ctx, codes.dim_size(0) == ids.dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(
                    "codes must have one row per item id (", ids.dim_size(0), "), got shape ",
                    codes.shape().DebugString())));
    OP_REQUIRES(ctx, codes.dim_size(1) >= 1,
                absl::InvalidArgumentError("codes must have at least one level (column)"));
    std::shared_ptr<const SemanticIdCatalog> catalog;
    OP_REQUIRES_OK(ctx, BuildCatalog(ids.flat<int64_t>().data(), codes.flat<int64_t>().data(),
                                     ids.dim_size(0), codes.dim_size(1), codebook_size_,
                                     "semantic-ID table arrays", &catalog));
    tensorflow::core::RefCountPtr<SemanticIdTableResource> table;
    OP_REQUIRES_OK(ctx, TableForInit(ctx, &table));
    table->set_catalog(std::move(catalog));
  }

 private:
  int64_t codebook_size_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("XgrSemanticIdTableInitFromArrays").Device(tensorflow::DEVICE_CPU),
                        InitFromArraysOp);

REGISTER_OP("XgrSemanticIdTableInitFromFile")
    .Input("table: resource")
    .Input("filename: string")
    .Attr("levels: int >= 1")
    .Attr("codebook_size: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      return c->WithRank(c->input(1), 0, &unused);
    })
    .Doc(R"doc(
Fills a semantic-ID table from a catalog file (format: custom_ops/catalog_file.py).

filename: string scalar; any path TF's file systems read (a SavedModel asset in practice).
levels, codebook_size: must equal the values in the file's header.
)doc");

class InitFromFileOp : public OpKernel {
 public:
  explicit InitFromFileOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("levels", &levels_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("codebook_size", &codebook_size_));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(levels_, 1, 1 << 20, "levels"));
    OP_REQUIRES_OK(ctx, CheckAttrInRange(codebook_size_, 1, kMaxInt32, "codebook_size"));
  }

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckRank(ctx->input(0), 0, "table"));
    OP_REQUIRES_OK(ctx, CheckRank(ctx->input(1), 0, "filename"));
    const std::string path = ctx->input(1).scalar<tensorflow::tstring>()();
    std::shared_ptr<const SemanticIdCatalog> catalog;
    OP_REQUIRES_OK(ctx, ReadCatalogFile(path, levels_, codebook_size_, &catalog));
    tensorflow::core::RefCountPtr<SemanticIdTableResource> table;
    OP_REQUIRES_OK(ctx, TableForInit(ctx, &table));
    table->set_catalog(std::move(catalog));
  }

 private:
  int64_t levels_ = 0;
  int64_t codebook_size_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("XgrSemanticIdTableInitFromFile").Device(tensorflow::DEVICE_CPU),
                        InitFromFileOp);

REGISTER_OP("XgrSemanticIdTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Number of items in an initialised semantic-ID table (int64 scalar).");

class TableSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckRank(ctx->input(0), 0, "table"));
    ResourceHandle handle;
    OP_REQUIRES_OK(ctx, tensorflow::HandleFromInput(ctx, 0, &handle));
    tensorflow::core::RefCountPtr<SemanticIdTableResource> table;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, handle, &table));
    const auto catalog = table->catalog();
    OP_REQUIRES(ctx, catalog != nullptr,
                absl::FailedPreconditionError("the semantic-ID table is not initialised"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = static_cast<int64_t>(catalog->sorted_ids.size());
  }
};

REGISTER_KERNEL_BUILDER(Name("XgrSemanticIdTableSize").Device(tensorflow::DEVICE_CPU),
                        TableSizeOp);

}  // namespace
}  // namespace xgr
