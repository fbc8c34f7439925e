#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/random.h"
#include "model/definition.h"
#include "store/store.h"

namespace waystone {

// What an operator can do to one instance. Each needs a reason and is audited.
enum class OperatorAction : uint8_t {
  kRetry = 1,       // retry one step now
  kConfirm = 2,     // settle an unknown outcome: it happened (with the external id) or not
  kCompensate = 3,  // undo the completed steps that have a compensation
  kSkip = 4,        // skip a manual step
  kClose = 5,       // close the case; nothing runs afterwards
};

std::string_view ToString(OperatorAction action);
std::optional<OperatorAction> ParseOperatorAction(std::string_view text);

// Whether `audit` (one instance's) holds `action` applied by batch `batch`: the
// detail PlanOperatorAction's change records names the batch.
bool AuditHoldsBatchAction(const std::vector<AuditRecord>& audit, std::string_view action,
                           std::string_view batch);

struct OperatorRequest {
  OperatorAction action = OperatorAction::kClose;
  std::string step;              // retry, confirm, skip
  std::string reason;            // mandatory
  std::string actor;             // who: the token's name
  std::optional<bool> happened;  // confirm: required
  std::string external_id;       // confirm with happened = true
  std::string response_json;     // confirm with happened = true: the step's result; "{}"
  bool dry_run = false;
  std::string batch;  // the batch's public id when a batch applies it (audited)
};

// One external call (or transform) the engine would make after the action.
struct PlannedCall {
  std::string step;
  // call | lookup | call_if_not_found | compensate | transform | wait | sql | compensate_sql
  std::string phase;
  std::string method;
  std::string url;              // the URL template: secrets are never rendered here
  std::string idempotency_key;  // empty for reads and transforms
  std::string event;            // phase wait: the event type it waits for
  // The URL as it would be sent, when everything it names is known now and it
  // names no secret (Operations fills it in; the plan itself does no rendering).
  std::string rendered_url;
  bool operator==(const PlannedCall&) const = default;
};

struct SkippedStep {
  std::string step;
  std::string why;
};

// An allowed action, planned: what changes now and what the engine does next.
struct ActionPlan {
  InstanceState state_before = InstanceState::kRunning;
  InstanceState state_after = InstanceState::kRunning;
  std::string status_reason;
  std::vector<StepRecord> changed_steps;
  std::vector<PlannedCall> would_execute;  // in order, assuming each succeeds
  std::vector<SkippedStep> would_skip;
};

// Returns a step's idempotency key: stored, rendered from its template, or the default.
using StepKeyFn = std::function<std::string(int step_index)>;

// Checks that `request` is allowed in the instance's current state and plans it.
// Pure: no I/O. FailedPrecondition (naming the state that refuses it) when not
// allowed; InvalidArgument for a malformed request.
absl::StatusOr<ActionPlan> PlanOperatorAction(const WorkflowDefinition& definition,
                                              const InstanceRecord& instance,
                                              const std::vector<StepRecord>& steps,
                                              const OperatorRequest& request, Millis now,
                                              const StepKeyFn& step_key);

// Returns the change that applies an allowed `plan` at `now` (the runner's lease is the
// caller's to add): the planned steps, the new state released to run now, the
// instance's alerts resolved, the audit record and the operator's events. Pure.
Change ActionChange(const InstanceRecord& instance, const ActionPlan& plan,
                    const OperatorRequest& request, Millis now, Random& random);

}  // namespace waystone
