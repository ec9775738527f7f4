// The calling contract a TorchCall package carries (written by tf_frontend.torch_package).
//
// AOTInductor code trusts its inputs: a wrong dtype or a batch outside the compiled range reads
// out of bounds instead of raising. So every package states its contract and the op checks
// each call against it before torch sees the buffers. Text form, one entry a line:
//
//   device cpu
//   in int64 batch len        (dims: a literal size or a symbol shared across tensors)
//   out float32 batch 300
//   dim batch 1 4096          (inclusive range of a symbol)
//   rule token_range token_ids any tokens=0 lengths=1 vocab=1024: token_ids must lie in ...
//                             (a value rule of the program's inputs, in the order of its flag
//                             vector: name, argument, reduction, its parameters (input
//                             positions and limits), text; xgr_common.value_rules). The op
//                             checks each rule on the host before the package runs
//                             (value_checks.h): a kernel never sees a value that breaks one.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_SIGNATURE_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_SIGNATURE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "custom_ops/cc/torch_call/torch_runner.h"

namespace xgr {
namespace torch_call {

struct TensorSpec {
  ElementType dtype = ElementType::kFloat32;
  std::vector<std::string> dims;  // "8" or a symbol name
};

// A value rule the program's inputs obey (recorded, in flag order; the program computes it).
struct ValueRule {
  std::string name;
  std::string argument;
  std::string reduction;  // "any" or "max"
  std::map<std::string, int64_t> params;  // input positions ("tokens=0") and limits
  std::string text;
};

struct Signature {
  std::string device = "cpu";
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  std::vector<ValueRule> rules;

  // Parses the text form; errors name the offending line.
  static Status Parse(const std::string& text, Signature* out);
  // Checks count, dtype, rank, literal sizes, shared symbols and their ranges.
  Status CheckInputs(const std::vector<InputView>& inputs) const;
  // Checks the value rules on the host buffers (after CheckInputs): InvalidArgument naming
  // the input, the rule and the first row that breaks it.
  Status CheckValues(const std::vector<InputView>& inputs) const;
  std::string Describe() const;
};

Status ParseElementType(const std::string& name, ElementType* out);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_SIGNATURE_H_
