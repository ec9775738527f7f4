// TorchCall: runs an AOTInductor or TorchScript package (a SavedModel asset) inside a TF graph.
//
// The TF half: op registration, TF <-> seam conversion, zero-copy outputs. Everything that
// includes torch lives in torch/ (see torch_runner.h for why the halves are separate).
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "absl/status/status.h"
#include "custom_ops/cc/torch_call/torch_runner.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace xgr {
namespace torch_call {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// TF output buffers must be 64-byte aligned (EIGEN_MAX_ALIGN_BYTES): Eigen kernels downstream
// abort on anything less, so torch memory is adopted only at this alignment.
constexpr uintptr_t kTfAlignment = 64;

constexpr std::pair<DataType, ElementType> kTypes[] = {
    {tensorflow::DT_FLOAT, ElementType::kFloat32}, {tensorflow::DT_DOUBLE, ElementType::kFloat64},
    {tensorflow::DT_HALF, ElementType::kFloat16},  {tensorflow::DT_BFLOAT16, ElementType::kBFloat16},
    {tensorflow::DT_INT8, ElementType::kInt8},     {tensorflow::DT_UINT8, ElementType::kUInt8},
    {tensorflow::DT_INT32, ElementType::kInt32},   {tensorflow::DT_INT64, ElementType::kInt64},
    {tensorflow::DT_BOOL, ElementType::kBool},
};

bool ToElementType(DataType dt, ElementType* out) {
  for (const auto& [tf_type, type] : kTypes) {
    if (tf_type == dt) {
      *out = type;
      return true;
    }
  }
  return false;
}

DataType ToDataType(ElementType t) {
  for (const auto& [tf_type, type] : kTypes) {
    if (type == t) return tf_type;
  }
  return tensorflow::DT_INVALID;
}

absl::Status ToAbsl(const Status& s) {
  const std::string message = "TorchCall: " + s.message;
  switch (s.code) {
    case Code::kOk: return absl::OkStatus();
    case Code::kInvalidArgument: return absl::InvalidArgumentError(message);
    case Code::kNotFound: return absl::NotFoundError(message);
    case Code::kFailedPrecondition: return absl::FailedPreconditionError(message);
    case Code::kInternal: return absl::InternalError(message);
    case Code::kResourceExhausted: return absl::ResourceExhaustedError(message);
  }
  return absl::UnknownError(message);
}

// A TF buffer that adopts a torch result and keeps its at::Tensor alive (via `owner`).
class TorchBuffer : public tensorflow::TensorBuffer {
 public:
  TorchBuffer(std::shared_ptr<void> owner, void* data, size_t bytes)
      : TensorBuffer(data), owner_(std::move(owner)), bytes_(bytes) {}
  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(bytes_);
    proto->set_allocator_name("torch");
  }
  // Not ours to write: the memory may be shared with the package (e.g. a returned weight), so
  // TF must not forward it to an op that updates its input in place.
  bool OwnsMemory() const override { return false; }

 private:
  std::shared_ptr<void> owner_;
  size_t bytes_;
};

class TorchCallOp;

// Every TorchCall kernel alive in the process. TF's eager runtime keeps a function's kernels
// in its kernel cache after the function's model is unloaded, and a kernel holds the packages
// it ran: so a server that unloads a model version tells the kernels to let go of that
// version's packages (XgrTorchCallRelease), and a package no other version holds is freed.
struct KernelRegistry {
  std::mutex mu;
  std::set<TorchCallOp*> kernels;
};

KernelRegistry& Kernels() {
  static KernelRegistry* registry = new KernelRegistry();  // outlives every kernel
  return *registry;
}

