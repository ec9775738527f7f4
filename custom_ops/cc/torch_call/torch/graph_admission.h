// Which shape buckets keep a CUDA graph: frequency-aware admission over a fixed budget.
//
// A capture costs its call an eager warm-up run plus the capture, several replays' time; an
// eager run costs one. Least-recently-used replacement captures every new shape and drops the
// graph used longest ago, so traffic that makes more shapes than the budget (histories of many
// lengths, batches of many sizes) captures on most calls and drops the graphs that serve the
// most. Here each shape's recent sightings are counted (halved every `window` sightings, so
// the counts follow the traffic: the idea of TinyLFU), and once the budget is full a shape is
// captured only when it has been seen again and more often than the held graph it would
// replace (the least often seen, the least recently used among equals); the others run
// eagerly. While
// the budget has room every new shape is captured, so a warm-up fills it as before.
//
// Plain bookkeeping without CUDA or torch, so it is tested on any machine.
#ifndef XGR_CUSTOM_OPS_TORCH_CALL_TORCH_GRAPH_ADMISSION_H_
#define XGR_CUSTOM_OPS_TORCH_CALL_TORCH_GRAPH_ADMISSION_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace xgr {
namespace torch_call {

class GraphAdmission {
 public:
  enum class Action { kReplay, kCapture, kEager };
  struct Decision {
    Action action;
    std::string evict;  // a held shape whose graph goes before the capture; empty: room left
  };

  // `max_graphs` (at least 1) graphs at most; `window` sightings between halvings (0: 16 per
  // graph, at least 256).
  explicit GraphAdmission(int max_graphs, int64_t window = 0);

  // Counts one sighting of `key` and says what its call does. A kCapture's `evict` has left
  // the held set already; `key` joins it when `Held(key)` reports the capture done.
  Decision See(const std::string& key);
  void Held(const std::string& key);

  int held() const { return static_cast<int>(held_.size()); }
  int max_graphs() const { return max_graphs_; }
  // Shapes with a count or a graph: bounded by about twice the window plus the budget.
  size_t tracked() const { return shapes_.size(); }

 private:
  struct Shape {
    int64_t count = 0;
    int64_t last = 0;  // the tick of its latest sighting
  };

  void Age();

  int max_graphs_;
  int64_t window_;
  int64_t tick_ = 0;
  std::unordered_map<std::string, Shape> shapes_;
  // The shapes with a graph: a victim is sought among these alone (at most max_graphs).
  std::unordered_set<std::string> held_;
};

}  // namespace torch_call
}  // namespace xgr

#endif  // XGR_CUSTOM_OPS_TORCH_CALL_TORCH_GRAPH_ADMISSION_H_
