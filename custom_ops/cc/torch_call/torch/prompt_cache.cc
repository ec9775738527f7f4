// The prompt-KV cache of a served package (see prompt_cache.h).
#include "custom_ops/cc/torch_call/torch/prompt_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "custom_ops/cc/torch_call/torch/blake2b.h"
#include "custom_ops/cc/torch_call/torch/scalar_types.h"

namespace xgr {
namespace torch_call {

constexpr size_t kDigestBytes = 16;
constexpr int32_t kSink = 0;

struct CacheEntry {
  std::vector<int32_t> pages;
  int64_t length = 0;
  std::vector<std::string> registered;  // digests that name this entry in the index
  int readers = 0;
  bool writer = false;
  bool listed = false;  // in entries_ (published)
};

// An entry the pool evicted, kept by the host tier: its tokens' keys and values.
struct HostEntry {
  std::vector<int64_t> slots;  // its host pages, in order
  int64_t length = 0;
  int64_t bytes = 0;
  std::vector<std::pair<std::string, int64_t>> names;  // digest, tokens it covers
  int64_t ticket = 0;  // the copy that fills its pages (done before they are read)
};

namespace {

// The running hash of one row: the package's scope and the user key, then one 16-byte
// record per token (its id, and its segment id relative to the part's first), so the
// digest of a prefix of n tokens covers exactly its first n records.
Blake2b RootOf(const std::string& scope, const std::string& key) {
  Blake2b h(kDigestBytes);
  for (const std::string* part : {&scope, &key}) {
    const uint32_t size = static_cast<uint32_t>(part->size());
    uint8_t prefix[4] = {static_cast<uint8_t>(size), static_cast<uint8_t>(size >> 8),
                         static_cast<uint8_t>(size >> 16), static_cast<uint8_t>(size >> 24)};
    h.Update(prefix, sizeof(prefix));
    h.Update(part->data(), part->size());
  }
  return h;
}

void HashRecords(Blake2b* h, const CacheRow& row, int64_t from, int64_t to) {
  uint8_t record[16];
  for (int64_t i = from; i < to; ++i) {
    const int64_t values[2] = {row.tokens[i], row.segments[i] - row.segments[0]};
    for (int v = 0; v < 2; ++v) {
      for (int b = 0; b < 8; ++b) record[8 * v + b] = static_cast<uint8_t>(values[v] >> (8 * b));
    }
    h->Update(record, sizeof(record));
  }
}

const std::vector<double> kHitBounds = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
                                        1.0};

}  // namespace

std::vector<int64_t> SafeBoundaries(const std::vector<int64_t>& segments, int64_t frozen) {
  std::vector<int64_t> bounds;
  for (int64_t i = 1; i < frozen; ++i) {
    if (segments[i] != segments[i - 1]) bounds.push_back(i);
  }
  if (frozen > 0) bounds.push_back(frozen);
  return bounds;
}

PromptCache::PromptCache(const CacheSpec& spec, int64_t budget_bytes, c10::Device device,
                         int64_t host_budget_bytes)
    : spec_(spec), page_tokens_(spec.page_tokens) {
  page_bytes_ = PageBytes(spec);
  pages_ = PoolPages(spec, budget_bytes);
  pool_ = at::zeros({spec.layers, 2, pages_ + 1, page_tokens_, spec.kv_heads, spec.head_dim},
                    at::TensorOptions().dtype(ToScalarType(spec.dtype)).device(device));
  for (int64_t p = pages_; p >= 1; --p) free_.push_back(static_cast<int32_t>(p));
  refs_.assign(pages_ + 1, 0);
  counts_.capacity_bytes = pages_ * page_bytes_;
  arena_ = SharedHostArena(host_budget_bytes, pool_.is_cuda());
  if (arena_ != nullptr) pages_per_chunk_ = arena_->chunk_bytes() / page_bytes_;
  if (pages_per_chunk_ == 0) arena_ = nullptr;  // a budget under one page keeps no tier
  if (arena_ != nullptr) copies_ = MakeCopyStream(pool_.device());
  counts_.host_capacity_bytes = arena_ == nullptr ? 0 :
      arena_->chunks() * pages_per_chunk_ * page_bytes_;
  counts_.hit_bounds = kHitBounds;
  counts_.hit_buckets.assign(kHitBounds.size(), 0);
}

PromptCache::~PromptCache() {
  copies_.reset();  // its copies done before their host pages go back
  for (const at::Tensor& chunk : chunks_) arena_->Give(chunk);
}

int64_t PromptCache::PageBytes(const CacheSpec& spec) {
  return spec.layers * 2 * spec.kv_heads * spec.head_dim * spec.page_tokens *
         ElementSize(spec.dtype);
}

int64_t PromptCache::PoolPages(const CacheSpec& spec, int64_t budget_bytes) {
  // At least one page, so the pool keeps the shape a traced program was exported with
  // (the sink and a page); a budget under a page holds that one page.
  const int64_t page_bytes = PageBytes(spec);
  return std::max<int64_t>(
      page_bytes > 0 ? std::max<int64_t>(budget_bytes, 0) / page_bytes : 0, 1);
}

std::unique_ptr<Reservation> PromptCache::Reserve(const std::vector<CacheRow>& rows) {
  auto res = std::make_unique<Reservation>();
  std::lock_guard<std::mutex> lock(mu_);
  for (const CacheRow& row : rows) {
    res->plans.push_back(Plan(row, res.get()));
    res->hit = res->hit || res->plans.back().cached > 0;
  }
  EvictAhead();  // its spills' copies run beside this batch
  return res;
}

void PromptCache::Finish(Reservation* res, bool keep, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (res->finished) return;
  res->finished = true;
  for (auto& action : keep ? res->commits : res->rollbacks) action();
  for (auto& entry : res->readers) entry->readers -= 1;
  res->readers.clear();
  if (keep && res->runs > 1) counts_.split_batches += 1;
  if (keep) {
    counts_.calls += 1;
    counts_.call_seconds += seconds;
  }
  if (keep && res->hit) {
    counts_.hit_calls += 1;
    counts_.hit_seconds += seconds;
    for (size_t i = 0; i < counts_.hit_bounds.size(); ++i) {
      if (seconds <= counts_.hit_bounds[i]) counts_.hit_buckets[i] += 1;
    }
  }
}

CacheStats PromptCache::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheStats stats = counts_;
  stats.entries = static_cast<int64_t>(entries_.size());
  // Pages on their way out (a spill's copy still reading them) belong to no entry.
  stats.bytes = (pages_ - static_cast<int64_t>(free_.size()) - InFlightPages()) * page_bytes_;
  stats.host_entries = static_cast<int64_t>(host_entries_.size());
  stats.host_bytes = host_bytes_;
  return stats;
}

