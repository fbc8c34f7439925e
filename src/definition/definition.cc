#include "definition/definition.h"

namespace waystone {

bool RequestSpec::SideEffecting() const {
  return !(method == "GET" || method == "HEAD" || method == "OPTIONS");
}

int WorkflowDefinition::StepIndex(std::string_view step_name) const {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].name == step_name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace waystone
