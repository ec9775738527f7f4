// The prompt cache's side of a package run (see cache_binding.h).
#include "custom_ops/cc/torch_call/torch/cache_binding.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "custom_ops/cc/torch_call/torch/scalar_types.h"

namespace xgr {
namespace torch_call {
namespace {

Status Invalid(const std::string& message) { return {Code::kInvalidArgument, message}; }

// `size` within the range the contract gives `symbol` (a trace may bound a dimension from
// below, e.g. at 2: the runtime pads its own inputs up to it).
int64_t WithinRange(const Signature& sig, const std::string& symbol, int64_t size) {
  auto range = sig.ranges.find(symbol);
  if (range == sig.ranges.end()) return size;
  return std::min(std::max(size, range->second.first), range->second.second);
}

// `size` of the prompts' dimension `dim` rounded as the contract buckets it.
int64_t Bucketed(const Signature& sig, size_t dim, int64_t size) {
  int64_t out = size;
  for (const BucketRule& rule : sig.buckets) {
    if (rule.input == sig.cache.tokens && rule.dim == dim) out = rule.Padded(size);
  }
  return out;
}

// The suffix width of a cached run: the longest suffix, rounded as the prompt's length is
// bucketed (so a bucket's runs share few shapes), within the padded prompt.
int64_t SuffixWidth(const Signature& sig, const Reservation& r,
                    const std::vector<CacheRow>& rows, int64_t padded_length) {
  int64_t longest = 1;
  for (size_t b = 0; b < rows.size(); ++b) {
    longest = std::max(longest, rows[b].length - r.plans[b].cached);
  }
  int64_t width = Bucketed(sig, 1, longest);
  width = std::max(longest, std::min(width, padded_length));
  return WithinRange(sig, sig.cache_inputs[2].dims[1], width);
}

// The rows `index` (int64, on the host) of a call's batch-major inputs, the other inputs as
// they are: views of the copies `owned` keeps.
std::vector<InputView> InputRows(const Signature& sig, const std::vector<InputView>& inputs,
                                 const at::Tensor& index, std::vector<at::Tensor>* owned) {
  const std::string& batch = sig.inputs[sig.cache.tokens].dims[0];
  std::vector<InputView> part(inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (sig.inputs[i].dims.empty() || sig.inputs[i].dims[0] != batch) continue;
    const auto options = at::TensorOptions().dtype(ToScalarType(inputs[i].dtype));
    owned->push_back(at::from_blob(const_cast<void*>(inputs[i].data), inputs[i].shape, options)
                         .index_select(0, index)
                         .contiguous());
    part[i].data = owned->back().data_ptr();
    part[i].shape = owned->back().sizes().vec();
  }
  return part;
}

}  // namespace

std::vector<std::vector<int64_t>> SuffixGroups(const Signature& sig, const Reservation& r,
                                               const std::vector<CacheRow>& rows,
                                               int64_t split_tokens) {
  const int64_t batch = static_cast<int64_t>(rows.size());
  std::vector<int64_t> order(batch);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> suffix(batch);
  for (int64_t b = 0; b < batch; ++b) {
    suffix[b] = std::max<int64_t>(rows[b].length - r.plans[b].cached, 1);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return suffix[a] < suffix[b]; });
  // The prefill's work of a run: its padded rows times its suffix width, in tokens.
  auto work = [&](int64_t from, int64_t to) {
    return Bucketed(sig, 0, to - from) * Bucketed(sig, 1, suffix[order[to - 1]]);
  };
  int64_t best = work(0, batch), cut = 0;
  for (int64_t k = 1; k < batch; ++k) {
    const int64_t split = work(0, k) + work(k, batch) + split_tokens;
    if (split < best) best = split, cut = k;
  }
  if (cut == 0) {
    std::vector<int64_t> all(batch);
    std::iota(all.begin(), all.end(), 0);
    return {all};
  }
  std::vector<std::vector<int64_t>> groups;
  groups.emplace_back(order.begin(), order.begin() + cut);
  groups.emplace_back(order.begin() + cut, order.end());
  for (auto& group : groups) std::sort(group.begin(), group.end());
  return groups;
}

bool BatchMajorOutputs(const Signature& sig) {
  const std::string& batch = sig.inputs[sig.cache.tokens].dims[0];
  return std::all_of(sig.outputs.begin(), sig.outputs.end(), [&](const TensorSpec& spec) {
    return !spec.dims.empty() && spec.dims[0] == batch;
  });
}

std::vector<at::Tensor> RunInGroups(const Signature& sig, const std::vector<InputView>& inputs,
                                    const std::vector<CacheRow>& rows, const Reservation& r,
                                    const std::vector<std::vector<int64_t>>& groups,
                                    const GroupRunner& run) {
  const int64_t total = static_cast<int64_t>(rows.size());
  std::vector<at::Tensor> merged;
  for (const std::vector<int64_t>& group : groups) {
    const at::Tensor index = at::tensor(group, at::kLong);
    std::vector<at::Tensor> owned;
    const std::vector<InputView> part = InputRows(sig, inputs, index, &owned);
    std::vector<CacheRow> part_rows;
    Reservation plans;
    for (int64_t b : group) {
      part_rows.push_back(rows[b]);
      plans.plans.push_back(r.plans[b]);
    }
    std::vector<at::Tensor> results = run(part, part_rows, plans);
    if (merged.empty()) {
      for (const at::Tensor& t : results) {
        std::vector<int64_t> shape = t.sizes().vec();
        shape[0] = total;
        merged.push_back(at::empty(shape, t.options()));
      }
    }
    for (size_t i = 0; i < results.size(); ++i) {
      merged[i].index_copy_(0, index.to(results[i].device()), results[i]);
    }
  }
  return merged;
}

namespace {

// A count (bytes, tokens) from the environment variable `name`; `fallback` (said as
// `otherwise`) when it is unset or not a non-negative integer.
int64_t CountFromEnv(const char* name, int64_t fallback, const char* otherwise) {
  const char* env = std::getenv(name);
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long long value = std::strtoll(env, &end, 10);
    if (end != nullptr && *end == '\0' && value >= 0) return value;
    std::fprintf(stderr, "TorchCall: %s='%s' is not a non-negative integer; %s\n", name, env,
                 otherwise);
  }
  return fallback;
}

}  // namespace