RowPlan PromptCache::Plan(const CacheRow& row, Reservation* res) {
  const int64_t frozen = row.frozen;
  if (frozen <= 0 || row.key.empty()) return RowPlan{};
  Blake2b root = RootOf(spec_.scope, row.key);
  // A returning user's frozen part is usually cached whole: one digest finds it.
  Blake2b whole = root;
  HashRecords(&whole, row, 0, frozen);
  auto found = index_.find(whole.Digest());
  RowPlan plan;
  if (found != index_.end() && found->second.second == frozen) {
    Touch(found->second.first);
    plan = Read(found->second.first, frozen, res);
  } else {
    const std::vector<int64_t> bounds = SafeBoundaries(row.segments, frozen);
    std::vector<std::string> digests;
    Blake2b running = root;
    int64_t start = 0;
    for (int64_t end : bounds) {
      HashRecords(&running, row, start, end);
      digests.push_back(running.Digest());
      start = end;
    }
    std::shared_ptr<CacheEntry> entry;
    int64_t length = 0;
    for (size_t i = digests.size(); i-- > 0;) {
      auto hit = index_.find(digests[i]);
      if (hit != index_.end()) {
        entry = hit->second.first;
        length = hit->second.second;
        break;
      }
    }
    std::string tier = "device";
    if (HasHostTier()) {
      int64_t restored_length = 0;
      auto restored = Restore(digests, length, entry.get(), &restored_length);
      if (restored) {
        entry = restored;
        length = restored_length;
        tier = "host";
      }
    }
    if (!entry) {
      plan = Extend(nullptr, 0, frozen, bounds, digests, res, "miss");
    } else {
      Touch(entry);
      if (length == frozen) {
        plan = Read(entry, length, res);
        plan.tier = tier;
      } else {
        plan = Extend(entry, length, frozen, bounds, digests, res, tier);
      }
    }
  }
  Count(plan, frozen);
  return plan;
}

