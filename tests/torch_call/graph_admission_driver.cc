// Drives GraphAdmission from a trace: `driver MAX_GRAPHS WINDOW` reads one shape key a line and
// writes what each call does ("replay", "eager", "capture" or "capture VICTIM"), reporting
// every capture done, then "held N tracked M". Built and run by test_graph_admission.py.
#include <iostream>
#include <string>

#include "custom_ops/cc/torch_call/torch/graph_admission.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " MAX_GRAPHS WINDOW < keys\n";
    return 2;
  }
  xgr::torch_call::GraphAdmission admission(std::stoi(argv[1]), std::stoll(argv[2]));
  using Action = xgr::torch_call::GraphAdmission::Action;
  std::string key;
  while (std::getline(std::cin, key)) {
    const auto decision = admission.See(key);
    if (decision.action == Action::kReplay) {
      std::cout << "replay\n";
    } else if (decision.action == Action::kEager) {
      std::cout << "eager\n";
    } else {
      admission.Held(key);
      std::cout << "capture" << (decision.evict.empty() ? "" : " " + decision.evict) << "\n";
    }
  }
  std::cout << "held " << admission.held() << " tracked " << admission.tracked() << "\n";
  return 0;
}
