// Copies beside a package's runs (see copy_stream.h).
#include "custom_ops/cc/torch_call/torch/copy_stream.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <utility>

#ifdef XGR_TORCH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace xgr {
namespace torch_call {
namespace {

// The copies run at once; every ticket is done.
class SynchronousCopies : public CopyStream {
 public:
  int64_t Launch(const std::function<std::vector<at::Tensor>()>& launch) override {
    launch();
    return ++last_;
  }
  bool Done(int64_t) override { return true; }
  void Wait(int64_t) override {}

 private:
  std::atomic<int64_t> last_{0};
};

#ifdef XGR_TORCH_CUDA

// A CUDA event without timing, made on the current device.
class Event {
 public:
  Event() { C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event& operator=(Event&&) = delete;

  void Record(cudaStream_t stream) { C10_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  void Block(cudaStream_t stream) { C10_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
  // Never throws: it runs where a reservation finishes, in a destructor. A failed query
  // (a faulted device) counts as done, since nothing runs there any more.
  bool Query() {
    const cudaError_t state = cudaEventQuery(event_);
    if (state == cudaSuccess) return true;
    (void)cudaGetLastError();  // not ready is no error: leave none behind for the next call
    return state != cudaErrorNotReady;
  }
  void Synchronize() { C10_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

class CudaCopies : public CopyStream {
 public:
  explicit CudaCopies(const c10::Device& device)
      : device_(device),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  ~CudaCopies() override {
    std::lock_guard<std::mutex> lock(mu_);
    c10::cuda::CUDAGuard on_device(device_);
    for (Flight& flight : flights_) {
      try {
        flight.done.Synchronize();
      } catch (const c10::Error&) {  // a faulted device: nothing left to wait for
      }
    }
    flights_.clear();
  }

  int64_t Launch(const std::function<std::vector<at::Tensor>()>& launch) override {
    std::lock_guard<std::mutex> lock(mu_);
    c10::cuda::CUDAGuard on_device(device_);
    // After what the caller's stream queued (the partial-page copy of a new entry, say).
    Event before;
    before.Record(c10::cuda::getCurrentCUDAStream(device_.index()).stream());
    before.Block(stream_.stream());
    Flight flight;
    {
      c10::cuda::CUDAStreamGuard on_stream(stream_);
      flight.keep = launch();
    }
    flight.done.Record(stream_.stream());
    flight.ticket = ++last_;
    flights_.push_back(std::move(flight));
    return last_;
  }

  bool Done(int64_t ticket) override {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      c10::cuda::CUDAGuard on_device(device_);
      while (!flights_.empty() && flights_.front().done.Query()) flights_.pop_front();
    } catch (const c10::Error&) {  // a faulted device: nothing runs there any more
      flights_.clear();
    }
    return flights_.empty() || flights_.front().ticket > ticket;
  }

  void Wait(int64_t ticket) override {
    std::lock_guard<std::mutex> lock(mu_);
    c10::cuda::CUDAGuard on_device(device_);
    while (!flights_.empty() && flights_.front().ticket <= ticket) {
      flights_.front().done.Synchronize();
      flights_.pop_front();  // the stream runs in order: the earlier ones are done too
    }
  }

 private:
  struct Flight {
    int64_t ticket = 0;
    Event done;
    std::vector<at::Tensor> keep;  // freed once the copies that use them are done
  };

  c10::Device device_;
  c10::cuda::CUDAStream stream_;
  std::mutex mu_;
  std::deque<Flight> flights_;  // in ticket order
  int64_t last_ = 0;
};

#endif  // XGR_TORCH_CUDA

}  // namespace

std::unique_ptr<CopyStream> MakeCopyStream(const c10::Device& device) {
#ifdef XGR_TORCH_CUDA
  if (device.is_cuda()) {
    return std::make_unique<CudaCopies>(
        device.has_index() ? device : c10::Device(c10::kCUDA, c10::cuda::current_device()));
  }
#endif
  (void)device;
  return std::make_unique<SynchronousCopies>();
}

void SynchronizeCurrentStream(const c10::Device& device) {
#ifdef XGR_TORCH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard on_device(device);
    c10::cuda::getCurrentCUDAStream(on_device.current_device().index()).synchronize();
  }
#endif
  (void)device;
}

}  // namespace torch_call
}  // namespace xgr