int64_t CacheBudget() {
  return CountFromEnv("XGR_PROMPT_CACHE_BYTES", int64_t{256} << 20, "using the default");
}

int64_t HostCacheBudget() {
  return CountFromEnv("XGR_PROMPT_CACHE_HOST_BYTES", 0, "keeping no host tier");
}

int64_t SplitRunTokens() {
  return CountFromEnv("XGR_PROMPT_CACHE_SPLIT_TOKENS", kSplitRunTokens, "using the default");
}

std::string CacheStatsJson(const CacheStats& st) {
  std::string buckets;
  for (size_t i = 0; i < st.hit_bounds.size(); ++i) {
    buckets += (i ? ", " : "") + std::string("[") + std::to_string(st.hit_bounds[i]) + ", " +
               std::to_string(st.hit_buckets[i]) + "]";
  }
  return "{\"lookups\": " + std::to_string(st.lookups) +
         ", \"hits\": " + std::to_string(st.hits) +
         ", \"host_hits\": " + std::to_string(st.host_hits) +
         ", \"partial_hits\": " + std::to_string(st.partial_hits) +
         ", \"misses\": " + std::to_string(st.misses) +
         ", \"uncached\": " + std::to_string(st.uncached) +
         ", \"evictions\": " + std::to_string(st.evictions) +
         ", \"tokens_reused\": " + std::to_string(st.tokens_reused) +
         ", \"tokens_written\": " + std::to_string(st.tokens_written) +
         ", \"entries\": " + std::to_string(st.entries) +
         ", \"bytes\": " + std::to_string(st.bytes) +
         ", \"capacity_bytes\": " + std::to_string(st.capacity_bytes) +
         ", \"host_evictions\": " + std::to_string(st.host_evictions) +
         ", \"host_entries\": " + std::to_string(st.host_entries) +
         ", \"host_bytes\": " + std::to_string(st.host_bytes) +
         ", \"host_capacity_bytes\": " + std::to_string(st.host_capacity_bytes) +
         ", \"hit_calls\": " + std::to_string(st.hit_calls) +
         ", \"split_batches\": " + std::to_string(st.split_batches) +
         ", \"hit_seconds\": " + std::to_string(st.hit_seconds) +
         ", \"calls\": " + std::to_string(st.calls) +
         ", \"call_seconds\": " + std::to_string(st.call_seconds) +
         ", \"spills\": " + std::to_string(st.spills) +
         ", \"spill_seconds\": " + std::to_string(st.spill_seconds) +
         ", \"restore_seconds\": " + std::to_string(st.restore_seconds) +
         ", \"hit_buckets\": [" + buckets + "]}";
}

