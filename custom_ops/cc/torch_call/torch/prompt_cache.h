// The prompt-KV cache of a served package: a returning user's frozen long-term prompt part is
// prefilled once, its keys and values kept in a paged pool on the package's device, and the
// next request of that user prefills only the rest (the engine's `torch_engine.prompt_cache`,
// here in the runtime, so a SavedModel served without Python torch has it too).
//
// What finds an entry: a BLAKE2b digest of the frozen part's tokens and segment layout,
// chained from its first token, under a root of the package's scope (its model, token layout
// and mask rule, fixed at export) and the request's user key. The key only selects among a
// user's own entries; the content decides whether one is valid: a client that sends another
// user's key gets that user's entries only if it also sends exactly that user's long-term
// prompt, whose KV is then the same. A request without a usable key is not cached.
//
// A batch reserves its rows before the package runs (host work on a few kilobytes: digests,
// lookups, pages) and finishes after: only a run that succeeded publishes what it wrote, so a
// failed run leaves the cache as it was. Entries a batch reads are pinned until it finishes.
// The pool is allocated once, at load, within the byte budget; a request never allocates, so
// the cache never causes an out-of-memory. Least recently used entries are evicted first;
// a row that finds no room even then runs uncached.
//
// The host tier (a byte budget of its own, 0: none) keeps what the pool evicts: an evicted
// entry's pages are copied to host pages of the pool's geometry under the digests that named
// it, least recently spilled dropped for room. The host pages come from the process's
// HostArena (host_arena.h: pinned once, beside a GPU, so a spill is one device-to-host copy
// and never a fresh pinned allocation). A row whose longest match is there, not in the pool,
// has it copied back into fresh pages before the run (a hit from the host tier: the copy's
// cost instead of the prefill's), and the entry leaves the host tier.
//
// With a host tier the pool evicts ahead of need: after planning a batch it keeps the pages
// of its largest entry so far free or on their way out, and the spills that free them run on
// a copy stream of their own (copy_stream.h) beside the batch's run. A spilled page is handed
// out again, and a spilled entry read back, only once its copy is done; a request that needs
// more room than was made ahead evicts, and waits for the copy, on its own path.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_PROMPT_CACHE_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_PROMPT_CACHE_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "custom_ops/cc/torch_call/torch/copy_stream.h"
#include "custom_ops/cc/torch_call/torch/host_arena.h"
#include "custom_ops/cc/torch_call/torch/signature.h"

