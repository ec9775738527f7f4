// The seam between the TF half and the torch half of the TorchCall op.
//
// Torch's headers redefine TF's LOG/CHECK macros, so the two halves are separate translation
// units and this header includes neither: tensors cross it as raw buffers plus a dtype code and
// a shape, errors as a code plus a message, and a torch result's lifetime as a type-erased
// shared_ptr (the TF half keeps it inside a TensorBuffer for zero-copy outputs).
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_RUNNER_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xgr {
namespace torch_call {

// The dtypes that may cross; each half maps its own enum onto these.
enum class ElementType : int {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
};

const char* ElementTypeName(ElementType t);
// Bytes per element; every crossing dtype has a fixed width.
int64_t ElementSize(ElementType t);

// kInvalidArgument is the caller's mistake (a 4xx); kInternal (torch failed running a package
// that accepted the inputs, or cannot load it) and kResourceExhausted (the device ran out of
// memory) are the server's own faults (5xx).
enum class Code : int {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kFailedPrecondition,
  kInternal,
  kResourceExhausted,
};

struct Status {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
  static Status Ok() { return {}; }
};

// A TF input buffer lent to torch for the duration of one call (host memory, row-major).
struct InputView {
  const void* data = nullptr;
  ElementType dtype = ElementType::kFloat32;
  std::vector<int64_t> shape;
};

// A torch result on the host, row-major. `owner` keeps the torch storage alive; `data` is
// inside it.
struct Result {
  void* data = nullptr;
  ElementType dtype = ElementType::kFloat32;
  std::vector<int64_t> shape;
  std::shared_ptr<void> owner;
};

// How a process runs packages: part of the cache key, so two graphs asking for different
// settings never share a loaded package by accident.
struct LoadOptions {
  int concurrency = 1;  // AOTInductor model instances that may run at once
};

// Tables a package reads on every run (a catalog's search tables), loaded once from a tables
// file onto the package's device and held by the runtime: they never cross from TF. Opaque to
// the TF half.
struct Tables;

// A loaded package (AOTInductor or TorchScript). Thread-safe: Run may be called from many
// threads at once.
class Package {
 public:
  virtual ~Package() = default;
  // Runs the package on `inputs` (and `tables`, for a package whose contract names tables;
  // null otherwise) and returns host results in `outputs`. `threads` is the intra-op thread
  // count applied once to each calling thread.
  virtual Status Run(const std::vector<InputView>& inputs, int threads,
                     std::vector<Result>* outputs, const Tables* tables = nullptr) = 0;
  // How many tables the package reads (0: it takes its inputs alone).
  virtual size_t num_tables() const { return 0; }
  // One line per input/output, e.g. "int64[batch,len]", for messages.
  virtual std::string Describe() const = 0;
  virtual std::string device() const = 0;
  virtual std::string format() const = 0;
  // Declared output dtypes, checked against the op's `Tout` attr before the first run.
  virtual const std::vector<ElementType>& output_dtypes() const = 0;
  // Counters of the package's runs as a JSON object (CUDA graph replays, captures, ...).
  virtual std::string StatsJson() const { return "{}"; }
};

// Loads `path` once per process (per file and options) and returns the shared package. A
// file is known by its identity on disk (device, inode, size, modification time), not its
// path: versions of a model that hard-link one package file share one loaded package. A
// failed load is not cached, so a repaired file loads on the next call.
Status GetPackage(const std::string& path, const LoadOptions& options,
                  std::shared_ptr<Package>* package);

// Loads the tables file `path` (torch.save of a dict of tensors, written by the export) for
// `package` once per process: every table its contract names, with the dtype and sizes it
// names, moved to its device. Errors name the file and the table at fault.
Status GetTables(const std::shared_ptr<Package>& package, const std::string& path,
                 std::shared_ptr<const Tables>* tables);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_RUNNER_H_
