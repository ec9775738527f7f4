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

// `cache KEY=VALUE ...` (see signature.h).
Status ParseCache(std::istringstream& words, CacheSpec* cache) {
  std::map<std::string, std::string> values;
  std::string word;
  while (words >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Invalid("cache parameter '" + word + "' must be KEY=VALUE");
    }
    values[word.substr(0, eq)] = word.substr(eq + 1);
  }
  const char* ints[] = {"runtime", "page_tokens", "layers", "kv_heads", "head_dim", "tokens",
                        "lengths", "segments", "soft", "item_start"};
  std::map<std::string, int64_t> number;
  for (const char* key : ints) {
    auto it = values.find(key);
    const bool negative = it != values.end() && !it->second.empty() && it->second[0] == '-';
    const std::string digits = negative ? it->second.substr(1) : it == values.end() ? "" :
                                                                                      it->second;
    if (it == values.end() || !IsLiteral(digits) || digits.size() > 18) {
      return Invalid(std::string("cache needs ") + key + "=INT");
    }
    number[key] = negative ? -std::stoll(digits) : std::stoll(digits);
  }
  for (const char* key : {"dtype", "mode", "scope"}) {
    if (values.find(key) == values.end()) return Invalid(std::string("cache needs ") + key);
  }
  Status s = ParseElementType(values["dtype"], &cache->dtype);
  if (!s.ok()) return s;
  if (values["mode"] != "causal" && values["mode"] != "item_causal") {
    return Invalid("cache mode must be causal or item_causal, got '" + values["mode"] + "'");
  }
  const int64_t pt = number["page_tokens"];
  if (pt < 16 || (pt & (pt - 1)) != 0) return Invalid("cache page_tokens must be a power of two >= 16");
  for (const char* key : {"runtime", "layers", "kv_heads", "head_dim", "tokens", "lengths",
                          "segments"}) {
    if (number[key] < 0 || (number[key] == 0 && std::string(key) != "runtime" &&
                            std::string(key) != "tokens")) {
      return Invalid(std::string("cache ") + key + " must be positive");
    }
  }
  cache->enabled = true;
  cache->runtime = static_cast<size_t>(number["runtime"]);
  cache->page_tokens = pt;
  cache->layers = number["layers"];
  cache->kv_heads = number["kv_heads"];
  cache->head_dim = number["head_dim"];
  cache->tokens = static_cast<size_t>(number["tokens"]);
  cache->lengths = static_cast<size_t>(number["lengths"]);
  cache->segments = static_cast<size_t>(number["segments"]);
  cache->causal = values["mode"] == "causal";
  cache->soft = number["soft"];
  cache->item_start = number["item_start"];
  cache->scope = values["scope"];
  return Status::Ok();
}

// With a cache, the program's four cache inputs come out of `inputs` (kept in cache_inputs)
// and the caller's frozen_lengths and user_keys take their place.
Status SplitCacheInputs(Signature* sig) {
  const CacheSpec& cache = sig->cache;
  if (cache.runtime + 4 != sig->inputs.size()) {
    return Invalid("runtime=" + std::to_string(cache.runtime) + " must name the first of the "
                   "last 4 inputs before the tables (the program declares " +
                   std::to_string(sig->inputs.size()) + ")");
  }
  for (size_t i : {cache.tokens, cache.lengths, cache.segments}) {
    if (i >= cache.runtime) return Invalid("an input position lies past the caller's inputs");
  }
  const TensorSpec& tokens = sig->inputs[cache.tokens];
  const TensorSpec& lengths = sig->inputs[cache.lengths];
  const TensorSpec& segments = sig->inputs[cache.segments];
  if (tokens.dtype != ElementType::kInt32 || tokens.dims.size() != 2 ||
      lengths.dtype != ElementType::kInt32 || lengths.dims.size() != 1 ||
      segments.dtype != ElementType::kInt32 || segments.dims.size() != 2) {
    return Invalid("tokens and segments must be int32 [B, L], lengths int32 [B]");
  }
  sig->cache_inputs.assign(sig->inputs.begin() + cache.runtime, sig->inputs.end());
  const auto& c = sig->cache_inputs;
  // The pool's page count (dim 2) is the runtime's: dynamic in the program.
  const std::string pool_dims[] = {std::to_string(cache.layers), "2", "",
                                   std::to_string(cache.page_tokens),
                                   std::to_string(cache.kv_heads),
                                   std::to_string(cache.head_dim)};
  bool pool_ok = c[3].dtype == cache.dtype && c[3].dims.size() == 6;
  for (size_t d = 0; pool_ok && d < 6; ++d) {
    pool_ok = d == 2 ? !IsLiteral(c[3].dims[d]) : c[3].dims[d] == pool_dims[d];
  }
  if (c[0].dtype != ElementType::kInt64 || c[0].dims.size() != 1 ||
      c[1].dtype != ElementType::kInt32 || c[1].dims.size() != 2 ||
      c[2].dtype != ElementType::kInt64 || c[2].dims.size() != 2 || !pool_ok) {
    return Invalid("the cache inputs must be cached_lengths int64 [B], block_table int32 "
                   "[B, P], write_slots int64 [B, S] and the pool [layers, 2, pages, "
                   "page_tokens, kv_heads, head_dim] with the cache's sizes and dtype");
  }
  sig->inputs.resize(cache.runtime);
  const std::string batch = tokens.dims[0];
  sig->inputs.push_back(TensorSpec{ElementType::kInt32, {batch}});
  sig->inputs.push_back(TensorSpec{ElementType::kUInt8, {batch, std::to_string(kUserKeyBytes)}});
  return Status::Ok();
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
    } else if (kind == "cache") {
      Status s = ParseCache(words, &sig.cache);
      if (!s.ok()) return Invalid(where + s.message);
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
  if (sig.cache.enabled) {
    Status s = SplitCacheInputs(&sig);
    if (!s.ok()) return Invalid("package signature cache: " + s.message);
  }
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

int64_t BucketRule::Padded(int64_t real) const {
  if (multiple != 0) return (real + offset + multiple - 1) / multiple * multiple - offset;
  int64_t padded = 1;
  while (padded < real && padded < (int64_t{1} << 62)) padded *= 2;
  return padded;
}

BucketedShapes Signature::Bucket(const std::vector<InputView>& inputs) const {
  BucketedShapes shapes;
  for (const BucketRule& rule : buckets) {
    const std::string& symbol = this->inputs[rule.input].dims[rule.dim];
    const int64_t real = inputs[rule.input].shape[rule.dim];
    int64_t padded = rule.Padded(real);
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
