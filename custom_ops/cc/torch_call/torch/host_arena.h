// Host memory for the prompt caches' host tiers, allocated once per process and shared.
//
// Pinning host memory is slow (a few hundred MB takes as long as a request), and a host tier
// that pinned each spilled entry afresh paid that on the request's path. The arena pins the
// whole host budget up front, in equal chunks, when the first cache that keeps a host tier is
// made; caches take chunks as their tiers fill and give them back when they are destroyed.
// Every cache of the process shares the one arena: while a new model version's cache and the
// old one's both live (a version swap), they share the budget instead of pinning it twice.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_HOST_ARENA_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_HOST_ARENA_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace xgr {
namespace torch_call {

class HostArena {
 public:
  // Chunks of `ChunkBytes(budget_bytes, pinned)` filling `budget_bytes`, allocated now
  // (`pinned`: page-locked, for copies to and from a GPU). Throws c10::Error when the host
  // cannot give that much.
  HostArena(int64_t budget_bytes, bool pinned);

  // The size of one chunk: at most 256 MiB. Pinned chunks are powers of two, the sizes the
  // pinned allocator hands out without rounding up.
  static int64_t ChunkBytes(int64_t budget_bytes, bool pinned);

  // A chunk (uint8, `chunk_bytes()`) no cache holds, or an undefined tensor when every chunk
  // is held.
  at::Tensor Take();
  // `chunk` (one `Take` returned) back to the arena.
  void Give(const at::Tensor& chunk);
  // Chunks no cache holds now.
  int64_t FreeChunks();

  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  int64_t chunks() const { return chunks_; }
  bool pinned() const { return pinned_; }

 private:
  int64_t budget_bytes_;
  int64_t chunk_bytes_;
  int64_t chunks_;
  bool pinned_;
  std::mutex mu_;
  std::vector<at::Tensor> free_;
};

// The process's arena for this budget (`pinned` beside a GPU): the one a living cache holds,
// else a new one (null for a budget of 0). An arena lives while a cache holds it.
std::shared_ptr<HostArena> SharedHostArena(int64_t budget_bytes, bool pinned);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_HOST_ARENA_H_
