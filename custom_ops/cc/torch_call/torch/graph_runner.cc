// CUDA graph replay of an AOTInductor package's runs (see graph_runner.h).
#include "custom_ops/cc/torch_call/torch/graph_runner.h"

#ifdef XGR_TORCH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include "custom_ops/cc/torch_call/torch/graph_admission.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace xgr {
namespace torch_call {
namespace {

// Held by every capture and every release of cached memory in the process: returning memory
// to the device (cudaFree) while another thread captures would break that capture, and the
// packages of two model versions capture and unload on their own threads.
std::mutex& CaptureMutex() {
  static std::mutex mu;
  return mu;
}

// One bucket's graph and the fixed buffers it reads and writes.
struct Captured {
  std::vector<at::Tensor> staging;     // pinned host inputs
  std::vector<at::Tensor> device_in;   // the copied inputs, then the resident tensors
  std::vector<at::Tensor> device_out;  // allocated inside the capture, in the shared pool
  std::vector<at::Tensor> host_out;    // pinned host outputs
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

class CudaGraphRunner : public GraphRunner {
 public:
  CudaGraphRunner(torch::inductor::AOTIModelPackageLoader* loader, c10::Device device,
                  int max_graphs)
      : loader_(loader), device_(device), admission_(max_graphs),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())),
        pool_(at::cuda::graph_pool_handle()) {}

  ~CudaGraphRunner() override {
    std::lock_guard<std::mutex> lock(mu_);
    c10::cuda::CUDAGuard on_device(device_);
    graphs_.clear();  // graphs before their pool's tensors, under the device
  }

  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs, const std::string& key,
                              const std::vector<at::Tensor>& resident) override {
    std::lock_guard<std::mutex> lock(mu_);
    c10::cuda::CUDAGuard on_device(device_);
    c10::cuda::CUDAStreamGuard on_stream(stream_);
    ++stats_.calls;
    if (!stats_.failure.empty()) return Eager(inputs, resident);
    const GraphAdmission::Decision decision = admission_.See(key);
    if (decision.action == GraphAdmission::Action::kEager) return Eager(inputs, resident);
    if (decision.action == GraphAdmission::Action::kCapture) {
      if (!decision.evict.empty()) {
        graphs_.erase(decision.evict);
        ++stats_.evictions;
      }
      const auto started = std::chrono::steady_clock::now();
      try {
        graphs_.emplace(key, Capture(inputs, resident));
      } catch (const c10::Error& e) {
        GiveUp(e.what_without_backtrace());
        return Eager(inputs, resident);
      } catch (const std::exception& e) {
        GiveUp(e.what());
        return Eager(inputs, resident);
      }
      admission_.Held(key);
      ++stats_.captures;
      // A capture makes its call slow; the shapes name the traffic the warm-up did not cover.
      std::fprintf(stderr, "TorchCall: captured a CUDA graph in %.0f ms (%zu held) for the "
                   "inputs %s\n",
                   std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - started).count(),
                   graphs_.size(), key.c_str());
    }
    Captured& graph = graphs_.at(key);
    for (size_t i = 0; i < inputs.size(); ++i) {
      graph.staging[i].copy_(inputs[i]);
      graph.device_in[i].copy_(graph.staging[i], /*non_blocking=*/true);
    }
    graph.graph->replay();
    for (size_t i = 0; i < graph.device_out.size(); ++i) {
      graph.host_out[i].copy_(graph.device_out[i], /*non_blocking=*/true);
    }
    stream_.synchronize();
    ++stats_.replays;
    std::vector<at::Tensor> results;
    results.reserve(graph.host_out.size());
    // The pinned buffers are the next replay's: the caller gets its own copies.
    for (const auto& out : graph.host_out) results.push_back(out.clone());
    return results;
  }

  GraphStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    GraphStats stats = stats_;
    stats.graphs = static_cast<int64_t>(graphs_.size());
    stats.budget = admission_.max_graphs();
    return stats;
  }

 private:
  Captured Capture(const std::vector<at::Tensor>& inputs,
                   const std::vector<at::Tensor>& resident) {
    Captured graph;
    for (const auto& in : inputs) {
      graph.staging.push_back(at::empty(in.sizes(), in.options().pinned_memory(true)));
      graph.staging.back().copy_(in);
      graph.device_in.push_back(at::empty(in.sizes(), in.options().device(device_)));
      graph.device_in.back().copy_(graph.staging.back(), /*non_blocking=*/true);
    }
    graph.device_in.insert(graph.device_in.end(), resident.begin(), resident.end());
    // Warm-up outside the capture: the first run of a shape folds constants, loads modules
    // and creates library handles, none of which a graph may record.
    std::lock_guard<std::mutex> capturing(CaptureMutex());
    loader_->run(graph.device_in, stream_.stream());
    stream_.synchronize();
    // The warm-up's blocks back to the device: the capture allocates from the graphs' own
    // pool, which cannot reuse blocks cached for eager runs, so the largest bucket would
    // otherwise hold its working memory twice.
    c10::cuda::CUDACachingAllocator::emptyCache();
    graph.graph = std::make_unique<at::cuda::CUDAGraph>();
    // Thread-local mode: other threads (other packages, TF's copies) may keep using CUDA.
    graph.graph->capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
    try {
      graph.device_out = loader_->run(graph.device_in, stream_.stream());
    } catch (...) {
      try {
        graph.graph->capture_end();
      } catch (...) {
      }
      throw;
    }
    graph.graph->capture_end();
    for (const auto& out : graph.device_out) {
      graph.host_out.push_back(
          at::empty(out.sizes(), out.options().device(at::kCPU).pinned_memory(true)));
    }
    return graph;
  }

  std::vector<at::Tensor> Eager(const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& resident) {
    std::vector<at::Tensor> on_device;
    on_device.reserve(inputs.size() + resident.size());
    for (const auto& in : inputs) on_device.push_back(in.to(device_));
    on_device.insert(on_device.end(), resident.begin(), resident.end());
    std::vector<at::Tensor> outputs = loader_->run(on_device, stream_.stream());
    std::vector<at::Tensor> results;
    for (const auto& out : outputs) results.push_back(out.to(at::kCPU));
    ++stats_.eager_runs;
    return results;
  }

  void GiveUp(const std::string& why) {
    stats_.failure = why;
    std::fprintf(stderr,
                 "TorchCall: capturing a CUDA graph of the package failed; it runs eagerly "
                 "from now on: %s\n",
                 why.c_str());
  }

  torch::inductor::AOTIModelPackageLoader* loader_;
  c10::Device device_;
  GraphAdmission admission_;
  c10::cuda::CUDAStream stream_;
  decltype(at::cuda::graph_pool_handle()) pool_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Captured> graphs_;
  GraphStats stats_;
};

}  // namespace