class TorchCallOp : public OpKernel {
 public:
  explicit TorchCallOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    {
      std::lock_guard<std::mutex> lock(Kernels().mu);
      Kernels().kernels.insert(this);
    }
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &output_types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("intra_op_threads", &threads_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("concurrency", &options_.concurrency));
    OP_REQUIRES(ctx, threads_ >= 1,
                absl::InvalidArgumentError("TorchCall: intra_op_threads must be >= 1, got " +
                                           std::to_string(threads_)));
    OP_REQUIRES(ctx, options_.concurrency >= 1,
                absl::InvalidArgumentError("TorchCall: concurrency must be >= 1, got " +
                                           std::to_string(options_.concurrency)));
  }

  ~TorchCallOp() override {
    std::lock_guard<std::mutex> lock(Kernels().mu);
    Kernels().kernels.erase(this);
  }

  // Lets go of the packages and tables whose paths start with `prefix` (a model version's
  // folder); returns how many. Called again, a path loads afresh.
  int Release(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    int released = 0;
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->first.compare(0, prefix.size(), prefix) == 0) {
        it = held_.erase(it);
        ++released;
      } else {
        ++it;
      }
    }
    if (held_tables_.second.first.compare(0, prefix.size(), prefix) == 0 &&
        held_tables_.second.second) {
      held_tables_ = {};
      ++released;
    }
    return released;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& package_path = ctx->input(0);
    OP_REQUIRES(ctx, package_path.dims() == 0 && package_path.dtype() == tensorflow::DT_STRING,
                absl::InvalidArgumentError("TorchCall: `package` must be a scalar string (the "
                                           "asset path), got shape " +
                                           package_path.shape().DebugString()));
    const std::string path(package_path.scalar<tensorflow::tstring>()());
    std::shared_ptr<Package> package;
    OP_REQUIRES_OK(ctx, ToAbsl(Held(path, &package)));
    OP_REQUIRES_OK(ctx, CheckOutputTypes(*package, path));
    std::shared_ptr<const Tables> tables;
    OP_REQUIRES_OK(ctx, HeldTables(ctx, package, &tables));

    tensorflow::OpInputList inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("inputs", &inputs));
    std::vector<InputView> views(inputs.size());
    for (int i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i];
      InputView& view = views[i];
      OP_REQUIRES(ctx, ToElementType(t.dtype(), &view.dtype),
                  absl::InvalidArgumentError("TorchCall: input " + std::to_string(i) +
                                             " has unsupported dtype " +
                                             tensorflow::DataTypeString(t.dtype())));
      view.data = t.data();
      for (int d = 0; d < t.dims(); ++d) view.shape.push_back(t.dim_size(d));
    }
    std::vector<Result> results;
    OP_REQUIRES_OK(ctx, ToAbsl(package->Run(views, threads_, &results, tables.get())));
    for (size_t i = 0; i < results.size(); ++i) {
      OP_REQUIRES_OK(ctx, SetOutput(ctx, static_cast<int>(i), results[i]));
    }
  }

 private:
  // The package at `path`, held by this kernel: a package lives while a kernel that ran it
  // does (its model version is loaded), and goes with the last one.
  Status Held(const std::string& path, std::shared_ptr<Package>* package) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = held_.find(path);
      if (it != held_.end()) {
        *package = it->second;
        return Status::Ok();
      }
    }
    Status s = GetPackage(path, options_, package);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      held_.emplace(path, *package);
    }
    return s;
  }

  // The tables file the op names (none, or one scalar path: an asset beside the package),
  // loaded once for this package.
  absl::Status HeldTables(OpKernelContext* ctx, const std::shared_ptr<Package>& package,
                          std::shared_ptr<const Tables>* tables) {
    tensorflow::OpInputList paths;
    absl::Status s = ctx->input_list("tables", &paths);
    if (!s.ok()) return s;
    if (paths.size() == 0) return absl::OkStatus();  // Run refuses a package that reads tables
    if (paths.size() != 1 || paths[0].dims() != 0 || paths[0].dtype() != tensorflow::DT_STRING) {
      return absl::InvalidArgumentError("TorchCall: `tables` must be one scalar string (the "
                                        "tables asset's path)");
    }
    const std::string path(paths[0].scalar<tensorflow::tstring>()());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (held_tables_.first == package.get() && held_tables_.second.first == path) {
        *tables = held_tables_.second.second;
        return absl::OkStatus();
      }
    }
    Status loaded = GetTables(package, path, tables);
    if (!loaded.ok()) return ToAbsl(loaded);
    std::lock_guard<std::mutex> lock(mu_);
    held_tables_ = {package.get(), {path, *tables}};
    return absl::OkStatus();
  }

  absl::Status CheckOutputTypes(const Package& package, const std::string& path) const {
    const auto& declared = package.output_dtypes();
    bool same = declared.size() == output_types_.size();
    for (size_t i = 0; same && i < declared.size(); ++i) {
      same = ToDataType(declared[i]) == output_types_[i];
    }
    if (same) return absl::OkStatus();
    std::string want;
    for (DataType dt : output_types_) want += " " + tensorflow::DataTypeString(dt);
    return absl::InvalidArgumentError("TorchCall: Tout =" + want + " does not match package " +
                                      path + ": " + package.Describe());
  }

  // Adopts the torch buffer when TF may use it as is; copies otherwise.
  absl::Status SetOutput(OpKernelContext* ctx, int index, const Result& r) const {
    TensorShape shape;
    absl::Status s = TensorShape::BuildTensorShape(r.shape, &shape);
    if (!s.ok()) return s;
    const size_t bytes = static_cast<size_t>(shape.num_elements() * ElementSize(r.dtype));
    const DataType dtype = ToDataType(r.dtype);
    const bool aligned = reinterpret_cast<uintptr_t>(r.data) % kTfAlignment == 0;
    if (bytes > 0 && aligned && !AliasesInput(ctx, r.data)) {
      tensorflow::core::RefCountPtr<tensorflow::TensorBuffer> buffer(
          new TorchBuffer(r.owner, r.data, bytes));
      ctx->set_output(index, Tensor(dtype, shape, std::move(buffer)));
      return absl::OkStatus();
    }
    Tensor* out = nullptr;
    s = ctx->allocate_output(index, shape, &out);
    if (!s.ok()) return s;
    if (bytes > 0) std::memcpy(out->data(), r.data, bytes);
    return absl::OkStatus();
  }

  // A result that is (a view of) an input borrows TF memory torch does not own: adopting it
  // would outlive the input's buffer, so such results are copied.
  static bool AliasesInput(OpKernelContext* ctx, const void* data) {
    const char* p = static_cast<const char*>(data);
    for (int i = 1; i < ctx->num_inputs(); ++i) {
      const Tensor& t = ctx->input(i);
      const char* begin = static_cast<const char*>(t.data());
      if (begin != nullptr && p >= begin && p < begin + t.TotalBytes()) return true;
    }
    return false;
  }

  tensorflow::DataTypeVector output_types_;
  int threads_ = 1;
  LoadOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Package>> held_;
  // The last (package, tables path) this kernel ran and its tables, kept alive by the kernel.
  std::pair<const Package*, std::pair<std::string, std::shared_ptr<const Tables>>> held_tables_;
};

