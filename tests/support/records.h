#pragma once

// Checkpoint records for the pure engine tests: steps named a, b, c, ... in order.

#include <initializer_list>
#include <string>
#include <vector>

#include "store/store.h"

namespace waystone::testing {

inline std::vector<StepRecord> Steps(std::initializer_list<StepState> states) {
  std::vector<StepRecord> steps;
  int i = 0;
  for (StepState state : states) {
    StepRecord s;
    s.index = i;
    s.name = std::string(1, static_cast<char>('a' + i));
    s.state = state;
    steps.push_back(s);
    ++i;
  }
  return steps;
}

// An instance with business key "k" in `state`.
inline InstanceRecord Instance(InstanceState state) {
  InstanceRecord r;
  r.key = "k";
  r.state = state;
  return r;
}

}  // namespace waystone::testing