void PromptCache::Count(const RowPlan& plan, int64_t frozen) {
  counts_.lookups += 1;
  if (plan.tier == "device" || plan.tier == "host") {
    counts_.hits += 1;
    counts_.host_hits += plan.tier == "host";
    counts_.partial_hits += plan.cached < frozen;
  } else if (plan.tier == "miss") {
    counts_.misses += 1;
  } else {
    counts_.uncached += 1;
  }
  counts_.tokens_reused += plan.cached;
}

RowPlan PromptCache::Read(const std::shared_ptr<CacheEntry>& entry, int64_t length,
                          Reservation* res) {
  entry->readers += 1;
  res->readers.push_back(entry);
  RowPlan plan;
  plan.cached = plan.written = length;
  plan.pages.assign(entry->pages.begin(), entry->pages.begin() + PagesFor(length));
  plan.tier = "device";
  return plan;
}

RowPlan PromptCache::Extend(const std::shared_ptr<CacheEntry>& entry, int64_t length,
                            int64_t frozen, const std::vector<int64_t>& bounds,
                            const std::vector<std::string>& digests, Reservation* res,
                            const std::string& tier) {
  const int64_t need = PagesFor(frozen);
  std::vector<CacheEntry*> keep;
  if (entry) keep.push_back(entry.get());
  if (entry && entry->length == length && !entry->writer) {
    // In place: the entry ends where this part's new tokens start and nobody else writes it.
    std::vector<int32_t> fresh;
    if (!Take(need - static_cast<int64_t>(entry->pages.size()), keep, &fresh)) {
      return Read(entry, length, res);
    }
    entry->pages.insert(entry->pages.end(), fresh.begin(), fresh.end());
    entry->writer = true;
    entry->readers += 1;
    res->readers.push_back(entry);
    res->commits.push_back([this, entry, frozen, length, bounds, digests] {
      entry->length = frozen;
      entry->writer = false;
      Register(entry, bounds, digests);
      counts_.tokens_written += frozen - length;
    });
    res->rollbacks.push_back([this, entry, fresh] {
      entry->writer = false;
      entry->pages.resize(entry->pages.size() - fresh.size());
      Release(fresh);
    });
    RowPlan plan{length, frozen, {}, tier};
    plan.pages.assign(entry->pages.begin(), entry->pages.begin() + need);
    return plan;
  }
  // A new entry, sharing the whole pages of the one it continues.
  const int64_t whole = entry ? length / page_tokens_ : 0;
  std::vector<int32_t> fresh;
  if (!Take(need - whole, keep, &fresh)) {
    if (entry) return Extend(nullptr, 0, frozen, bounds, digests, res, "miss");
    RowPlan plan;
    plan.tier = "uncached";
    return plan;
  }
  auto made = std::make_shared<CacheEntry>();
  if (entry) made->pages.assign(entry->pages.begin(), entry->pages.begin() + whole);
  Share(made->pages);
  const int64_t head = length - whole * page_tokens_;
  if (head > 0) {
    // The partial page's tokens, copied before the run reads them (on the run's device and
    // finished before it starts: the run goes on another stream).
    pool_.select(2, fresh[0]).narrow(2, 0, head).copy_(
        pool_.select(2, entry->pages[whole]).narrow(2, 0, head));
    SynchronizeCurrentStream(pool_.device());
  }
  made->pages.insert(made->pages.end(), fresh.begin(), fresh.end());
  made->length = length;
  res->commits.push_back([this, made, frozen, length, bounds, digests] {
    made->length = frozen;
    Register(made, bounds, digests);
    if (!made->registered.empty()) {
      made->listed = true;
      entries_.push_back(made);
      counts_.tokens_written += frozen - length;
    } else {
      Release(made->pages);  // another request kept the same part first
    }
  });
  res->rollbacks.push_back([this, made] { Release(made->pages); });
  RowPlan plan{length, frozen, made->pages, tier};
  return plan;
}

