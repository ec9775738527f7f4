// Copies that run beside a package's runs. The prompt cache's spills to its host tier go on a
// stream of their own, so an evicted entry's device-to-host copy overlaps the next run
// instead of delaying the request that made room. A copy is known by a ticket: the cache
// hands the spilled pages out again, and reads the host pages back, only once the ticket's
// copies are done. On a CPU device (or a build without CUDA) a copy runs at once and every
// ticket is done.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_COPY_STREAM_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_COPY_STREAM_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace xgr {
namespace torch_call {

class CopyStream {
 public:
  virtual ~CopyStream() = default;  // an implementation waits for its copies in flight

  // Runs `launch` with the copy stream current, after the work the device's current stream
  // queued before; the tensors it returns (what its copies read or write) are held until
  // they are done. Tickets increase: one that is done means every earlier one is.
  virtual int64_t Launch(const std::function<std::vector<at::Tensor>()>& launch) = 0;
  // Whether `ticket`'s copies are done, without waiting; never throws (a faulted device's
  // copies count as done).
  virtual bool Done(int64_t ticket) = 0;
  // Waits until `ticket`'s copies are done.
  virtual void Wait(int64_t ticket) = 0;
};

// A stream of `device`'s (a synchronous one for a CPU device or a build without CUDA).
std::unique_ptr<CopyStream> MakeCopyStream(const c10::Device& device);

// Waits for the work the calling thread queued on `device`'s current stream (not for the
// copies on a copy stream, as a device-wide synchronisation would); nothing on a CPU device.
void SynchronizeCurrentStream(const c10::Device& device);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_COPY_STREAM_H_
