// The folders AOTInductor unpacks packages into, and their cleanup.
//
// AOTInductor unpacks a .pt2 package into a temporary folder (a few MB, the weights too) and
// removes it when its loader is destroyed: when the last TorchCall kernel holding the package
// goes (a model version unloaded). A package still loaded when the process exits would leave
// its folder behind, so the folders a load starts mapping libraries from are recorded and
// removed at exit; until then a CUDA model can still read its kernel files from them. Each
// such folder also names its process (an owner file: pid and start time), so folders of a
// process that was killed are removed by the next process that loads a package.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_EXTRACTION_FOLDERS_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_EXTRACTION_FOLDERS_H_

#include <filesystem>
#include <set>
#include <string>

namespace xgr {
namespace torch_call {

// The folders holding unpacked archives that this process maps libraries from.
std::set<std::filesystem::path> MappedExtractions();

// Records (for removal at exit) and marks with this process the folders torch unpacked
// `package` into since `before`.
void RecordExtractions(const std::set<std::filesystem::path>& before, const std::string& package);

// Once per process, before its first load: removes the folders of processes that died
// holding them.
void RemoveStaleExtractions();

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_EXTRACTION_FOLDERS_H_