namespace xgr {
namespace torch_call {

// One request as the cache sees it: its prompt tokens and segment ids (host copies; a causal
// prompt's segments counted from its item starts), the frozen part's length (0: nothing to
// cache) and the user key (empty: no key, not cached).
struct CacheRow {
  std::vector<int64_t> tokens;
  std::vector<int64_t> segments;
  int64_t frozen = 0;
  int64_t length = 0;
  std::string key;
};

// What the cache does for one row: `cached` tokens read from `pages`, tokens
// [cached, written) written by the run into `pages` too; `tier`: "device" (a hit), "host"
// (a hit copied back from the host tier), "miss" (computed and kept), "uncached" (no room),
// "none" (nothing to cache).
struct RowPlan {
  int64_t cached = 0;
  int64_t written = 0;
  std::vector<int32_t> pages;
  std::string tier = "none";
};

struct CacheEntry;
struct HostEntry;

// One batch's plans; Finish runs its commits (the run succeeded) or its rollbacks.
struct Reservation {
  std::vector<RowPlan> plans;
  std::vector<std::function<void()>> commits, rollbacks;
  std::vector<std::shared_ptr<CacheEntry>> readers;
  bool finished = false;
  bool hit = false;  // some row read cached tokens
  int runs = 1;      // sub-batches the package ran the rows as
};

// Wall seconds since `started`: the cache's timers (calls, spills, restores).
inline double SecondsSince(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

// Counters since the cache was made, and what it holds now.
struct CacheStats {
  // `hits` counts both tiers; `host_hits` those copied back from the host tier.
  int64_t lookups = 0, hits = 0, host_hits = 0, partial_hits = 0, misses = 0, uncached = 0;
  int64_t evictions = 0, host_evictions = 0;
  int64_t tokens_reused = 0, tokens_written = 0;
  int64_t entries = 0, bytes = 0, capacity_bytes = 0;
  int64_t host_entries = 0, host_bytes = 0, host_capacity_bytes = 0;
  // Calls of batches with a hit, by wall time: counts at or below each bound (seconds), the
  // count and the sum; what a latency histogram needs.
  std::vector<double> hit_bounds;
  std::vector<int64_t> hit_buckets;
  int64_t hit_calls = 0;
  double hit_seconds = 0;
  // Batches run as two sub-batches (SuffixGroups in cache_binding.h).
  int64_t split_batches = 0;
  // Every kept call's wall time (hits and misses alike), and the time a request's path spent
  // on spilling evicted entries to the host tier (`spills` of them: starting their copies,
  // and waiting for those whose pages it needed) and copying host entries back
  // (`host_hits`), both before its run.
  int64_t calls = 0;
  double call_seconds = 0;
  int64_t spills = 0;
  double spill_seconds = 0, restore_seconds = 0;
};

class PromptCache {
 public:
  // A pool of `budget_bytes` (whole pages, at least one, plus the sink page) of `spec`'s
  // geometry on `device`, and a host tier of `host_budget_bytes` (0: none).
  PromptCache(const CacheSpec& spec, int64_t budget_bytes, c10::Device device,
              int64_t host_budget_bytes = 0);
  ~PromptCache();  // the host pages' chunks back to the arena
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // The pages (the sink aside) a pool of `budget_bytes` of `spec`'s geometry holds.
  static int64_t PoolPages(const CacheSpec& spec, int64_t budget_bytes);
  // Bytes of one page of `spec`'s geometry (every layer's keys and values).
  static int64_t PageBytes(const CacheSpec& spec);

  // [layers, 2, pages + 1, page_tokens, Hkv, D]; page 0 is the sink (rows not kept write
  // there).
  const at::Tensor& pool() const { return pool_; }
  int64_t page_tokens() const { return page_tokens_; }

  // Plans every row (see RowPlan); the reservation must be finished.
  std::unique_ptr<Reservation> Reserve(const std::vector<CacheRow>& rows);
  // Publishes what the batch wrote (`keep`) or gives it back; unpins what it read; records a
  // hit batch's wall time. Idempotent.
  void Finish(Reservation* reservation, bool keep, double seconds);
  CacheStats Stats() const;

  // The run's tables, `rows` of them (rows past the batch's read nothing and write the sink):
  // cached tokens [rows] int64, pages [rows, pages] int32, and the flat pool slot (of one
  // layer's keys) of each of `suffix` suffix slots [rows, suffix] int64.
  static at::Tensor CachedLengths(const Reservation& r, int64_t rows);
  static at::Tensor BlockTable(const Reservation& r, int64_t rows, int64_t pages);
  at::Tensor WriteSlots(const Reservation& r, int64_t rows, int64_t suffix) const;

 private:
  RowPlan Plan(const CacheRow& row, Reservation* res);
  RowPlan Read(const std::shared_ptr<CacheEntry>& entry, int64_t length, Reservation* res);
  RowPlan Extend(const std::shared_ptr<CacheEntry>& entry, int64_t length, int64_t frozen,
                 const std::vector<int64_t>& bounds, const std::vector<std::string>& digests,
                 Reservation* res, const std::string& tier);
  void Register(const std::shared_ptr<CacheEntry>& entry, const std::vector<int64_t>& bounds,
                const std::vector<std::string>& digests);
  bool Take(int64_t count, const std::vector<CacheEntry*>& keep, std::vector<int32_t>* pages);
  // The least recently used entry nobody reads or writes, not in `keep` (null: none).
  std::shared_ptr<CacheEntry> Victim(const std::vector<CacheEntry*>& keep) const;
  // With a host tier: evicts until the largest entry's pages so far are free or being spilled.
  void EvictAhead();
  // Spilled pages whose copies are done back to the free list; `wait`: the oldest first
  // waited for (its time counted as a spill's).
  void Reap(bool wait = false);
  int64_t InFlightPages() const;
  void Drop(const std::shared_ptr<CacheEntry>& entry, bool evicted);
  void Release(const std::vector<int32_t>& pages);
  void Share(const std::vector<int32_t>& pages);
  void Touch(const std::shared_ptr<CacheEntry>& entry);
  void Count(const RowPlan& plan, int64_t frozen);
  // The host tier: an evicted entry's tokens kept under `names` (digest, length); the
  // longest of `digests` (beyond `longer_than` tokens) brought back into the pool as an
  // entry, `keep` never evicted for its room (null: none there, or no room).
  void Spill(const std::shared_ptr<CacheEntry>& entry,
             const std::vector<std::pair<std::string, int64_t>>& names);  // started only
  std::shared_ptr<CacheEntry> Restore(const std::vector<std::string>& digests,
                                      int64_t longer_than, CacheEntry* keep, int64_t* length);
  void DropHost(std::shared_ptr<HostEntry> entry);  // by value: it may be the list's own
  // Host pages for `count` pages (slot ids), taking chunks from the arena and dropping the
  // least recently spilled entries for room; false (nothing taken) when the tier cannot
  // hold them.
  bool TakeHost(int64_t count, std::vector<int64_t>* slots);
  // Copies between the host pages `slots` and the rows of `device` ([slots, layers, 2,
  // page_tokens, Hkv, D]), each run of consecutive slots of one chunk in one copy; to the
  // host without waiting (on the current stream).
  void CopyHost(const std::vector<int64_t>& slots, const at::Tensor& device, bool to_host);
  bool HasHostTier() const { return pages_per_chunk_ > 0; }
  int64_t PagesFor(int64_t tokens) const { return (tokens + page_tokens_ - 1) / page_tokens_; }

  CacheSpec spec_;
  int64_t page_tokens_;
  int64_t page_bytes_;
  int64_t pages_;
  at::Tensor pool_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;  // free pages, the next to take last
  // Pages released while a spill's copy may still read them, by the newest copy's ticket then
  // (copies finish in ticket order); free once it is done.
  std::unique_ptr<CopyStream> copies_;  // with a host tier
  std::deque<std::pair<int64_t, std::vector<int32_t>>> in_flight_;
  int64_t last_ticket_ = 0;  // the newest copy started (0: none)
  int64_t ahead_pages_ = 0;  // the most pages one entry has taken: what EvictAhead keeps
  std::vector<int32_t> refs_;  // holders of each page
  // Entries, least recently used first; the index maps a digest to its entry and length.
  std::list<std::shared_ptr<CacheEntry>> entries_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<CacheEntry>, int64_t>> index_;
  // The host tier, least recently spilled first, and its index; its pages live in the
  // chunks taken from `arena_` (views [pages_per_chunk_, layers, 2, page_tokens, Hkv, D]).
  int64_t host_bytes_ = 0;
  std::shared_ptr<HostArena> arena_;
  std::vector<at::Tensor> chunks_, chunk_pages_;
  int64_t pages_per_chunk_ = 0;
  std::vector<int64_t> host_free_;  // free host slots (chunk * pages_per_chunk_ + page)
  std::list<std::shared_ptr<HostEntry>> host_entries_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<HostEntry>, int64_t>> host_index_;
  CacheStats counts_;
};

// The frozen part's safe boundaries (ascending, ending at `frozen`): its segment starts, where
// the KV before does not depend on the tokens after.
std::vector<int64_t> SafeBoundaries(const std::vector<int64_t>& segments, int64_t frozen);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_PROMPT_CACHE_H_
