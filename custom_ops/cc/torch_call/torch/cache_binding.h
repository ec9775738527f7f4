// The prompt cache's side of a package run (prompt_cache.h is the cache itself): the budgets
// an operator sets, what a call's inputs mean to the cache, the inputs the cache adds to the
// program and the counters a server reports. Kept apart from the packages so that running a
// package reads without the cache's rules, and those rules change in one place.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_CACHE_BINDING_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_CACHE_BINDING_H_

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
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
// cached lengths, block table and write slots at the padded batch.
void AddCacheInputs(const Signature& sig, const PromptCache& cache, const Reservation& r,
                    const std::vector<CacheRow>& rows, const BucketedShapes& shapes,
                    std::vector<at::Tensor>* host);

// Finishes a reservation however the run ends: kept only when it succeeded.
class ReservationGuard {
 public:
  ReservationGuard(PromptCache* cache, std::unique_ptr<Reservation> r);
  ~ReservationGuard();
  const Reservation& get() const { return *r_; }
  void Keep() { kept_ = true; }

 private:
  double Seconds() const;

  PromptCache* cache_;
  std::unique_ptr<Reservation> r_;
  std::chrono::steady_clock::time_point started_;
  bool kept_ = false;
};

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_CACHE_BINDING_H_
