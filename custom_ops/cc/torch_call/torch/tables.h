// A package's tables: fixed-size tensors (an engine's catalog) that the contract's `table`
// lines name as the program's last inputs, loaded once from a tables file (torch.save of a
// dict name -> tensor, written by the export) and passed on every run.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_TABLES_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_TABLES_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "custom_ops/cc/torch_call/torch/signature.h"
#include "custom_ops/cc/torch_call/torch_runner.h"

namespace xgr {
namespace torch_call {

// A tables file loaded for one package: its tensors on the package's device, in the order of
// the contract's `table` lines; `id` tells apart the table sets of one package (its graphs are
// captured per set, since a graph reads its tables by address).
struct Tables {
  std::vector<at::Tensor> tensors;
  std::string path;
  uint64_t id = 0;
};

// A file's identity on disk (device, inode, size, modification time): the same bytes under
// two hard-linked paths share it, a rewritten file does not. The path itself when stat fails.
std::string FileIdentity(const std::string& path);

// Reads `path`, checks every table `sig` names (dtype and sizes) and moves them to `device`.
// NotFound for a missing file, FailedPrecondition naming the table for one that does not fit.
Status LoadTables(const Signature& sig, const c10::Device& device, const std::string& path,
                  std::shared_ptr<Tables>* out);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_TABLES_H_
