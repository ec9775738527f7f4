// Loading a package's tables file (see tables.h).
#include "custom_ops/cc/torch_call/torch/tables.h"

#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
#include <map>
#include <sys/stat.h>

#include "custom_ops/cc/torch_call/torch/scalar_types.h"

namespace xgr {
namespace torch_call {
namespace {

// A tables file that does not fit its package: the deploy's fault, never the caller's.
Status BadPackage(const std::string& message) { return {Code::kFailedPrecondition, message}; }

}  // namespace

// A file's identity on disk: the same bytes under two hard-linked paths share it; a rewritten
// file does not (its modification time or size changes). The path itself when stat fails
// (the load then reports the missing file).
std::string FileIdentity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "path " + path;
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
         std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

Status LoadTables(const Signature& sig, const c10::Device& device, const std::string& path,
                  std::shared_ptr<Tables>* out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return {Code::kNotFound, "tables file not found: '" + path +
                                 "' (is it an asset of the SavedModel beside the package?)"};
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                          std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    return BadPackage("tables file " + path + " is not a torch.save file of tensors: " +
                      e.what_without_backtrace());
  }
  if (!value.isGenericDict()) {
    return BadPackage("tables file " + path + " must hold a dict of name -> tensor, got " +
                      value.tagKind());
  }
  std::map<std::string, at::Tensor> named;
  for (const auto& entry : value.toGenericDict()) {
    if (entry.key().isString() && entry.value().isTensor()) {
      named[entry.key().toStringRef()] = entry.value().toTensor();
    }
  }
  auto tables = std::make_shared<Tables>();
  tables->path = path;
  c10::InferenceMode inference;
  for (const auto& [name, spec] : sig.tables) {
    auto it = named.find(name);
    if (it == named.end()) {
      return BadPackage("tables file " + path + " lacks the table '" + name +
                        "' the package reads; write it with the export that made the package");
    }
    const at::Tensor& t = it->second;
    ElementType dtype;
    bool same = FromScalarType(t.scalar_type(), &dtype) && dtype == spec.dtype &&
                t.dim() == static_cast<int64_t>(spec.dims.size());
    for (size_t d = 0; same && d < spec.dims.size(); ++d) {
      same = std::to_string(t.size(static_cast<int64_t>(d))) == spec.dims[d];
    }
    if (!same) {
      std::string dims;
      for (const auto& d : spec.dims) dims += (dims.empty() ? "" : ",") + d;
      return BadPackage("tables file " + path + ": table '" + name + "' is " +
                        c10::str(t.scalar_type(), t.sizes()) + ", the package reads " +
                        ElementTypeName(spec.dtype) + "[" + dims +
                        "] (a catalog within the package's capacity, padded by the export)");
    }
    tables->tensors.push_back(t.to(device).contiguous());
  }
  *out = std::move(tables);
  return Status::Ok();
}

}  // namespace torch_call
}  // namespace xgr
