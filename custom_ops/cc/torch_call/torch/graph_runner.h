// Replaying an AOTInductor package's run as CUDA graphs, one per bucketed input shape.
//
// AOTInductor's wrapper launches every kernel of a search from the host (thousands a call),
// so a served call is bound by launches, not by the GPU. The runner captures the package's run
// of each bucketed shape once and replays it: one graph launch a call, plus one copy per input
// and output through pinned host buffers of the bucket.
//
// What capture needs from the package (measured): a loader created with run_single_threaded
// (the multi-runner container queries CUDA events while it runs, which capture forbids), one
// eager warm-up run of each shape before its capture (constant folding, lazy module loads,
// library handles), a side stream, and fixed input and output buffers that outlive the graph.
// Replays are serialised: one package instance, one set of buffers per bucket, one memory pool
// shared by the graphs (safe because no two replays overlap and every replay's outputs are
// copied out before the next one starts).
//
// Builds without CUDA have no runner (MakeGraphRunner returns null) and run eagerly.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_GRAPH_RUNNER_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_GRAPH_RUNNER_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace xgr {
namespace torch_call {

// Counters of one package's graphed runs (read by benchmarks and tests through the library's
// C entry point, see packages.cc).
struct GraphStats {
  int64_t calls = 0;
  int64_t replays = 0;
  int64_t captures = 0;
  int64_t eager_runs = 0;  // calls run without a graph: a shape not admitted (see
                           // graph_admission.h), or every call once a capture failed
  int64_t evictions = 0;
  int64_t graphs = 0;      // graphs held now
  int64_t budget = 0;      // graphs held at most
  std::string failure;     // why capture was given up, empty while it works
};

class GraphRunner {
 public:
  virtual ~GraphRunner() = default;
  // Runs the package on host `inputs` (already at a bucketed shape) followed by `resident`
  // (device tensors passed as they are, never copied: a catalog's tables) and returns host
  // outputs the caller owns. `key` names the bucket and the resident set: a graph reads the
  // resident tensors at the addresses it was captured with, which must outlive its replays
  // under that key. Thread-safe: calls are serialised.
  virtual std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs,
                                      const std::string& key,
                                      const std::vector<at::Tensor>& resident) = 0;
  virtual GraphStats Stats() const = 0;
};

// A runner replaying `loader`'s runs on `device`, keeping at most `max_graphs` graphs, which
// shapes chosen by GraphAdmission; null in a build without CUDA. `loader` must be created with run_single_threaded and outlive the
// runner.
std::unique_ptr<GraphRunner> MakeGraphRunner(torch::inductor::AOTIModelPackageLoader* loader,
                                             c10::Device device, int max_graphs);

// Whether this build can capture CUDA graphs.
bool GraphsBuilt();

// Returns the device memory torch's caching allocator holds but no tensor uses (a destroyed
// graph's pool) to the device; nothing in a build without CUDA.
void ReleaseCachedDeviceMemory();

// Free and total bytes of `device` as the driver reports them; false on a CPU device or in a
// build without CUDA.
bool DeviceMemory(const c10::Device& device, int64_t* free_bytes, int64_t* total_bytes);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_GRAPH_RUNNER_H_
