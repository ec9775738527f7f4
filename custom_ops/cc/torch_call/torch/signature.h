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
//   bucket 0 0 pow2           (the call runs at a bucketed shape: input 0's dim 0 rounds up to
//   bucket 0 1 multiple 256 offset 2   a power of two, or (size + offset) up to a multiple,
//                             minus offset; clamped to the symbol's range. Outputs of that
//                             symbol are cut back to the real size.)
//   pad 1 1                   (input 1's padding value; 0 where not named. Padding rows and
//                             columns must be inputs that break no rule and whose results the
//                             program keeps apart from the real ones.)
//   graphs 16                 (on CUDA, capture each bucket's run as a CUDA graph and replay
//                             it; at most 16 graphs kept, least recently used dropped)
//   table catalog.path_items  (the last inputs, one line each in order, are tables: fixed
//                             sizes, loaded once from a tables file beside the package
//                             (tables.h) and passed on every run; callers send the others)
//   cache runtime=5 page_tokens=16 layers=24 kv_heads=2 head_dim=64 dtype=bfloat16
//         tokens=0 lengths=1 segments=2 mode=item_causal soft=151667 item_start=151666
//         scope=HEX           (one line: the runtime keeps a prompt-KV cache for the package,
//                             prompt_cache.h. The program's inputs from `runtime` on, before
//                             the tables, are the cache's: cached_lengths int64 [B],
//                             block_table int32 [B, P], write_slots int64 [B, S] and the pool
//                             [layers, 2, pages, page_tokens, kv_heads, head_dim]; in their
//                             place callers send frozen_lengths int32 [B] and user_keys uint8
//                             [B, 8] (all zero: no key). tokens/lengths/segments: the
//                             positions of those caller inputs; mode: the mask rule (causal
//                             segments are counted from item_start tokens); soft: the SOFT
//                             marker a frozen part may not cover (-1: none); scope: the model,
//                             layout and mask the entries belong to)
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

// How one symbol's size rounds up (see `bucket` above).
struct BucketRule {
  size_t input = 0;
  size_t dim = 0;
  int64_t multiple = 0;  // 0: the next power of two
  int64_t offset = 0;

  // `real` rounded up as this rule buckets it (before any range clamps it).
  int64_t Padded(int64_t real) const;
};

// A call's sizes after bucketing: the padded shape of every input, and each bucketed symbol's
// real and padded size (the outputs are cut back along the symbols that grew).
struct BucketedShapes {
  std::vector<std::vector<int64_t>> inputs;
  std::map<std::string, std::pair<int64_t, int64_t>> symbols;  // name -> (real, padded)
  bool padded = false;  // some size grew
};

// The prompt cache a package's runtime keeps (the `cache` line).
struct CacheSpec {
  bool enabled = false;
  size_t runtime = 0;  // the program's first cache input (= the caller's frozen_lengths)
  int64_t page_tokens = 16, layers = 0, kv_heads = 0, head_dim = 0;
  ElementType dtype = ElementType::kFloat32;
  size_t tokens = 0, lengths = 1, segments = 2;
  bool causal = false;
  int64_t soft = -1, item_start = -1;
  std::string scope;

  size_t frozen_input() const { return runtime; }
  size_t keys_input() const { return runtime + 1; }
};

// Bytes of a user key as callers send it (user_keys [B, kUserKeyBytes]).
constexpr int64_t kUserKeyBytes = 8;

struct Signature {
  std::string device = "cpu";
  std::vector<TensorSpec> inputs;   // what callers send (the tables excluded)
  std::vector<TensorSpec> outputs;
  std::vector<std::pair<std::string, TensorSpec>> tables;  // after the inputs, in order
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  std::vector<ValueRule> rules;
  std::vector<BucketRule> buckets;
  std::vector<double> pads;  // per input (0 where not named)
  int max_graphs = 0;        // 0: no CUDA graphs
  CacheSpec cache;
  // With a cache: the program's cache inputs (cached_lengths, block_table, write_slots,
  // pool), which the runtime makes; `inputs` then ends with frozen_lengths and user_keys.
  std::vector<TensorSpec> cache_inputs;

  // Parses the text form; errors name the offending line.
  static Status Parse(const std::string& text, Signature* out);
  // Checks count, dtype, rank, literal sizes, shared symbols and their ranges.
  Status CheckInputs(const std::vector<InputView>& inputs) const;
  // Checks the value rules on the host buffers (after CheckInputs): InvalidArgument naming
  // the input, the rule and the first row that breaks it.
  Status CheckValues(const std::vector<InputView>& inputs) const;
  // The bucketed shapes of a call whose inputs passed CheckInputs.
  BucketedShapes Bucket(const std::vector<InputView>& inputs) const;
  // The output's shape cut back to the real sizes of the bucketed symbols.
  std::vector<int64_t> RealOutputShape(size_t output, const std::vector<int64_t>& padded,
                                       const BucketedShapes& shapes) const;
  std::string Describe() const;
};

Status ParseElementType(const std::string& name, ElementType* out);

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_SIGNATURE_H_