std::unique_ptr<GraphRunner> MakeGraphRunner(torch::inductor::AOTIModelPackageLoader* loader,
                                             c10::Device device, int max_graphs) {
  if (!device.has_index()) device = c10::Device(c10::kCUDA, c10::cuda::current_device());
  return std::make_unique<CudaGraphRunner>(loader, device, max_graphs);
}

bool GraphsBuilt() { return true; }

void ReleaseCachedDeviceMemory() {
  std::lock_guard<std::mutex> capturing(CaptureMutex());
  c10::cuda::CUDACachingAllocator::emptyCache();
}

bool DeviceMemory(const c10::Device& device, int64_t* free_bytes, int64_t* total_bytes) {
  if (!device.is_cuda()) return false;
  c10::cuda::CUDAGuard on_device(device);
  size_t free_now = 0, total = 0;
  if (cudaMemGetInfo(&free_now, &total) != cudaSuccess) {
    (void)cudaGetLastError();  // leave no sticky error for the next call
    return false;
  }
  *free_bytes = static_cast<int64_t>(free_now);
  *total_bytes = static_cast<int64_t>(total);
  return true;
}

}  // namespace torch_call
}  // namespace xgr

#else  // a build without CUDA: packages run eagerly

namespace xgr {
namespace torch_call {

std::unique_ptr<GraphRunner> MakeGraphRunner(torch::inductor::AOTIModelPackageLoader*,
                                             c10::Device, int) {
  return nullptr;
}

bool GraphsBuilt() { return false; }

void ReleaseCachedDeviceMemory() {}

bool DeviceMemory(const c10::Device&, int64_t*, int64_t*) { return false; }

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_TORCH_CUDA
