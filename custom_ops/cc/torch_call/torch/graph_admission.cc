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
  if (shape.held) {
    decision.action = Action::kReplay;
  } else if (held_ < max_graphs_) {
    decision.action = Action::kCapture;
  } else {
    // The held graph least often seen, the least recently used among equals.
    auto victim = shapes_.end();
    for (auto it = shapes_.begin(); it != shapes_.end(); ++it) {
      if (!it->second.held) continue;
      if (victim == shapes_.end() || it->second.count < victim->second.count ||
          (it->second.count == victim->second.count && it->second.last < victim->second.last)) {
        victim = it;
      }
    }
    // A first sighting never displaces a graph (most shapes of a long tail come once), and
    // an incumbent keeps its graph on a tie.
    if (shape.count >= 2 && shape.count > victim->second.count) {
      decision = {Action::kCapture, victim->first};
      victim->second.held = false;
      --held_;
    }
  }
  if (tick_ % window_ == 0) Age();
  return decision;
}

void GraphAdmission::Held(const std::string& key) {
  Shape& shape = shapes_[key];
  shape.count = std::max<int64_t>(shape.count, 1);
  if (!shape.held) {
    shape.held = true;
    ++held_;
  }
}

void GraphAdmission::Age() {
  for (auto it = shapes_.begin(); it != shapes_.end();) {
    it->second.count /= 2;
    if (it->second.count == 0 && !it->second.held) {
      it = shapes_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace torch_call
}  // namespace xgr
