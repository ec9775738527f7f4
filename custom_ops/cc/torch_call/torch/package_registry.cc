// The process-wide registry of TorchCall's packages: each (file, options) loaded once while
// anything holds it, each package's table sets likewise, and every loaded package's counters
// for the serving process.
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "custom_ops/cc/torch_call/torch/package_loading.h"
#include "custom_ops/cc/torch_call/torch/tables.h"
#include "custom_ops/cc/torch_call/torch_runner.h"

namespace xgr {
namespace torch_call {

namespace {

using LoadOutcome = std::pair<Status, std::shared_ptr<Package>>;

// Process-wide: one load per (path, options) while anything holds the package. Callers that
// arrive during a load wait on its future instead of loading twice; the map lock is never held
// while torch loads. Loaded packages are held by the TorchCall kernels that run them, not by
// the cache: when the last kernel goes (its model version unloaded), the package, its graphs
// and its extracted files go with it.
struct Cache {
  std::mutex mu;
  std::map<std::string, std::shared_future<LoadOutcome>> loading;
  std::map<std::string, std::weak_ptr<Package>> loaded;
  std::map<std::string, std::string> paths;  // key -> the path it was first loaded from
  // Table sets by (package, tables file); ids count up per process.
  std::map<std::string, std::weak_ptr<const Tables>> tables;
  std::map<const Package*, std::string> package_keys;
  uint64_t next_tables_id = 1;
};

Cache& GlobalCache() {
  static Cache* cache = new Cache();  // never destroyed: kernels may look packages up at exit
  return *cache;
}

}  // namespace

Status GetPackage(const std::string& path, const LoadOptions& options,
                  std::shared_ptr<Package>* package) {
  const std::string key = FileIdentity(path) + "\n" + std::to_string(options.concurrency);
  Cache& cache = GlobalCache();
  std::shared_future<LoadOutcome> future;
  std::promise<LoadOutcome> promise;
  bool loader = false;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto held = cache.loaded.find(key);
    if (held != cache.loaded.end()) {
      if (auto alive = held->second.lock()) {
        *package = std::move(alive);
        return Status::Ok();
      }
      cache.loaded.erase(held);
    }
    auto it = cache.loading.find(key);
    if (it == cache.loading.end()) {
      future = promise.get_future().share();
      cache.loading.emplace(key, future);
      loader = true;
    } else {
      future = it->second;
    }
  }
  if (loader) {
    LoadOutcome outcome;
    outcome.first = LoadPackageFile(path, options, &outcome.second);
    {
      std::lock_guard<std::mutex> lock(cache.mu);
      cache.loading.erase(key);  // a failed load is retried: a repaired file loads next time
      if (outcome.first.ok()) {
        cache.loaded[key] = outcome.second;
        cache.paths[key] = path;
        cache.package_keys[outcome.second.get()] = key;
      }
    }
    promise.set_value(std::move(outcome));
  }
  const LoadOutcome& outcome = future.get();
  if (outcome.first.ok()) *package = outcome.second;
  return outcome.first;
}

Status GetTables(const std::shared_ptr<Package>& package, const std::string& path,
                 std::shared_ptr<const Tables>* tables) {
  Cache& cache = GlobalCache();
  std::string key;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    key = cache.package_keys[package.get()] + "\n" + FileIdentity(path);
    auto held = cache.tables.find(key);
    if (held != cache.tables.end()) {
      if (auto alive = held->second.lock()) {
        *tables = std::move(alive);
        return Status::Ok();
      }
    }
  }
  // Loaded outside the lock (a large catalog takes a moment); two first callers may both
  // load, and the second keeps the first's set.
  std::shared_ptr<Tables> loaded;
  Status s = LoadPackageTables(*package, path, &loaded);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(cache.mu);
  auto& slot = cache.tables[key];
  if (auto alive = slot.lock()) {
    *tables = std::move(alive);
    return Status::Ok();
  }
  loaded->id = cache.next_tables_id++;
  slot = loaded;
  *tables = std::move(loaded);
  return Status::Ok();
}

std::string PackageStatsJson() {
  Cache& cache = GlobalCache();
  std::string json = "{";
  std::lock_guard<std::mutex> lock(cache.mu);
  for (const auto& [key, held] : cache.loaded) {
    const auto package = held.lock();
    if (!package) continue;
    const std::string& path = cache.paths[key];
    json += (json.size() > 1 ? ", " : "") + JsonString(path) + ": " + package->StatsJson();
  }
  return json + "}";
}

}  // namespace torch_call
}  // namespace xgr

// For benchmarks and tests in the serving process (ctypes): the counters of every loaded
// package as one JSON object keyed by path. Writes at most `size` bytes (NUL included) and
// returns the length the whole text needs.
extern "C" __attribute__((visibility("default"))) int XgrTorchCallStats(char* buffer, int size) {
  const std::string json = xgr::torch_call::PackageStatsJson();
  if (buffer != nullptr && size > 0) {
    const size_t n = std::min(json.size(), static_cast<size_t>(size - 1));
    json.copy(buffer, n);
    buffer[n] = '\0';
  }
  return static_cast<int>(json.size() + 1);
}