void PromptCache::Register(const std::shared_ptr<CacheEntry>& entry,
                           const std::vector<int64_t>& bounds,
                           const std::vector<std::string>& digests) {
  for (size_t i = 0; i < bounds.size() && i < digests.size(); ++i) {
    if (bounds[i] <= entry->length && index_.find(digests[i]) == index_.end()) {
      index_.emplace(digests[i], std::make_pair(entry, bounds[i]));
      entry->registered.push_back(digests[i]);
    }
  }
}

void PromptCache::Touch(const std::shared_ptr<CacheEntry>& entry) {
  if (!entry->listed) return;
  auto it = std::find(entries_.begin(), entries_.end(), entry);
  if (it != entries_.end()) entries_.splice(entries_.end(), entries_, it);
}

bool PromptCache::Take(int64_t count, const std::vector<CacheEntry*>& keep,
                       std::vector<int32_t>* pages) {
  pages->clear();
  if (count <= 0) return true;
  ahead_pages_ = std::max(ahead_pages_, count);
  Reap();
  while (static_cast<int64_t>(free_.size()) < count) {
    if (!in_flight_.empty()) {  // made room already: wait for it rather than evict more
      Reap(/*wait=*/true);
      continue;
    }
    std::shared_ptr<CacheEntry> victim = Victim(keep);
    if (!victim) return false;
    Drop(victim, /*evicted=*/true);
  }
  for (int64_t i = 0; i < count; ++i) {
    const int32_t page = free_.back();
    free_.pop_back();
    refs_[page] = 1;
    pages->push_back(page);
  }
  return true;
}

std::shared_ptr<CacheEntry> PromptCache::Victim(const std::vector<CacheEntry*>& keep) const {
  for (const auto& e : entries_) {
    if (e->readers == 0 && !e->writer &&
        std::find(keep.begin(), keep.end(), e.get()) == keep.end()) {
      return e;
    }
  }
  return nullptr;
}

void PromptCache::EvictAhead() {
  if (!HasHostTier()) return;  // an eviction without a tier costs nothing on the path
  Reap();
  while (static_cast<int64_t>(free_.size()) + InFlightPages() < ahead_pages_) {
    std::shared_ptr<CacheEntry> victim = Victim({});
    if (!victim) return;
    Drop(victim, /*evicted=*/true);
  }
}

void PromptCache::Reap(bool wait) {
  if (wait && !in_flight_.empty()) {
    const auto started = std::chrono::steady_clock::now();
    copies_->Wait(in_flight_.front().first);
    counts_.spill_seconds += SecondsSince(started);
  }
  while (!in_flight_.empty() && copies_->Done(in_flight_.front().first)) {
    const std::vector<int32_t>& pages = in_flight_.front().second;
    free_.insert(free_.end(), pages.rbegin(), pages.rend());
    in_flight_.pop_front();
  }
}

int64_t PromptCache::InFlightPages() const {
  int64_t pages = 0;
  for (const auto& flight : in_flight_) pages += static_cast<int64_t>(flight.second.size());
  return pages;
}

void PromptCache::Drop(const std::shared_ptr<CacheEntry>& entry, bool evicted) {
  if (evicted) counts_.evictions += 1;
  std::vector<std::pair<std::string, int64_t>> names;
  for (const std::string& digest : entry->registered) {
    auto it = index_.find(digest);
    if (it != index_.end() && it->second.first == entry) {
      names.emplace_back(digest, it->second.second);
      index_.erase(it);
    }
  }
  entry->registered.clear();
  entries_.remove(entry);
  entry->listed = false;
  // Copied out while its pages still hold it (an evicted entry has no reader or writer).
  if (evicted && HasHostTier()) Spill(entry, names);
  Release(entry->pages);
}

