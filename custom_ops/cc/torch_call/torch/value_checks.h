// The value rules of a package's inputs, checked on the host before the package runs.
//
// AOTInductor code trusts its inputs' values as it trusts their shapes: on the CPU a bounds
// check inside an OpenMP loop terminates the process, on CUDA a device-side assert poisons
// the context for every later request. The inputs crossing from TF are a few kilobytes, so
// each rule the package declares (xgr_common.value_rules) is checked here, row by row, and a
// break is answered InvalidArgument naming the input, the rule and the first row.
//
// Rules and their parameters (input positions, then limits):
//   lengths_positive  lengths=I
//   lengths_fit       lengths=I tokens=I
//   token_range       tokens=I lengths=I vocab=N
//   segment_order     segments=I lengths=I
//   exclusion_ids     exclude=I
//   positions         lengths=I embeds=I levels=N max_position=N
//   finite_embeddings embeds=I  (float32: no NaN or infinity)
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_VALUE_CHECKS_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_VALUE_CHECKS_H_

#include <vector>

#include "custom_ops/cc/torch_call/torch/signature.h"

namespace xgr {
namespace torch_call {

// Whether `rule` is one this op checks, with every parameter it needs, its input positions
// inside `inputs` and those inputs of the rank and dtype the check reads.
Status CheckRuleParams(const ValueRule& rule, const std::vector<TensorSpec>& inputs);

// Checks `rule` on the inputs of one call (shapes already checked against the contract).
Status CheckRule(const ValueRule& rule, const std::vector<InputView>& inputs);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_VALUE_CHECKS_H_
