// The rule of a `transform` step: its output (or why there is none) completes or
// fails it. Declared in transitions.h.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "rules/transition_parts.h"
#include "rules/transitions.h"

namespace waystone {

namespace {
using Json = nlohmann::json;
}  // namespace

Change RecordTransform(const Facts& facts, int index, const absl::StatusOr<std::string>& output,
                       Millis started_at) {
  StepRecord step = facts.steps[index];
  step.attempts += 1;
  if (!output.ok()) {
    return FailStep(facts, step, ErrorClass::kRejected, std::string(output.status().message()),
                    std::nullopt);
  }
  Change change = At(facts);
  MarkCompleted(step, facts.now);
  step.response_json = *output;
  step.started_at = started_at;
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.completed", &step);
  return change;
}

}  // namespace waystone
