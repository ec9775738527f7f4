// The prompt caches' shared host memory (see host_arena.h).
#include "custom_ops/cc/torch_call/torch/host_arena.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>

namespace xgr {
namespace torch_call {

constexpr int64_t kMaxChunkBytes = int64_t{256} << 20;

int64_t HostArena::ChunkBytes(int64_t budget_bytes, bool pinned) {
  const int64_t budget = std::max<int64_t>(budget_bytes, 1);
  if (!pinned) {
    // Equal chunks that add up to the budget (a remainder under one chunk aside).
    const int64_t chunks = (budget + kMaxChunkBytes - 1) / kMaxChunkBytes;
    return budget / chunks;
  }
  int64_t bytes = 1;
  while (bytes * 2 <= std::min(budget, kMaxChunkBytes)) bytes *= 2;
  return bytes;
}

HostArena::HostArena(int64_t budget_bytes, bool pinned)
    : budget_bytes_(budget_bytes),
      chunk_bytes_(ChunkBytes(budget_bytes, pinned)),
      chunks_(std::max<int64_t>(budget_bytes, 0) / chunk_bytes_),
      pinned_(pinned) {
  if (pinned_) {
    std::fprintf(stderr, "TorchCall: pinning the prompt cache's host tier: %lld chunks of %lld "
                 "MiB\n", static_cast<long long>(chunks_),
                 static_cast<long long>(chunk_bytes_ >> 20));
  }
  free_.reserve(chunks_);
  const auto options = at::TensorOptions().dtype(at::kByte).pinned_memory(pinned_);
  for (int64_t i = 0; i < chunks_; ++i) free_.push_back(at::empty({chunk_bytes_}, options));
}

at::Tensor HostArena::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return at::Tensor();
  at::Tensor chunk = std::move(free_.back());
  free_.pop_back();
  return chunk;
}

void HostArena::Give(const at::Tensor& chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(chunk);
}

int64_t HostArena::FreeChunks() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

std::shared_ptr<HostArena> SharedHostArena(int64_t budget_bytes, bool pinned) {
  if (budget_bytes <= 0) return nullptr;
  // Held weakly: the arena's memory goes back when the last cache that held it is destroyed.
  static std::mutex mu;
  static std::weak_ptr<HostArena> arenas[2];
  std::lock_guard<std::mutex> lock(mu);
  std::weak_ptr<HostArena>& slot = arenas[pinned ? 1 : 0];
  std::shared_ptr<HostArena> arena = slot.lock();
  if (!arena || arena->budget_bytes() != budget_bytes) {
    arena = std::make_shared<HostArena>(budget_bytes, pinned);
    slot = arena;
  }
  return arena;
}

}  // namespace torch_call
}  // namespace xgr
