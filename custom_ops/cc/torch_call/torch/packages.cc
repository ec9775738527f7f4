// The torch half of TorchCall: loading one AOTInductor / TorchScript package file and running
// it on borrowed TF buffers (package_registry.cc keeps each loaded once per process).
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

#include "custom_ops/cc/torch_call/torch/cache_binding.h"
#include "custom_ops/cc/torch_call/torch/extraction_folders.h"
#include "custom_ops/cc/torch_call/torch/graph_runner.h"
#include "custom_ops/cc/torch_call/torch/package_loading.h"
#include "custom_ops/cc/torch_call/torch/prompt_cache.h"
#include "custom_ops/cc/torch_call/torch/signature.h"
#include "custom_ops/cc/torch_call/torch/scalar_types.h"
#include "custom_ops/cc/torch_call/torch/tables.h"
#include "custom_ops/cc/torch_call/torch_runner.h"

namespace xgr {
namespace torch_call {

namespace {

// AOTInductor metadata key / TorchScript extra file holding the Signature text.
constexpr char kSignatureKey[] = "xgr_signature";
constexpr char kSignatureFile[] = "xgr_signature.txt";

// A package that cannot be used as deployed: the server's fault, never the caller's.
Status BadPackage(const std::string& message) { return {Code::kFailedPrecondition, message}; }

// A prompt-KV pool the package's device cannot hold: the deployment's setting at fault, not
// the package, so its load is refused naming the pool and the flag that sizes it.
class PoolDoesNotFit : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bytes as an operator sets them: whole GiB, else GiB to two decimals, else MiB.
std::string BytesText(int64_t bytes) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  char text[64];
  if (bytes % kGiB == 0) {
    std::snprintf(text, sizeof(text), "%lld GiB", static_cast<long long>(bytes / kGiB));
  } else if (bytes >= kGiB) {
    std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / kGiB);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return text;
}

// The pool as the operator set it: its size and the setting that sized it.
std::string PoolSetting(int64_t budget) {
  return "the prompt-KV pool of " + BytesText(budget) +
         " (XGR_PROMPT_CACHE_BYTES, set by `xgr serve --prompt_cache_gb`)";
}

// PoolDoesNotFit unless the package takes a pool of `pages` pages (the sink aside): within
// its contract's range for the pool's page count, and, for a package traced without an upper
// bound there (exported before the bound existed), under 2**31 elements, the most its kernels'
// 32-bit indexing reaches: a larger pool would be read and written out of bounds.
void CheckPoolPages(const Signature& sig, int64_t pages, int64_t budget) {
  const std::string& symbol = sig.cache_inputs[3].dims[2];
  const auto range = sig.ranges.find(symbol);
  if (range == sig.ranges.end()) return;
  const int64_t most = range->second.second;
  const CacheSpec& spec = sig.cache;
  const int64_t page_bytes = PromptCache::PageBytes(spec);
  const int64_t page_elements = page_bytes / ElementSize(spec.dtype);
  std::string rule;
  int64_t fits = 0;  // the largest page count the package takes, the sink included
  if (most >= (int64_t{1} << 62)) {
    fits = ((int64_t{1} << 31) - 1) / std::max<int64_t>(page_elements, 1);
    rule = "was exported without an upper bound on the pool's pages, so its kernels index "
           "the pool in 32 bits (at most 2**31 elements); re-export it with this version";
  } else {
    fits = most;
    rule = "takes a pool of at most " + std::to_string(most) + " pages";
  }
  if (pages + 1 <= fits) return;
  const int64_t largest = std::max<int64_t>(fits - 1, 0) * page_bytes;
  throw PoolDoesNotFit(PoolSetting(budget) + " holds " + std::to_string(pages) +
                       " pages, but the package " + rule + "; give the cache at most " +
                       BytesText(largest));
}

// The package's prompt cache with the process's budgets; PoolDoesNotFit when the package
// cannot take its pool or the pool cannot be allocated on `device`.
std::unique_ptr<PromptCache> MakeCache(const Signature& sig, c10::Device device) {
  const CacheSpec& spec = sig.cache;
  const int64_t budget = CacheBudget();
  CheckPoolPages(sig, PromptCache::PoolPages(spec, budget), budget);
  try {
    return std::make_unique<PromptCache>(spec, budget, device, HostCacheBudget());
  } catch (const c10::Error& e) {
    throw PoolDoesNotFit(PoolSetting(budget) + " does not fit on " + device.str() +
                         " beside the package; give the cache a smaller pool (" +
                         e.what_without_backtrace() + ")");
  }
}

// Torch's OpenMP pool size is per calling thread: set it once on each TF worker that calls us,
// or torch's threads pile up behind TF's and every call slows ~10x.
void ApplyThreadCount(int threads) {
  thread_local int applied = -1;
  if (threads > 0 && applied != threads) {
    at::set_num_threads(threads);
    applied = threads;
  }
}

// Shared by both formats: contract checks, device moves, result hand-back.
class PackageBase : public Package {
 public:
  PackageBase(Signature signature, std::string format)
      : signature_(std::move(signature)), format_(std::move(format)),
        device_(signature_.device) {
    for (const auto& spec : signature_.outputs) output_dtypes_.push_back(spec.dtype);
    if (signature_.cache.enabled) {
      cache_ = MakeCache(signature_, device_);
      split_tokens_ = SplitRunTokens();
    }
  }

