// Host checks of the value rules (see value_checks.h).
#include "custom_ops/cc/torch_call/torch/value_checks.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

namespace xgr {
namespace torch_call {
namespace {

Status Invalid(const std::string& message) { return {Code::kInvalidArgument, message}; }

struct RuleShape {
  std::vector<std::string> inputs;  // parameters naming input positions
  std::vector<std::string> limits;  // parameters holding limits
};

const std::map<std::string, RuleShape>& KnownRules() {
  static const auto* rules = new std::map<std::string, RuleShape>{
      {"lengths_positive", {{"lengths"}, {}}},
      {"lengths_fit", {{"lengths", "tokens"}, {}}},
      {"token_range", {{"tokens", "lengths"}, {"vocab"}}},
      {"segment_order", {{"segments", "lengths"}, {}}},
      {"exclusion_ids", {{"exclude"}, {}}},
      {"positions", {{"lengths", "embeds"}, {"levels", "max_position"}}},
      {"finite_embeddings", {{"embeds"}, {}}},
  };
  return *rules;
}

// The rank each named input must have for the checks to read it.
int RankOf(const std::string& role) {
  if (role == "lengths") return 1;
  if (role == "embeds") return 3;
  return 2;
}

bool IsInteger(ElementType t) { return t == ElementType::kInt32 || t == ElementType::kInt64; }

int64_t At(const InputView& in, int64_t index) {
  if (in.dtype == ElementType::kInt32) return static_cast<const int32_t*>(in.data)[index];
  return static_cast<const int64_t*>(in.data)[index];
}

// "input 0 (token_ids) breaks rule token_range (TEXT): WHAT".
Status Broken(const ValueRule& rule, int64_t position, const std::string& what) {
  return Invalid("input " + std::to_string(position) + " (" + rule.argument +
                 ") breaks value rule " + rule.name + " (" + rule.text + "): " + what);
}

}  // namespace

Status CheckRuleParams(const ValueRule& rule, const std::vector<TensorSpec>& inputs) {
  auto known = KnownRules().find(rule.name);
  if (known == KnownRules().end()) {
    return Invalid("this TorchCall cannot check a rule named '" + rule.name +
                   "' (rebuild the op library, or export the package with this build)");
  }
  for (const std::string& role : known->second.inputs) {
    auto it = rule.params.find(role);
    if (it == rule.params.end()) return Invalid("needs the parameter " + role + "=INPUT");
    if (it->second < 0 || it->second >= static_cast<int64_t>(inputs.size())) {
      return Invalid(role + "=" + std::to_string(it->second) + " names no input (the package "
                     "takes " + std::to_string(inputs.size()) + ")");
    }
    const TensorSpec& spec = inputs[it->second];
    if (static_cast<int>(spec.dims.size()) != RankOf(role) ||
        (role != "embeds" && !IsInteger(spec.dtype)) ||
        (role == "embeds" && spec.dtype != ElementType::kFloat32)) {
      return Invalid(role + "=" + std::to_string(it->second) + " must be " +
                     (role == "embeds" ? "a float32" : "an integer") + " input of rank " +
                     std::to_string(RankOf(role)));
    }
  }
  for (const std::string& limit : known->second.limits) {
    auto it = rule.params.find(limit);
    if (it == rule.params.end() || it->second < 0) {
      return Invalid("needs the parameter " + limit + "=INT (>= 0)");
    }
  }
  return Status::Ok();
}

Status CheckRule(const ValueRule& rule, const std::vector<InputView>& inputs) {
  const auto& p = rule.params;  // complete: CheckRuleParams accepted them at load
  const std::string& name = rule.name;
  if (name == "finite_embeddings") {
    const InputView& embeds = inputs[p.at("embeds")];
    const int64_t per_row = embeds.shape[1] * embeds.shape[2];
    const float* values = static_cast<const float*>(embeds.data);
    for (int64_t k = 0; k < embeds.shape[0] * per_row; ++k) {
      if (!std::isfinite(values[k])) {
        return Broken(rule, p.at("embeds"), "row " + std::to_string(k / per_row) + " holds " +
                                                std::to_string(values[k]));
      }
    }
    return Status::Ok();
  }
  if (name == "exclusion_ids") {
    const InputView& exclude = inputs[p.at("exclude")];
    const int64_t count = exclude.shape[0] * exclude.shape[1];
    for (int64_t k = 0; k < count; ++k) {
      const int64_t v = At(exclude, k);
      if (v < -1) {
        return Broken(rule, p.at("exclude"), "row " + std::to_string(k / exclude.shape[1]) +
                                                 " holds " + std::to_string(v));
      }
    }
    return Status::Ok();
  }
  const InputView& lengths = inputs[p.at("lengths")];
  const int64_t rows = lengths.shape[0];
  if (name == "lengths_positive" || name == "lengths_fit") {
    const int64_t width = name == "lengths_fit" ? inputs[p.at("tokens")].shape[1] : 0;
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t n = At(lengths, b);
      if (name == "lengths_positive" ? n < 1 : n > width) {
        return Broken(rule, p.at("lengths"), "row " + std::to_string(b) + " has length " +
                                                 std::to_string(n));
      }
    }
  } else if (name == "token_range" || name == "segment_order") {
    const bool tokens = name == "token_range";
    const int64_t at = p.at(tokens ? "tokens" : "segments");
    const InputView& values = inputs[at];
    const int64_t width = values.shape[1];
    const int64_t vocab = tokens ? p.at("vocab") : 0;
    for (int64_t b = 0; b < rows && b < values.shape[0]; ++b) {
      const int64_t n = std::min(std::max<int64_t>(At(lengths, b), 0), width);
      int64_t previous = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = At(values, b * width + i);
        const bool bad = tokens ? (v < 0 || v >= vocab) : (v < 0 || v < previous);
        if (bad) {
          return Broken(rule, at, "row " + std::to_string(b) + " position " +
                                      std::to_string(i) + " holds " + std::to_string(v) +
                                      (tokens ? " (vocab_size " + std::to_string(vocab) + ")"
                                              : " after " + std::to_string(previous)));
        }
        previous = v;
      }
    }
  } else if (name == "positions") {
    int64_t longest = 0;
    for (int64_t b = 0; b < rows; ++b) longest = std::max(longest, At(lengths, b));
    const int64_t soft = inputs[p.at("embeds")].shape[1];
    const int64_t needed = soft + longest + p.at("levels") - 1;
    if (needed > p.at("max_position")) {
      return Broken(rule, p.at("lengths"),
                    std::to_string(soft) + " soft tokens + the longest length " +
                        std::to_string(longest) + " + " + std::to_string(p.at("levels") - 1) +
                        " generated codes need " + std::to_string(needed) +
                        " positions, the model has " + std::to_string(p.at("max_position")));
    }
  }
  return Status::Ok();
}

}  // namespace torch_call
}  // namespace xgr