void PromptCache::Spill(const std::shared_ptr<CacheEntry>& entry,
                        const std::vector<std::pair<std::string, int64_t>>& names) {
  const int64_t tokens = entry->length;
  if (names.empty() || tokens <= 0) return;
  const auto started = std::chrono::steady_clock::now();
  const int64_t count = PagesFor(tokens);
  auto host = std::make_shared<HostEntry>();
  if (!TakeHost(count, &host->slots)) return;  // the tier cannot hold it: evicted for good
  std::vector<int64_t> pages(entry->pages.begin(), entry->pages.begin() + count);
  at::Tensor listed = at::tensor(pages, at::kLong);
  if (pool_.is_cuda()) listed = listed.pin_memory();  // copied on without waiting
  // On the copy stream: the pages go back to the free list (Release) once it is done.
  host->ticket = last_ticket_ = copies_->Launch([&] {
    const at::Tensor index = listed.to(pool_.device(), /*non_blocking=*/true);
    // Page-major, as the host pages are: one contiguous block per page.
    const at::Tensor gathered =
        pool_.index_select(2, index).permute({2, 0, 1, 3, 4, 5}).contiguous();
    CopyHost(host->slots, gathered, /*to_host=*/true);
    return std::vector<at::Tensor>{listed, index, gathered};
  });
  host->length = tokens;
  host->bytes = count * page_bytes_;
  host->names = names;
  host_entries_.push_back(host);
  host_bytes_ += host->bytes;
  for (const auto& name : host->names) host_index_[name.first] = {host, name.second};
  counts_.spills += 1;
  counts_.spill_seconds += SecondsSince(started);
}

bool PromptCache::TakeHost(int64_t count, std::vector<int64_t>* slots) {
  // What the tier could free for it: nothing is dropped for an entry that would not fit.
  const int64_t reachable = static_cast<int64_t>(host_free_.size()) + host_bytes_ / page_bytes_ +
                            arena_->FreeChunks() * pages_per_chunk_;
  if (count > reachable) return false;
  while (static_cast<int64_t>(host_free_.size()) < count) {
    at::Tensor chunk = arena_->Take();
    if (chunk.defined()) {
      const int64_t first = static_cast<int64_t>(chunks_.size()) * pages_per_chunk_;
      chunks_.push_back(chunk);
      chunk_pages_.push_back(
          chunk.narrow(0, 0, pages_per_chunk_ * page_bytes_)
              .view(pool_.scalar_type())
              .view({pages_per_chunk_, spec_.layers, 2, page_tokens_, spec_.kv_heads,
                     spec_.head_dim}));
      for (int64_t i = pages_per_chunk_; i-- > 0;) host_free_.push_back(first + i);
      continue;
    }
    if (host_entries_.empty()) return false;  // the arena's chunks are another cache's
    DropHost(host_entries_.front());
    counts_.host_evictions += 1;
  }
  for (int64_t i = 0; i < count; ++i) {
    slots->push_back(host_free_.back());
    host_free_.pop_back();
  }
  return true;
}

void PromptCache::CopyHost(const std::vector<int64_t>& slots, const at::Tensor& device,
                           bool to_host) {
  const int64_t n = static_cast<int64_t>(slots.size());
  for (int64_t start = 0; start < n;) {
    const int64_t chunk = slots[start] / pages_per_chunk_;
    const int64_t first = slots[start] % pages_per_chunk_;
    int64_t run = 1;
    while (start + run < n && slots[start + run] == slots[start] + run &&
           first + run < pages_per_chunk_) {
      ++run;
    }
    at::Tensor host = chunk_pages_[chunk].narrow(0, first, run);
    at::Tensor there = device.narrow(0, start, run);
    if (to_host) {
      host.copy_(there, /*non_blocking=*/true);
    } else {
      there.copy_(host);
    }
    start += run;
  }
}