  Status Run(const std::vector<InputView>& inputs, int threads,
             std::vector<Result>* outputs, const Tables* tables) override {
    if (tables == nullptr && !signature_.tables.empty()) {
      return BadPackage("the package reads " + std::to_string(signature_.tables.size()) +
                        " tables (its catalog) but the call names no tables file; export the "
                        "SavedModel with the package's tables asset");
    }
    if (tables != nullptr && tables->tensors.size() != signature_.tables.size()) {
      return BadPackage("the tables file " + tables->path + " was loaded for another package");
    }
    Status s = signature_.CheckInputs(inputs);
    if (s.ok()) s = signature_.CheckValues(inputs);  // no kernel sees a value breaking a rule
    std::vector<CacheRow> rows;
    if (s.ok() && cache_) s = CacheRows(signature_.cache, inputs, &rows);
    if (!s.ok()) return s;
    ApplyThreadCount(threads);
    try {
      c10::InferenceMode inference;
      // Kernels launch on the package's GPU whatever device the calling thread had current.
      std::optional<c10::DeviceGuard> on_device;
      if (!device_.is_cpu() && device_.has_index()) on_device.emplace(device_);
      std::vector<at::Tensor> resident;
      std::string resident_key;
      std::optional<ReservationGuard> reservation;
      if (cache_) {
        reservation.emplace(cache_.get(), cache_->Reserve(rows));
        resident.push_back(cache_->pool());
        resident_key = "pool;";
      }
      if (tables != nullptr) {
        resident.insert(resident.end(), tables->tensors.begin(), tables->tensors.end());
        resident_key += "tables " + std::to_string(tables->id) + ";";
      }
      std::vector<std::vector<int64_t>> groups;
      if (reservation && BatchMajorOutputs(signature_)) {
        groups = SuffixGroups(signature_, reservation->get(), rows, split_tokens_);
      }
      std::vector<at::Tensor> results;
      if (groups.size() <= 1) {
        results = RunRows(inputs, rows, reservation ? &reservation->get() : nullptr, resident,
                          resident_key);
      } else {
        results = RunInGroups(signature_, inputs, rows, reservation->get(), groups,
                              [&](const std::vector<InputView>& part,
                                  const std::vector<CacheRow>& part_rows,
                                  const Reservation& plans) {
                                return RunRows(part, part_rows, &plans, resident, resident_key);
                              });
        reservation->RanAs(static_cast<int>(groups.size()));
      }
      Status handed = HandBack(results, outputs);
      if (handed.ok() && reservation) reservation->Keep();
      return handed;
    } catch (const c10::OutOfMemoryError& e) {
      return {Code::kResourceExhausted, "the device ran out of memory running the " + format_ +
                                            " package: " + e.what_without_backtrace() +
                                            PoolHint()};
    } catch (const c10::Error& e) {
      // The inputs passed the contract and its value rules: a failure now is the package's
      // or the device's, not the caller's.
      return {Code::kInternal, "torch failed running " + format_ + " package: " +
                                   e.what_without_backtrace() + PoolHint()};
    } catch (const std::exception& e) {
      // AOTInductor reports a kernel's failure (an out-of-memory among them) only as "run_func_
      // API call failed": the pool's share of the device is what the operator can act on.
      return {Code::kInternal,
              "torch failed running " + format_ + " package: " + e.what() + PoolHint()};
    }
  }

