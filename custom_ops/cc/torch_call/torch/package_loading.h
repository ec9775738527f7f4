// Loading one package file, for the process-wide registry (package_registry.cc): the file's
// format by its extension, its contract, its device and its tables (packages.cc).
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_PACKAGE_LOADING_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_PACKAGE_LOADING_H_

#include <memory>
#include <string>

#include "custom_ops/cc/torch_call/torch/tables.h"
#include "custom_ops/cc/torch_call/torch_runner.h"

namespace xgr {
namespace torch_call {

// The package at `path` (.pt2: AOTInductor, .pt/.ts: TorchScript); NotFound, FailedPrecondition
// or Internal naming the file and what to do otherwise.
Status LoadPackageFile(const std::string& path, const LoadOptions& options,
                       std::shared_ptr<Package>* out);

// The tables file at `path` for `package` (the catalog its contract reads).
Status LoadPackageTables(const Package& package, const std::string& path,
                         std::shared_ptr<Tables>* out);

// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string JsonString(const std::string& text);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_PACKAGE_LOADING_H_
