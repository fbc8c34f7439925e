// The rules of a `sql` step: its statement, run in the commit that records it,
// completes it (or fails it) and undoes it as its compensation. Declared in
// transitions.h.

#include <string>

#include <nlohmann/json.hpp>

#include "rules/transition_parts.h"
#include "rules/transitions.h"

namespace waystone {

namespace {
using Json = nlohmann::json;
}  // namespace

Change RecordSql(const Facts& facts, int index, BusinessStatement statement, Millis started_at) {
  StepRecord step = facts.steps[index];
  step.attempts += 1;
  Change change = At(facts);
  MarkCompleted(step, facts.now);
  step.started_at = started_at;
  change.steps.push_back(step);
  statement.step_index = index;
  statement.records_result = true;
  change.statements.push_back(std::move(statement));
  AddEvent(facts, change, "waystone.step.completed", &step);
  return change;
}

Change RecordSqlCompensation(const Facts& facts, int index, BusinessStatement statement) {
  StepRecord step = facts.steps[index];
  Change change = At(facts);
  step.state = StepState::kCompensated;
  step.compensation_attempts += 1;
  step.error_class = ErrorClass::kNone;
  step.error_message.clear();
  step.next_attempt_at = 0;
  change.steps.push_back(step);
  statement.step_index = index;
  statement.records_result = false;
  change.statements.push_back(std::move(statement));
  change.audits.push_back(
      EngineAudit(facts, step, "", "compensated", "compensate.sql committed with the checkpoint"));
  AddEvent(facts, change, "waystone.step.compensated", &step);
  return change;
}

}  // namespace waystone