  std::string Describe() const override { return signature_.Describe(); }
  size_t num_tables() const override { return signature_.tables.size(); }
  std::string StatsJson() const override { return "{" + CacheJsonField() + "}"; }
  std::string device() const override { return device_.str(); }
  std::string format() const override { return format_; }
  const std::vector<ElementType>& output_dtypes() const override { return output_dtypes_; }

 protected:
  virtual std::vector<at::Tensor> Forward(std::vector<at::Tensor> inputs) = 0;

  // Runs host inputs at their (bucketed) shapes, then the resident tensors (already on the
  // device: the cache's pool, the tables; `resident_key` names them): eagerly on the
  // package's device by default.
  virtual std::vector<at::Tensor> Execute(const std::vector<at::Tensor>& host,
                                          const BucketedShapes& shapes,
                                          const std::vector<at::Tensor>& resident,
                                          const std::string& resident_key) {
    (void)shapes;
    (void)resident_key;
    std::vector<at::Tensor> tensors;
    tensors.reserve(host.size() + resident.size());
    for (const auto& t : host) tensors.push_back(device_.is_cpu() ? t : t.to(device_));
    tensors.insert(tensors.end(), resident.begin(), resident.end());
    return Forward(std::move(tensors));
  }

  // One run of `inputs` (with the cache: `rows` and their plans in `r`), results cut back to
  // the real shapes.
  std::vector<at::Tensor> RunRows(const std::vector<InputView>& inputs,
                                  const std::vector<CacheRow>& rows, const Reservation* r,
                                  const std::vector<at::Tensor>& resident,
                                  const std::string& resident_key) {
    const BucketedShapes shapes = signature_.Bucket(inputs);
    std::vector<at::Tensor> host = HostInputs(inputs, shapes);
    if (r != nullptr) AddCacheInputs(signature_, *cache_, *r, rows, shapes, &host);
    std::vector<at::Tensor> results = Execute(host, shapes, resident, resident_key);
    for (size_t i = 0; i < results.size() && i < signature_.outputs.size(); ++i) {
      results[i] = CutBack(results[i], i, shapes);
    }
    return results;
  }

  // For a failed run of a package whose prompt-KV pool sits on a GPU: the pool's size, the
  // device's free memory now and the flag that shrinks the pool (a pool that loaded can still
  // leave the model too little room for its largest bucket); else empty.
  std::string PoolHint() const {
    if (!cache_ || !device_.is_cuda()) return "";
    const int64_t pool = cache_->pool().numel() * cache_->pool().element_size();
    std::string hint = " [the prompt-KV pool holds " + BytesText(pool) + " of " + device_.str();
    int64_t free_bytes = 0, total_bytes = 0;
    if (DeviceMemory(device_, &free_bytes, &total_bytes)) {
      hint += ", " + BytesText(free_bytes) + " of " + BytesText(total_bytes) + " free now";
    }
    return hint + "; if the device ran out of memory, give the cache a smaller pool with "
                  "`xgr serve --prompt_cache_gb`]";
  }

  // `"prompt_cache": {...}, ` for a package that keeps a cache, else empty.
  std::string CacheJsonField() const {
    return cache_ ? "\"prompt_cache\": " + CacheStatsJson(cache_->Stats()) : "";
  }

 public:
  const Signature& signature() const { return signature_; }
  const c10::Device& torch_device() const { return device_; }

