// The prompt cache's side of a package run (prompt_cache.h is the cache itself): the budgets
// an operator sets, what a call's inputs mean to the cache, the inputs the cache adds to the
// program and the counters a server reports. Kept apart from the packages so that running a
// package reads without the cache's rules, and those rules change in one place.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_CACHE_BINDING_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_CACHE_BINDING_H_

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "custom_ops/cc/torch_call/torch/prompt_cache.h"
#include "custom_ops/cc/torch_call/torch/signature.h"
#include "custom_ops/cc/torch_call/torch_runner.h"

namespace xgr {
namespace torch_call {

// The prompt cache's byte budget in this process (per package that keeps one):
// XGR_PROMPT_CACHE_BYTES (`xgr serve --prompt_cache_gb` sets it), else 256 MiB.
int64_t CacheBudget();

// The host tier's byte budget beside each pool: XGR_PROMPT_CACHE_HOST_BYTES (`xgr serve
// --prompt_cache_host_gb` sets it), else none.
int64_t HostCacheBudget();

// The cache's counters as the JSON object a package's stats hold under "prompt_cache".
std::string CacheStatsJson(const CacheStats& st);

// The rows the cache plans, from a call's host inputs (shapes and value rules already
// checked); InvalidArgument naming frozen_lengths' row and rule for a frozen part the cache
// cannot keep.
Status CacheRows(const CacheSpec& cache, const std::vector<InputView>& inputs,
                 std::vector<CacheRow>* rows);

// The caller's frozen_lengths and user_keys give way to the cache's inputs of this run:
// cached lengths, block table and write slots at the padded batch. The block table spans
// the padded prompt on a GPU (one captured graph per bucket) and the longest cached part on
// the CPU (whose program attends every column).
void AddCacheInputs(const Signature& sig, const PromptCache& cache, const Reservation& r,
                    const std::vector<CacheRow>& rows, const BucketedShapes& shapes,
                    std::vector<at::Tensor>* host);

// What a second run of a batch costs beyond its prefill, in prompt tokens of prefill work
// (its launches and its decoding's fixed part): a split must save more than this.
constexpr int64_t kSplitRunTokens = 512;

// That cost in this process: XGR_PROMPT_CACHE_SPLIT_TOKENS, else kSplitRunTokens.
int64_t SplitRunTokens();

// The batch's rows as the runs that serve them best: one group (every row, in order) or two,
// the rows with the shorter suffixes (prompt length less the cached part) in the first. A
// run pads every row to its longest suffix, so a batch of cache hits and misses runs the
// hits apart when the prefill work that saves exceeds `split_tokens`.
std::vector<std::vector<int64_t>> SuffixGroups(const Signature& sig, const Reservation& r,
                                               const std::vector<CacheRow>& rows,
                                               int64_t split_tokens);

// Whether every output of `sig` has the batch as its first dimension (a batch can then run
// as sub-batches and be put back together).
bool BatchMajorOutputs(const Signature& sig);

// Runs a batch as the sub-batches `groups` (SuffixGroups): `run` gets each group's rows of
// the batch-major inputs (the others as they are), its cache rows and a reservation of its
// plans alone (for the run's tables; the batch's reservation keeps the rest). Every result
// row lands back at its row of the batch; each group's results are copied out before the
// next group runs (a replayed graph's outputs are its own buffers).
using GroupRunner = std::function<std::vector<at::Tensor>(
    const std::vector<InputView>&, const std::vector<CacheRow>&, const Reservation&)>;
std::vector<at::Tensor> RunInGroups(const Signature& sig, const std::vector<InputView>& inputs,
                                    const std::vector<CacheRow>& rows, const Reservation& r,
                                    const std::vector<std::vector<int64_t>>& groups,
                                    const GroupRunner& run);

// Finishes a reservation however the run ends: kept only when it succeeded.
class ReservationGuard {
 public:
  ReservationGuard(PromptCache* cache, std::unique_ptr<Reservation> r);
  ~ReservationGuard();
  const Reservation& get() const { return *r_; }
  void Keep() { kept_ = true; }
  void RanAs(int runs) { r_->runs = runs; }

 private:
  PromptCache* cache_;
  std::unique_ptr<Reservation> r_;
  std::chrono::steady_clock::time_point started_;
  bool kept_ = false;
};

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_CACHE_BINDING_H_
