// Parsing the package contract and checking a call's inputs against it.
#include "custom_ops/cc/torch_call/torch/signature.h"

#include "custom_ops/cc/torch_call/torch/value_checks.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace xgr {
namespace torch_call {
namespace {

constexpr std::pair<const char*, ElementType> kTypeNames[] = {
    {"float32", ElementType::kFloat32}, {"float64", ElementType::kFloat64},
    {"float16", ElementType::kFloat16}, {"bfloat16", ElementType::kBFloat16},
    {"int8", ElementType::kInt8},       {"uint8", ElementType::kUInt8},
    {"int32", ElementType::kInt32},     {"int64", ElementType::kInt64},
    {"bool", ElementType::kBool},
};

Status Invalid(const std::string& message) { return {Code::kInvalidArgument, message}; }

bool IsLiteral(const std::string& dim) {
  if (dim.empty()) return false;
  for (char c : dim) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string SpecText(const TensorSpec& spec) {
  std::string s = std::string(ElementTypeName(spec.dtype)) + "[";
  for (size_t i = 0; i < spec.dims.size(); ++i) s += (i ? "," : "") + spec.dims[i];
  return s + "]";
}

}  // namespace

const char* ElementTypeName(ElementType t) {
  for (const auto& [name, type] : kTypeNames) {
    if (type == t) return name;
  }
  return "unknown";
}

int64_t ElementSize(ElementType t) {
  switch (t) {
    case ElementType::kFloat64:
    case ElementType::kInt64:
      return 8;
    case ElementType::kFloat32:
    case ElementType::kInt32:
      return 4;
    case ElementType::kFloat16:
    case ElementType::kBFloat16:
      return 2;
    default:
      return 1;
  }
}

Status ParseElementType(const std::string& name, ElementType* out) {
  for (const auto& [type_name, type] : kTypeNames) {
    if (name == type_name) {
      *out = type;
      return Status::Ok();
    }
  }
  return Invalid("unknown dtype '" + name + "'");
}

Status Signature::Parse(const std::string& text, Signature* out) {
  Signature sig;
  std::vector<std::string> table_names;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    std::istringstream words(line);
    std::string kind;
    if (!(words >> kind)) continue;
    const std::string where = "package signature line " + std::to_string(number) + " ('" +
                              line + "'): ";
    if (kind == "device") {
      if (!(words >> sig.device)) return Invalid(where + "expected 'device NAME'");
    } else if (kind == "in" || kind == "out") {
      TensorSpec spec;
      std::string dtype, dim;
      if (!(words >> dtype)) return Invalid(where + "expected a dtype");
      Status s = ParseElementType(dtype, &spec.dtype);
      if (!s.ok()) return Invalid(where + s.message);
      while (words >> dim) spec.dims.push_back(dim);
      (kind == "in" ? sig.inputs : sig.outputs).push_back(spec);
    } else if (kind == "dim") {
      std::string name;
      int64_t lo = 0, hi = 0;
      if (!(words >> name >> lo >> hi) || lo > hi) {
        return Invalid(where + "expected 'dim NAME MIN MAX' with MIN <= MAX");
      }
      sig.ranges[name] = {lo, hi};
    } else if (kind == "rule") {
      ValueRule rule;
      const std::string form = "expected 'rule NAME ARGUMENT REDUCTION [KEY=INT ...]: TEXT'";
      if (!(words >> rule.name >> rule.argument >> rule.reduction)) return Invalid(where + form);
      // The reduction, then KEY=INT parameters; the first word ending in ':' closes them.
      std::string word = rule.reduction;
      bool closed = !word.empty() && word.back() == ':';
      if (closed) rule.reduction.pop_back();
      while (!closed && (words >> word)) {
        closed = word.back() == ':';
        if (closed) word.pop_back();
        if (word.empty()) continue;
        const size_t eq = word.find('=');
        if (eq == std::string::npos || eq == 0 || !IsLiteral(word.substr(eq + 1)) ||
            word.size() - eq - 1 > 18) {
          return Invalid(where + "rule parameter '" + word + "' must be KEY=INT");
        }
        rule.params[word.substr(0, eq)] = std::stoll(word.substr(eq + 1));
      }
      if (!closed) return Invalid(where + form);
      if (rule.reduction != "any" && rule.reduction != "max") {
        return Invalid(where + "rule reduction must be 'any' or 'max', got '" +
                       rule.reduction + "'");
      }
      std::getline(words >> std::ws, rule.text);
      sig.rules.push_back(std::move(rule));
    } else if (kind == "bucket") {
      BucketRule rule;
      std::string how, word;
      const std::string form =
          "expected 'bucket INPUT DIM pow2' or 'bucket INPUT DIM multiple M offset O'";
      if (!(words >> rule.input >> rule.dim >> how)) return Invalid(where + form);
      if (how == "multiple") {
        if (!(words >> rule.multiple >> word >> rule.offset) || word != "offset" ||
            rule.multiple < 1 || rule.offset < 0) {
          return Invalid(where + form + " with M >= 1 and O >= 0");
        }
      } else if (how != "pow2") {
        return Invalid(where + form);
      }
      sig.buckets.push_back(rule);
    } else if (kind == "pad") {
      size_t input = 0;
      double value = 0;
      if (!(words >> input >> value)) return Invalid(where + "expected 'pad INPUT VALUE'");
      if (sig.pads.size() <= input) sig.pads.resize(input + 1, 0.0);
      sig.pads[input] = value;
    } else if (kind == "table") {
      std::string name;
      if (!(words >> name)) return Invalid(where + "expected 'table NAME'");
      table_names.push_back(name);
    } else if (kind == "graphs") {
      if (!(words >> sig.max_graphs) || sig.max_graphs < 1) {
        return Invalid(where + "expected 'graphs MAX' with MAX >= 1");
      }
    } else {
      return Invalid(where + "unknown entry '" + kind + "'");
    }
  }
  if (sig.outputs.empty()) return Invalid("package signature declares no outputs");
  // The last inputs are the tables: the runtime holds them, callers never send them.
  if (table_names.size() > sig.inputs.size()) {
    return Invalid("package signature names " + std::to_string(table_names.size()) +
                   " tables but declares " + std::to_string(sig.inputs.size()) + " inputs");
  }
  const size_t first_table = sig.inputs.size() - table_names.size();
  for (size_t i = 0; i < table_names.size(); ++i) {
    TensorSpec spec = sig.inputs[first_table + i];
    for (const std::string& dim : spec.dims) {
      if (!IsLiteral(dim)) {
        return Invalid("package signature table '" + table_names[i] +
                       "' has the dynamic dimension '" + dim + "'; tables have fixed sizes");
      }
    }
    sig.tables.push_back({table_names[i], std::move(spec)});
  }
  sig.inputs.resize(first_table);
  if (sig.pads.size() > sig.inputs.size()) {
    return Invalid("package signature pads input " + std::to_string(sig.pads.size() - 1) +
                   " but declares " + std::to_string(sig.inputs.size()) + " inputs");
  }
  sig.pads.resize(sig.inputs.size(), 0.0);
  for (const BucketRule& rule : sig.buckets) {
    if (rule.input >= sig.inputs.size() || rule.dim >= sig.inputs[rule.input].dims.size() ||
        IsLiteral(sig.inputs[rule.input].dims[rule.dim])) {
      return Invalid("package signature buckets input " + std::to_string(rule.input) +
                     " dim " + std::to_string(rule.dim) +
                     ", which is not a dynamic dimension of a declared input");
    }
  }
  for (const ValueRule& rule : sig.rules) {
    Status s = CheckRuleParams(rule, sig.inputs);
    if (!s.ok()) return Invalid("package signature rule '" + rule.name + "': " + s.message);
  }
  *out = std::move(sig);
  return Status::Ok();
}

Status Signature::CheckValues(const std::vector<InputView>& inputs) const {
  for (const ValueRule& rule : rules) {
    Status s = CheckRule(rule, inputs);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status Signature::CheckInputs(const std::vector<InputView>& inputs) const {
  if (inputs.size() != this->inputs.size()) {
    return Invalid("got " + std::to_string(inputs.size()) +
                   " inputs but the package takes " + std::to_string(this->inputs.size()) +
                   ": " + Describe());
  }
  std::map<std::string, std::pair<int64_t, size_t>> bound;  // symbol -> (size, first input)
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorSpec& spec = this->inputs[i];
    const InputView& got = inputs[i];
    const std::string name = "input " + std::to_string(i);
    if (got.dtype != spec.dtype) {
      return Invalid(name + ": expected " + ElementTypeName(spec.dtype) + ", got " +
                     ElementTypeName(got.dtype));
    }
    if (got.shape.size() != spec.dims.size()) {
      return Invalid(name + ": expected rank " + std::to_string(spec.dims.size()) + " (" +
                     SpecText(spec) + "), got shape " + ShapeText(got.shape));
    }
    for (size_t d = 0; d < spec.dims.size(); ++d) {
      const std::string& dim = spec.dims[d];
      const int64_t size = got.shape[d];
      const std::string where = name + " dim " + std::to_string(d) + " (" + SpecText(spec) +
                                ", got " + ShapeText(got.shape) + "): ";
      if (IsLiteral(dim)) {
        if (size != std::stoll(dim)) return Invalid(where + "expected size " + dim);
        continue;
      }
      auto range = ranges.find(dim);
      if (range != ranges.end() && (size < range->second.first || size > range->second.second)) {
        return Invalid(where + dim + " must lie in [" + std::to_string(range->second.first) +
                       ", " + std::to_string(range->second.second) + "], got " +
                       std::to_string(size));
      }
      auto [it, fresh] = bound.emplace(dim, std::make_pair(size, i));
      if (!fresh && it->second.first != size) {
        return Invalid(where + dim + " is " + std::to_string(it->second.first) + " in input " +
                       std::to_string(it->second.second) + " but " + std::to_string(size) +
                       " here; they must match");
      }
    }
  }
  return Status::Ok();
}

BucketedShapes Signature::Bucket(const std::vector<InputView>& inputs) const {
  BucketedShapes shapes;
  for (const BucketRule& rule : buckets) {
    const std::string& symbol = this->inputs[rule.input].dims[rule.dim];
    const int64_t real = inputs[rule.input].shape[rule.dim];
    int64_t padded = 1;
    if (rule.multiple == 0) {
      while (padded < real && padded < (int64_t{1} << 62)) padded *= 2;
    } else {
      padded = (real + rule.offset + rule.multiple - 1) / rule.multiple * rule.multiple -
               rule.offset;
    }
    auto range = ranges.find(symbol);
    if (range != ranges.end()) padded = std::min(padded, range->second.second);
    padded = std::max(padded, real);
    auto [it, fresh] = shapes.symbols.emplace(symbol, std::make_pair(real, padded));
    if (!fresh) it->second.second = std::max(it->second.second, padded);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int64_t> shape = inputs[i].shape;
    for (size_t d = 0; d < shape.size(); ++d) {
      auto it = shapes.symbols.find(this->inputs[i].dims[d]);
      if (it != shapes.symbols.end()) shape[d] = it->second.second;
    }
    shapes.padded = shapes.padded || shape != inputs[i].shape;
    shapes.inputs.push_back(std::move(shape));
  }
  return shapes;
}

std::vector<int64_t> Signature::RealOutputShape(size_t output,
                                                const std::vector<int64_t>& padded,
                                                const BucketedShapes& shapes) const {
  std::vector<int64_t> shape = padded;
  const auto& dims = outputs[output].dims;
  for (size_t d = 0; d < shape.size() && d < dims.size(); ++d) {
    auto it = shapes.symbols.find(dims[d]);
    if (it != shapes.symbols.end() && shape[d] == it->second.second) shape[d] = it->second.first;
  }
  return shape;
}

std::string Signature::Describe() const {
  std::string s = "(";
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + SpecText(inputs[i]);
  s += ") -> (";
  for (size_t i = 0; i < outputs.size(); ++i) s += (i ? ", " : "") + SpecText(outputs[i]);
  s += ") on " + device;
  if (!rules.empty()) {
    s += "; value rules:";
    for (const ValueRule& rule : rules) s += " " + rule.name;
  }
  return s;
}

}  // namespace torch_call
}  // namespace xgr