 private:
  // Views of the TF buffers (zero-copy, they outlive the call), or copies padded to the
  // bucketed shape with each input's padding value.
  std::vector<at::Tensor> HostInputs(const std::vector<InputView>& inputs,
                                     const BucketedShapes& shapes) const {
    std::vector<at::Tensor> host;
    host.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const InputView& in = inputs[i];
      const auto options = at::TensorOptions().dtype(ToScalarType(in.dtype));
      at::Tensor view = at::from_blob(const_cast<void*>(in.data), in.shape, options);
      if (shapes.inputs[i] == in.shape) {
        host.push_back(view);
        continue;
      }
      at::Tensor padded = at::full(shapes.inputs[i], signature_.pads[i], options);
      at::Tensor corner = padded;
      for (size_t d = 0; d < in.shape.size(); ++d) corner = corner.narrow(d, 0, in.shape[d]);
      corner.copy_(view);
      host.push_back(padded);
    }
    return host;
  }

  at::Tensor CutBack(const at::Tensor& result, size_t output,
                     const BucketedShapes& shapes) const {
    if (!shapes.padded) return result;
    const std::vector<int64_t> real =
        signature_.RealOutputShape(output, result.sizes().vec(), shapes);
    at::Tensor cut = result;
    for (size_t d = 0; d < real.size(); ++d) {
      if (real[d] != cut.size(d)) cut = cut.narrow(d, 0, real[d]);
    }
    return cut;
  }

  Status HandBack(const std::vector<at::Tensor>& results, std::vector<Result>* outputs) {
    if (results.size() != output_dtypes_.size()) {
      return {Code::kInternal, "package returned " + std::to_string(results.size()) +
                                   " tensors but its signature declares " +
                                   std::to_string(output_dtypes_.size())};
    }
    outputs->clear();
    for (size_t i = 0; i < results.size(); ++i) {
      // One explicit copy back when the engine ran on an accelerator; none on the CPU.
      at::Tensor host = results[i].to(at::kCPU).contiguous();
      Result r;
      if (!FromScalarType(host.scalar_type(), &r.dtype) || r.dtype != output_dtypes_[i]) {
        return {Code::kInternal, "package output " + std::to_string(i) + " has dtype " +
                                     std::string(c10::toString(host.scalar_type())) +
                                     ", its signature declares " +
                                     ElementTypeName(output_dtypes_[i])};
      }
      r.shape = host.sizes().vec();
      r.data = host.data_ptr();
      r.owner = std::shared_ptr<void>(new at::Tensor(host),
                                      [](void* p) { delete static_cast<at::Tensor*>(p); });
      outputs->push_back(std::move(r));
    }
    return Status::Ok();
  }

  Signature signature_;
  std::string format_;
  c10::Device device_;
  std::vector<ElementType> output_dtypes_;
  std::unique_ptr<PromptCache> cache_;  // with a `cache` contract line
  int64_t split_tokens_ = kSplitRunTokens;  // SuffixGroups' cost of a second run
};

class AotiPackage : public PackageBase {
 public:
  // `graphed`: the loader runs single-threaded and each bucket's run is replayed as a CUDA
  // graph (graph_runner.h).
  AotiPackage(Signature sig, std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader,
              bool graphed)
      : PackageBase(std::move(sig), "AOTInductor"), loader_(std::move(loader)) {
    if (graphed) {
      graphs_ = MakeGraphRunner(loader_.get(), torch_device(), signature().max_graphs);
    }
  }

  ~AotiPackage() override {
    const bool graphed = graphs_ != nullptr;
    graphs_.reset();  // the graphs before the loader they replay
    loader_.reset();
    if (graphed) ReleaseCachedDeviceMemory();  // the graphs' pool back to the device
  }

  std::string StatsJson() const override {
    const std::string cache = CacheJsonField();
    if (!graphs_) return "{\"graphs\": false" + (cache.empty() ? "" : ", " + cache) + "}";
    const GraphStats st = graphs_->Stats();
    return "{" + (cache.empty() ? "" : cache + ", ") + "\"graphs\": true, \"calls\": " +
           std::to_string(st.calls) +
           ", \"replays\": " + std::to_string(st.replays) +
           ", \"captures\": " + std::to_string(st.captures) +
           ", \"eager_runs\": " + std::to_string(st.eager_runs) +
           ", \"evictions\": " + std::to_string(st.evictions) +
           ", \"held\": " + std::to_string(st.graphs) +
           ", \"budget\": " + std::to_string(st.budget) +
           ", \"failure\": " + JsonString(st.failure) + "}";
  }