std::shared_ptr<CacheEntry> PromptCache::Restore(const std::vector<std::string>& digests,
                                                 int64_t longer_than, CacheEntry* keep,
                                                 int64_t* length) {
  for (size_t i = digests.size(); i-- > 0;) {
    auto it = host_index_.find(digests[i]);
    if (it == host_index_.end()) continue;
    if (it->second.second <= longer_than) return nullptr;  // the pool has as much
    const std::shared_ptr<HostEntry> host = it->second.first;
    const int64_t matched = it->second.second;
    const int64_t need = static_cast<int64_t>(host->slots.size());
    const auto started = std::chrono::steady_clock::now();
    copies_->Wait(host->ticket);  // its pages filled
    // Onto the device first (a copy done when it returns): the evictions that make room
    // below spill into the host pages this entry leaves.
    at::Tensor staged = at::empty({need, spec_.layers, 2, page_tokens_, spec_.kv_heads,
                                   spec_.head_dim}, pool_.options());
    CopyHost(host->slots, staged, /*to_host=*/false);
    double seconds = SecondsSince(started);
    DropHost(host);
    std::vector<int32_t> pages;
    std::vector<CacheEntry*> kept;
    if (keep != nullptr) kept.push_back(keep);
    if (!Take(need, kept, &pages)) return nullptr;  // no room: the row computes it again
    const auto placed = std::chrono::steady_clock::now();  // the spills Take made count apart
    std::vector<int64_t> targets(pages.begin(), pages.end());
    pool_.index_copy_(2, at::tensor(targets, at::kLong).to(pool_.device()),
                      staged.permute({1, 2, 0, 3, 4, 5}));
    // Finished before the run reads it (the run goes on another stream).
    SynchronizeCurrentStream(pool_.device());
    counts_.restore_seconds += seconds + SecondsSince(placed);
    auto made = std::make_shared<CacheEntry>();
    made->pages = pages;
    made->length = host->length;
    made->listed = true;
    entries_.push_back(made);
    for (const auto& name : host->names) {
      if (index_.find(name.first) == index_.end()) {
        index_.emplace(name.first, std::make_pair(made, name.second));
        made->registered.push_back(name.first);
      }
    }
    *length = matched;
    return made;
  }
  return nullptr;
}

void PromptCache::DropHost(std::shared_ptr<HostEntry> host) {
  for (const auto& name : host->names) {
    auto it = host_index_.find(name.first);
    if (it != host_index_.end() && it->second.first == host) host_index_.erase(it);
  }
  host_entries_.remove(host);
  host_bytes_ -= host->bytes;
  host_free_.insert(host_free_.end(), host->slots.rbegin(), host->slots.rend());
  host->slots.clear();
}

void PromptCache::Share(const std::vector<int32_t>& pages) {
  for (int32_t page : pages) refs_[page] += 1;
}

void PromptCache::Release(const std::vector<int32_t>& pages) {
  std::vector<int32_t> freed;
  for (int32_t page : pages) {
    if (refs_[page] > 0 && --refs_[page] == 0) freed.push_back(page);
  }
  if (freed.empty()) return;
  if (last_ticket_ > 0 && !copies_->Done(last_ticket_)) {  // a copy may still read them
    in_flight_.emplace_back(last_ticket_, std::move(freed));
    return;
  }
  free_.insert(free_.end(), freed.begin(), freed.end());
}

at::Tensor PromptCache::CachedLengths(const Reservation& r, int64_t rows) {
  at::Tensor out = at::zeros({rows}, at::kLong);
  auto* data = out.data_ptr<int64_t>();
  for (size_t i = 0; i < r.plans.size() && static_cast<int64_t>(i) < rows; ++i) {
    data[i] = r.plans[i].cached;
  }
  return out;
}

at::Tensor PromptCache::BlockTable(const Reservation& r, int64_t rows, int64_t pages) {
  at::Tensor out = at::full({rows, pages}, kSink, at::kInt);
  auto* data = out.data_ptr<int32_t>();
  for (size_t i = 0; i < r.plans.size() && static_cast<int64_t>(i) < rows; ++i) {
    const auto& own = r.plans[i].pages;
    for (size_t p = 0; p < own.size() && static_cast<int64_t>(p) < pages; ++p) {
      data[i * pages + p] = own[p];
    }
  }
  return out;
}

at::Tensor PromptCache::WriteSlots(const Reservation& r, int64_t rows, int64_t suffix) const {
  at::Tensor out = at::full({rows, suffix}, int64_t{kSink} * page_tokens_, at::kLong);
  auto* data = out.data_ptr<int64_t>();
  for (size_t i = 0; i < r.plans.size() && static_cast<int64_t>(i) < rows; ++i) {
    const RowPlan& plan = r.plans[i];
    for (int64_t pos = plan.cached; pos < plan.written && pos - plan.cached < suffix; ++pos) {
      data[i * suffix + (pos - plan.cached)] =
          int64_t{plan.pages[pos / page_tokens_]} * page_tokens_ + pos % page_tokens_;
    }
  }
  return out;
}

}  // namespace torch_call
}  // namespace xgr