REGISTER_OP("TorchCall")
    .Input("package: string")
    .Input("tables: Ntables * string")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list({float, double, half, bfloat16, int8, uint8, int32, int64, bool}) >= 0")
    .Attr("Tout: list({float, double, half, bfloat16, int8, uint8, int32, int64, bool}) >= 1")
    .Attr("output_shapes: list(shape) = []")
    .Attr("intra_op_threads: int = 1")
    .Attr("concurrency: int = 1")
    .Attr("Ntables: int >= 0 = 0")
    // Stateful: it loads files into a process cache, and constant folding must not run it.
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<tensorflow::PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
      if (!shapes.empty() && static_cast<int>(shapes.size()) != c->num_outputs()) {
        return absl::InvalidArgumentError(
            "TorchCall: output_shapes has " + std::to_string(shapes.size()) +
            " entries for " + std::to_string(c->num_outputs()) + " outputs");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        if (shapes.empty()) {
          c->set_output(i, c->UnknownShape());
          continue;
        }
        tensorflow::shape_inference::ShapeHandle h;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &h));
        c->set_output(i, h);
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
Runs a Torch package (AOTInductor `.pt2` or TorchScript `.pt`) on the inputs.

package: scalar path of the package, usually a SavedModel asset.
tables: none, or the scalar path of the tables file (an asset) of a package whose contract
  names tables (a catalog padded to the package's capacities): loaded once onto the package's
  device and passed on every run.
inputs: host tensors, borrowed by torch without a copy and moved to the package's device.
outputs: the package's results on the host (adopted without a copy when 64-byte aligned).
output_shapes: optional static shapes for shape inference, one per output.
intra_op_threads: torch threads per calling TF thread.
concurrency: model instances of an AOTInductor package that may run at once.
)doc");

REGISTER_KERNEL_BUILDER(Name("TorchCall").Device(tensorflow::DEVICE_CPU), TorchCallOp);

}  // namespace
}  // namespace torch_call
}  // namespace xgr

// For a server unloading a model version (ctypes): every TorchCall kernel lets go of the
// packages and tables under `prefix` (the version's folder, ending in '/'); returns how many
// references were dropped.
extern "C" __attribute__((visibility("default"))) int XgrTorchCallRelease(const char* prefix) {
  if (prefix == nullptr || *prefix == '\0') return 0;
  const std::string folder(prefix);
  auto& registry = xgr::torch_call::Kernels();
  std::lock_guard<std::mutex> lock(registry.mu);
  int released = 0;
  for (auto* kernel : registry.kernels) released += kernel->Release(folder);
  return released;
}