 protected:
  std::vector<at::Tensor> Forward(std::vector<at::Tensor> inputs) override {
    return loader_->run(inputs);  // the runner queues callers beyond its model instances
  }

  std::vector<at::Tensor> Execute(const std::vector<at::Tensor>& host,
                                  const BucketedShapes& shapes,
                                  const std::vector<at::Tensor>& resident,
                                  const std::string& resident_key) override {
    if (!graphs_) return PackageBase::Execute(host, shapes, resident, resident_key);
    // One graph per bucket and resident set: a graph reads its tables (and the cache's
    // pool) where they were captured.
    std::string key = resident_key;
    for (const auto& t : host) {
      for (int64_t size : t.sizes()) key += std::to_string(size) + ",";
      key += ";";
    }
    return graphs_->Run(host, key, resident);
  }

 private:
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  std::unique_ptr<GraphRunner> graphs_;
};

// Whether a package of `sig` replays CUDA graphs here: it asks for them, it runs on CUDA,
// this build can capture, and XGR_TORCH_CALL_GRAPHS is not "0" or "off" (an operator's
// switch, and the eager anchor of the benchmarks).
bool WantsGraphs(const Signature& sig) {
  if (sig.max_graphs < 1 || !GraphsBuilt() || !c10::Device(sig.device).is_cuda()) return false;
  const char* env = std::getenv("XGR_TORCH_CALL_GRAPHS");
  const std::string value = env ? env : "";
  return value != "0" && value != "off";
}

class ScriptPackage : public PackageBase {
 public:
  ScriptPackage(Signature sig, torch::jit::Module module)
      : PackageBase(std::move(sig), "TorchScript"), module_(std::move(module)) {}

 protected:
  std::vector<at::Tensor> Forward(std::vector<at::Tensor> inputs) override {
    std::vector<c10::IValue> args(inputs.begin(), inputs.end());
    c10::IValue out = module_.forward(args);
    std::vector<at::Tensor> results;
    if (out.isTensor()) {
      results.push_back(out.toTensor());
    } else if (out.isTuple()) {
      for (const auto& v : out.toTupleRef().elements()) results.push_back(v.toTensor());
    } else if (out.isList()) {
      for (const auto& v : out.toListRef()) results.push_back(v.toTensor());
    } else {
      TORCH_CHECK(false, "TorchScript forward must return a tensor, tuple or list of tensors, "
                         "got ", out.tagKind());
    }
    return results;
  }

 private:
  torch::jit::Module module_;  // forward on a shared module is safe from many threads
};

Status CheckDevice(const Signature& sig, const std::string& path) {
  c10::Device device(sig.device);  // throws c10::Error on a malformed name
  if (device.is_cuda() && torch::cuda::device_count() == 0) {
    return {Code::kFailedPrecondition,
            "package " + path + " was compiled for " + sig.device +
                " but this process sees no CUDA device (torch is a CPU build or no GPU is "
                "visible); export the package for the CPU or run on a GPU host"};
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    return BadPackage("package " + path + " targets unsupported device " + sig.device);
  }
  if (device.is_cuda() && device.has_index() &&
      device.index() >= static_cast<int>(torch::cuda::device_count())) {
    return {Code::kFailedPrecondition,
            "package " + path + " was compiled for " + sig.device + " but this process sees " +
                std::to_string(torch::cuda::device_count()) +
                " CUDA device(s); export it for a GPU this host has (e.g. cuda:0) or make that "
                "GPU visible (CUDA_VISIBLE_DEVICES)"};
  }
  return Status::Ok();
}

Status LoadAoti(const std::string& path, const LoadOptions& options,
                std::shared_ptr<Package>* out) {
  RemoveStaleExtractions();
  const auto mapped_before = MappedExtractions();
  auto loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
      path, "model", /*run_single_threaded=*/false,
      static_cast<size_t>(std::max(1, options.concurrency)));
  auto metadata = loader->get_metadata();
  auto it = metadata.find(kSignatureKey);
  if (it == metadata.end()) {
    return BadPackage("AOTInductor package " + path + " carries no '" + kSignatureKey +
                   "' metadata; package it with tf_frontend.torch_package");
  }
  Signature sig;
  Status s = Signature::Parse(it->second, &sig);
  if (!s.ok()) return BadPackage(path + ": " + s.message);
  auto aoti_device = metadata.find("AOTI_DEVICE_KEY");
  if (aoti_device != metadata.end() &&
      c10::Device(aoti_device->second).type() != c10::Device(sig.device).type()) {
    return BadPackage("package " + path + " was compiled for " + aoti_device->second +
                   " but its signature says " + sig.device);
  }
  if (!(s = CheckDevice(sig, path)).ok()) return s;
  const c10::Device device(sig.device);
  const bool graphed = WantsGraphs(sig);
  if (graphed || (device.is_cuda() && device.has_index() && device.index() != 0)) {
    // The loader was made before the contract was readable: reload on the GPU the package
    // names (its weights and its inputs share a device), single-threaded when its runs are
    // captured (one instance; the graph runner serialises the calls).
    loader.reset();
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path, "model", /*run_single_threaded=*/graphed,
        graphed ? size_t{1} : static_cast<size_t>(std::max(1, options.concurrency)),
        device.has_index() ? device.index() : c10::DeviceIndex{-1});
  }
  RecordExtractions(mapped_before, path);
  *out = std::make_shared<AotiPackage>(std::move(sig), std::move(loader), graphed);
  return Status::Ok();
}

