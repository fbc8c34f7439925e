// The rules of a `wait` step: it waits for its event (or its timeout), and the event
// that arrives completes it. Declared in transitions.h.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/duration.h"
#include "rules/transition_parts.h"
#include "rules/transitions.h"

namespace waystone {

namespace {
using Json = nlohmann::json;
}  // namespace

Change RunWait(const Facts& facts, int index) {
  const StepDefinition& def = facts.definition.steps[index];
  StepRecord step = facts.steps[index];
  if (step.state == StepState::kWaiting) {
    step.attempts += 1;
    return FailStep(facts, step, ErrorClass::kRejected,
                    "no event of type '" + def.wait_event + "' arrived within " +
                        FormatDuration(def.wait_timeout),
                    std::nullopt);
  }
  Change change = At(facts);
  step.state = StepState::kWaiting;
  step.started_at = facts.now;
  step.next_attempt_at = def.wait_timeout > 0 ? facts.now + def.wait_timeout : 0;
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.waiting", &step, "waiting for event " + def.wait_event);
  return change;
}

Change EventArrived(const Facts& facts, int index, const std::string& data_json,
                    const std::string& event_id, const std::string& event) {
  StepRecord step = facts.steps[index];
  Change change = At(facts);
  step.attempts += 1;
  // What the workflow reads of the event's data, like any answer (store_response).
  step.response_json =
      KeptAnswer(Json::parse(data_json.empty() ? "null" : data_json, nullptr, false),
                 facts.definition.steps[index]);
  step.external_id = event_id;
  if (step.started_at == 0) step.started_at = facts.now;
  MarkCompleted(step, facts.now);
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.completed", &step, event);
  return change;
}

}  // namespace waystone
