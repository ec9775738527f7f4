// Frequency-aware admission of shapes to a CUDA graph budget (see graph_admission.h).
#include "custom_ops/cc/torch_call/torch/graph_admission.h"

#include <algorithm>

namespace xgr {
namespace torch_call {

GraphAdmission::GraphAdmission(int max_graphs, int64_t window)
    : max_graphs_(std::max(1, max_graphs)),
      window_(window > 0 ? window : std::max<int64_t>(256, 16 * int64_t{max_graphs_})) {}

GraphAdmission::Decision GraphAdmission::See(const std::string& key) {
  ++tick_;
  Shape& shape = shapes_[key];
  ++shape.count;
  shape.last = tick_;
  Decision decision{Action::kEager, ""};
  if (held_.count(key)) {
    decision.action = Action::kReplay;
  } else if (held() < max_graphs_) {
    decision.action = Action::kCapture;
  } else {
    // The held graph least often seen, the least recently used among equals.
    const std::string* victim = nullptr;
    const Shape* weakest = nullptr;
    for (const std::string& held_key : held_) {
      const Shape& candidate = shapes_.at(held_key);
      if (weakest == nullptr || candidate.count < weakest->count ||
          (candidate.count == weakest->count && candidate.last < weakest->last)) {
        victim = &held_key;
        weakest = &candidate;
      }
    }
    // A first sighting never displaces a graph (most shapes of a long tail come once), and
    // an incumbent keeps its graph on a tie.
    if (shape.count >= 2 && shape.count > weakest->count) {
      decision = {Action::kCapture, *victim};
      held_.erase(decision.evict);
    }
  }
  if (tick_ % window_ == 0) Age();
  return decision;
}

void GraphAdmission::Held(const std::string& key) {
  Shape& shape = shapes_[key];
  shape.count = std::max<int64_t>(shape.count, 1);
  held_.insert(key);
}

void GraphAdmission::Age() {
  for (auto it = shapes_.begin(); it != shapes_.end();) {
    it->second.count /= 2;
    if (it->second.count == 0 && !held_.count(it->first)) {
      it = shapes_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace torch_call
}  // namespace xgr