Status LoadScript(const std::string& path, std::shared_ptr<Package>* out) {
  torch::jit::ExtraFilesMap extra{{kSignatureFile, ""}};
  // Read the contract first (on the CPU) so a CUDA package fails with a clear message.
  torch::jit::load(path, c10::Device(c10::kCPU), extra);
  if (extra[kSignatureFile].empty()) {
    return BadPackage("TorchScript package " + path + " carries no " + kSignatureFile +
                   "; package it with tf_frontend.torch_package");
  }
  Signature sig;
  Status s = Signature::Parse(extra[kSignatureFile], &sig);
  if (!s.ok()) return BadPackage(path + ": " + s.message);
  if (!(s = CheckDevice(sig, path)).ok()) return s;
  torch::jit::Module module = torch::jit::load(path, c10::Device(sig.device));
  module.eval();
  *out = std::make_shared<ScriptPackage>(std::move(sig), std::move(module));
  return Status::Ok();
}

Status Load(const std::string& path, const LoadOptions& options, std::shared_ptr<Package>* out) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return {Code::kNotFound, "package not found: '" + path +
                                 "' (is it an asset of the SavedModel and was the SavedModel "
                                 "copied whole?)"};
  }
  const std::string ext = std::filesystem::path(path).extension().string();
  try {
    if (ext == ".pt2") return LoadAoti(path, options, out);
    if (ext == ".pt" || ext == ".ts") return LoadScript(path, out);
    return BadPackage("package '" + path + "' must end in .pt2 (AOTInductor) or "
                   ".pt/.ts (TorchScript)");
  } catch (const PoolDoesNotFit& e) {
    return BadPackage("cannot load package '" + path + "': " + e.what());
  } catch (const c10::Error& e) {
    return {Code::kInternal, "cannot load package '" + path + "': " +
                                 e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {Code::kInternal, "cannot load package '" + path + "': " + e.what()};
  }
}

}  // namespace

Status LoadPackageFile(const std::string& path, const LoadOptions& options,
                       std::shared_ptr<Package>* out) {
  return Load(path, options, out);
}

Status LoadPackageTables(const Package& package, const std::string& path,
                         std::shared_ptr<Tables>* out) {
  const auto* base = dynamic_cast<const PackageBase*>(&package);
  if (base == nullptr) return {Code::kInternal, "tables for a package of unknown kind"};
  if (base->signature().tables.empty()) {
    return BadPackage("tables file " + path + " given for a package that reads no tables");
  }
  try {
    return LoadTables(base->signature(), base->torch_device(), path, out);
  } catch (const c10::Error& e) {
    return {Code::kInternal, "cannot load tables file " + path + ": " + e.what_without_backtrace()};
  }
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace torch_call
}  // namespace xgr