Status CacheRows(const CacheSpec& cache, const std::vector<InputView>& inputs,
                 std::vector<CacheRow>* rows) {
  const InputView& tokens = inputs[cache.tokens];
  const int64_t batch = tokens.shape[0], width = tokens.shape[1];
  const auto* token = static_cast<const int32_t*>(tokens.data);
  const auto* length = static_cast<const int32_t*>(inputs[cache.lengths].data);
  const auto* segment = static_cast<const int32_t*>(inputs[cache.segments].data);
  const auto* frozen = static_cast<const int32_t*>(inputs[cache.frozen_input()].data);
  const auto* key = static_cast<const uint8_t*>(inputs[cache.keys_input()].data);
  rows->assign(batch, CacheRow{});
  for (int64_t b = 0; b < batch; ++b) {
    CacheRow& row = (*rows)[b];
    row.length = std::min<int64_t>(length[b], width);
    row.frozen = frozen[b];
    const std::string where = "frozen_lengths[" + std::to_string(b) + "] = " +
                              std::to_string(row.frozen);
    if (row.frozen < 0 || row.frozen >= std::max<int64_t>(row.length, 1)) {
      return Invalid(where + " must be in [0, lengths[" + std::to_string(b) + "]) = [0, " +
                     std::to_string(length[b]) + "): the part after it holds at least the "
                     "row's last token");
    }
    const int32_t* row_tokens = token + b * width;
    row.tokens.assign(row_tokens, row_tokens + row.length);
    row.segments.resize(row.length);
    int64_t items = 0;
    for (int64_t i = 0; i < row.length; ++i) {
      items += cache.causal && row_tokens[i] == cache.item_start;
      row.segments[i] = cache.causal ? items : segment[b * width + i];
    }
    for (int64_t i = 0; i < row.frozen; ++i) {
      if (cache.soft >= 0 && row_tokens[i] == cache.soft) {
        return Invalid(where + " covers a SOFT marker at column " + std::to_string(i) +
                       ": the frozen part cannot hold the request's soft vectors");
      }
    }
    if (row.frozen > 0 && !cache.causal &&
        row.segments[row.frozen - 1] == row.segments[row.frozen]) {
      return Invalid(where + " cuts segment " + std::to_string(row.segments[row.frozen]) +
                     " (columns " + std::to_string(row.frozen - 1) + " and " +
                     std::to_string(row.frozen) + " share it): under the item-causal rule a "
                     "frozen part must end at a segment's end");
    }
    const uint8_t* k = key + b * kUserKeyBytes;
    if (std::any_of(k, k + kUserKeyBytes, [](uint8_t v) { return v != 0; })) {
      row.key.assign(reinterpret_cast<const char*>(k), kUserKeyBytes);
    }
  }
  return Status::Ok();
}

void AddCacheInputs(const Signature& sig, const PromptCache& cache, const Reservation& r,
                    const std::vector<CacheRow>& rows, const BucketedShapes& shapes,
                    std::vector<at::Tensor>* host) {
  const CacheSpec& spec = sig.cache;
  host->resize(spec.runtime);
  const int64_t padded_rows = shapes.inputs[spec.tokens][0];
  const int64_t padded_length = shapes.inputs[spec.tokens][1];
  // The block table's columns. On a GPU the paged kernels read only each row's cached
  // pages, and a width set by the padded prompt keeps one captured graph per bucket. The
  // CPU's program attends every column (masked past each row's cached part), where that
  // width would make a miss attend a prompt's length of empty pages: there the table is as
  // wide as the longest cached part.
  const int64_t page = cache.page_tokens();
  int64_t wanted = (padded_length + page - 1) / page;
  if (sig.device == "cpu") {
    wanted = 0;
    for (const RowPlan& plan : r.plans) wanted = std::max(wanted, (plan.cached + page - 1) / page);
  }
  const int64_t pages =
      WithinRange(sig, sig.cache_inputs[1].dims[1], std::max<int64_t>(wanted, 1));
  const int64_t suffix = SuffixWidth(sig, r, rows, padded_length);
  host->push_back(PromptCache::CachedLengths(r, padded_rows));
  host->push_back(PromptCache::BlockTable(r, padded_rows, pages));
  host->push_back(cache.WriteSlots(r, padded_rows, suffix));
}

ReservationGuard::ReservationGuard(PromptCache* cache, std::unique_ptr<Reservation> r)
    : cache_(cache), r_(std::move(r)), started_(std::chrono::steady_clock::now()) {}

ReservationGuard::~ReservationGuard() {
  if (r_) cache_->Finish(r_.get(), kept_, SecondsSince(started_));
}

}  // namespace torch_call
}  // namespace xgr
