#include "engine/operate/operator_plan.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "base/random.h"
#include "base/status_macros.h"
#include "model/json_text.h"
#include "model/keys.h"
#include "model/outbox_events.h"
#include "rules/approvals.h"
#include "rules/state_machine.h"
#include "rules/transitions.h"

namespace waystone {
namespace {

// Refuses `action` on `index` unless the forward run stands at it (Frontier: the first
// step not done, or any branch's in a parallel group).
absl::Status AtFrontier(const WorkflowDefinition& definition, const std::vector<StepRecord>& steps,
                        int index, const std::string& action) {
  const std::vector<int> frontier = Frontier(definition, steps);
  if (std::find(frontier.begin(), frontier.end(), index) != frontier.end()) {
    return absl::OkStatus();
  }
  std::string at;
  for (const int blocking : frontier) at += (at.empty() ? "" : ", ") + steps[blocking].name;
  return absl::FailedPreconditionError("step '" + steps[index].name + "' is " +
                                       std::string(ToString(steps[index].state)) +
                                       "; only a step the instance stopped at can be " + action +
                                       (at.empty() ? "" : " ('" + at + "')"));
}

absl::Status Refuse(const std::string& why) { return absl::FailedPreconditionError(why); }

std::string Where(const InstanceRecord& instance) {
  return "instance '" + instance.key + "' is " + std::string(ToString(instance.state));
}

std::string StepWhere(const StepRecord& step) {
  return "step '" + step.name + "' is " + std::string(ToString(step.state));
}

PlannedCall Call(const StepDefinition& def, std::string phase, const RequestSpec& request,
                 std::string key) {
  return {def.name, std::move(phase), request.method, request.url, std::move(key), "", ""};
}

// What a step's call answers when the preview assumes it succeeds: a 200 carrying an
// external id wherever the step records one.
CallResult AssumedSuccess(const StepDefinition& def) {
  CallResult result;
  result.response.outcome.kind = CallOutcome::Kind::kResponse;
  result.response.outcome.status = 200;
  result.response.outcome.sent = true;
  if (!def.result_external_id.empty()) {
    nlohmann::json body = nlohmann::json::object();
    try {
      body[nlohmann::json::json_pointer(def.result_external_id)] = "(its external id)";
    } catch (const nlohmann::json::exception&) {
    }
    result.response.body = JsonText(body);
  }
  return result;
}

// The instance as the preview runs it forward: the rules applied to a copy.
struct Simulation {
  const WorkflowDefinition& definition;
  InstanceRecord instance;
  std::vector<StepRecord> steps;
  Millis now;
  SeededRandom random{0};  // ids and jitter of changes that are never committed
  std::vector<bool> reached = std::vector<bool>(steps.size(), false);

  Facts Now() { return {definition, instance, steps, now, random}; }
  void Apply(const Change& change) {
    for (const StepRecord& step : change.steps) steps[step.index] = step;
    if (change.state) instance.state = *change.state;
    if (change.status_reason) instance.status_reason = *change.status_reason;
  }
};

// Fills would_execute by running Decide and the transitions forward from the planned
// steps, assuming every call succeeds and every awaited event arrives: the preview
// is the rules, so the dry run names what the engine then does, in its order.
void Simulate(Simulation& sim, const StepKeyFn& step_key, ActionPlan& plan) {
  const int limit = 4 * static_cast<int>(sim.steps.size()) + 4;
  for (int turn = 0; turn < limit; ++turn) {
    const NextAction action = Decide(sim.definition, sim.instance, sim.steps, sim.now);
    if (action.kind == NextAction::Kind::kIdle || action.kind == NextAction::Kind::kFinish) return;
    if (action.kind == NextAction::Kind::kWait) {
      sim.now = std::max(sim.now, action.wait_until);
      continue;
    }
    const int index = action.step;
    const StepDefinition& def = sim.definition.steps[index];
    const std::string key = def.request.SideEffecting() ? step_key(index) : "";
    switch (action.kind) {
      case NextAction::Kind::kAwaitEvent:
        sim.reached[index] = true;
        // An approval is assumed approved, like an awaited event assumed to arrive.
        plan.would_execute.push_back({def.name,
                                      def.kind == StepKind::kApproval ? "approval" : "wait", "", "",
                                      "", def.wait_event});
        sim.Apply(EventArrived(sim.Now(), index, "null", "", "assumed"));
        break;
      case NextAction::Kind::kRunStep:
        if (def.kind == StepKind::kWait) {
          sim.Apply(RunWait(sim.Now(), index));  // waits (or its deadline passed)
        } else if (def.kind == StepKind::kApproval &&
                   sim.steps[index].state == StepState::kWaiting) {
          sim.Apply(ApprovalDue(sim.Now(), index));  // a deadline of its request
        } else if (def.kind == StepKind::kApproval) {
          sim.Apply(
              OpenApproval(sim.Now(), index, MaterialOf(def.approval, sim.instance.input_json)));
        } else if (def.kind == StepKind::kTransform) {
          sim.reached[index] = true;
          plan.would_execute.push_back({def.name, "transform", "", "", "", ""});
          sim.Apply(RecordTransform(sim.Now(), index, std::string("{}"), sim.now));
        } else if (def.kind == StepKind::kSql) {
          sim.reached[index] = true;
          plan.would_execute.push_back({def.name, "sql", "", "", "", ""});
          sim.Apply(RecordSql(sim.Now(), index, {}, sim.now));
        } else {
          sim.reached[index] = true;
          plan.would_execute.push_back(Call(def, "call", def.request, key));
          sim.Apply(BeginCall(sim.Now(), index, key, "", "", 0));
          sim.Apply(RecordCall(sim.Now(), sim.steps[index], AssumedSuccess(def)));
        }
        break;
      case NextAction::Kind::kRecoverRunning:
        sim.Apply(RecoverRunning(sim.Now(), index));
        break;
      case NextAction::Kind::kResolveUnknown:
        if (std::optional<Change> settled = ResolveWithoutLookup(sim.Now(), index)) {
          sim.Apply(*settled);  // resubmitted (then called), or paused
          break;
        }
        sim.reached[index] = true;
        plan.would_execute.push_back(Call(def, "lookup", def.lookup->request, ""));
        plan.would_execute.push_back(Call(def, "call_if_not_found", def.request, key));
        sim.Apply(RecordCall(sim.Now(), sim.steps[index], AssumedSuccess(def)));
        break;
      case NextAction::Kind::kCompensate:
        if (def.compensate_sql) {
          sim.reached[index] = true;
          plan.would_execute.push_back({def.name, "compensate_sql", "", "", "", ""});
          sim.Apply(RecordSqlCompensation(sim.Now(), index, {}));
          break;
        }
        if (!def.compensate) return;  // a pinned definition always has it; never guess
        sim.reached[index] = true;
        plan.would_execute.push_back(
            Call(def, "compensate", def.compensate->request, CompensationKey(step_key(index))));
        sim.Apply(BeginCompensation(sim.Now(), index, ""));
        sim.Apply(RecordCompensation(sim.Now(), sim.steps[index], CallResult{}, ""));
        break;
      case NextAction::Kind::kSettleFailure:
        sim.Apply(SettleFailure(sim.Now(), index));
        break;
      case NextAction::Kind::kIdle:
      case NextAction::Kind::kFinish:
      case NextAction::Kind::kWait:
      case NextAction::Kind::kAwaitCalls:  // not reached: nothing is under way here
        return;
    }
  }
}

std::string CompletedWhy(const StepRecord& step) {
  return step.external_id.empty() ? "completed"
                                  : "completed (external id " + step.external_id + ")";
}

// Says why each step the simulation did not reach is left alone, in the order the
// engine goes (reverse while compensating).
void ExplainSkipped(const Simulation& sim, const std::vector<StepRecord>& steps, ActionPlan& plan) {
  const bool compensating = plan.state_after == InstanceState::kCompensating;
  std::string stopped;  // why the steps after the one the run stopped at are not reached
  auto explain = [&](const StepRecord& step) {
    const StepDefinition& def = sim.definition.steps[step.index];
    if (sim.reached[step.index]) return;
    if (!stopped.empty()) {
      plan.would_skip.push_back({step.name, stopped});
      return;
    }
    switch (step.state) {
      case StepState::kCompleted:
        plan.would_skip.push_back({step.name, !compensating ? CompletedWhy(step)
                                              : def.Compensable()
                                                  ? "completed; not reached"
                                                  : "completed; it has no compensation"});
        return;
      case StepState::kSkipped:
        plan.would_skip.push_back({step.name, step.resolution == Resolution::kOperator
                                                  ? "skipped by an operator"
                                                  : "skipped (" + step.error_message + ")"});
        return;
      case StepState::kCompensated:
        if (!compensating) {
          plan.would_skip.push_back({step.name, "stays compensated"});
          stopped = "not reached: an earlier step failed";
          return;
        }
        plan.would_skip.push_back({step.name, "already compensated"});
        return;
      case StepState::kFailed:
      case StepState::kCompensating:
      case StepState::kCompensationFailed:
        if (step.resolution == Resolution::kPassedOver) {
          plan.would_skip.push_back({step.name, "failed; optional, passed over"});
          return;
        }
        if (compensating && step.state != StepState::kCompensationFailed) break;
        plan.would_skip.push_back({step.name, "stays " + std::string(ToString(step.state))});
        stopped = compensating ? "not reached: a compensation failed"
                               : "not reached: an earlier step failed";
        return;
      default:
        break;
    }
    if (compensating) {
      plan.would_skip.push_back(
          {step.name, std::string(ToString(step.state)) + ": nothing to undo"});
    } else {
      // The run pauses here (an unknown outcome only an operator can settle).
      plan.would_skip.push_back({step.name, "stops here: " + sim.instance.status_reason});
      stopped = "not reached: an earlier step stops";
    }
  };
  if (compensating) {
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) explain(*it);
  } else {
    for (const StepRecord& step : steps) explain(step);
  }
}

void Preview(const WorkflowDefinition& definition, const InstanceRecord& instance,
             const std::vector<StepRecord>& steps, Millis now, const StepKeyFn& step_key,
             ActionPlan& plan) {
  if (plan.state_after != InstanceState::kRunning &&
      plan.state_after != InstanceState::kCompensating) {
    for (const StepRecord& step : steps) {
      if (StepDone(definition, step)) continue;
      plan.would_skip.push_back(
          {step.name, "instance " + std::string(ToString(plan.state_after)) + ": nothing runs"});
    }
    return;
  }
  Simulation sim{definition, instance, steps, now};
  sim.instance.state = plan.state_after;
  sim.instance.status_reason = plan.status_reason;
  Simulate(sim, step_key, plan);
  ExplainSkipped(sim, steps, plan);
}

absl::StatusOr<int> FindStep(const WorkflowDefinition& definition, const OperatorRequest& request) {
  if (request.step.empty()) {
    return absl::InvalidArgumentError(std::string(ToString(request.action)) + " needs a step");
  }
  const int index = definition.StepIndex(request.step);
  if (index < 0) {
    return absl::InvalidArgumentError("workflow '" + definition.name + "' has no step '" +
                                      request.step + "'");
  }
  return index;
}

bool ForwardPaused(InstanceState state) {
  return state == InstanceState::kNeedsAttention || state == InstanceState::kFailed ||
         state == InstanceState::kRunning;
}

absl::Status PlanRetry(const WorkflowDefinition& definition, const InstanceRecord& instance,
                       std::vector<StepRecord>& steps, int index, ActionPlan& plan) {
  StepRecord& step = steps[index];
  const StepDefinition& def = definition.steps[index];
  if (step.state == StepState::kCompensationFailed || step.state == StepState::kCompensating) {
    if (instance.state != InstanceState::kNeedsAttention &&
        instance.state != InstanceState::kCompensating) {
      return Refuse(Where(instance) +
                    "; a compensation is retried only while compensating or "
                    "needing attention");
    }
    // Sent again on the operator's word after it failed; one still compensating keeps
    // its mark, so an at-most-once one found under way is not sent blindly.
    if (step.state == StepState::kCompensationFailed) step.error_class = ErrorClass::kNone;
    step.state = StepState::kCompensating;
    step.next_attempt_at = 0;
    plan.state_after = InstanceState::kCompensating;
    return absl::OkStatus();
  }
  if (!ForwardPaused(instance.state)) {
    return Refuse(Where(instance) +
                  "; a step is retried only while the instance is running, "
                  "failed or needs attention");
  }
  WS_RETURN_IF_ERROR(AtFrontier(definition, steps, index, "retried"));
  if (instance.state == InstanceState::kFailed) {
    for (const StepRecord& other : steps) {
      if (other.state == StepState::kCompensated || other.state == StepState::kCompensating) {
        return Refuse(Where(instance) + " after compensating step '" + other.name +
                      "'; it cannot go forward again");
      }
    }
  }
  switch (step.state) {
    case StepState::kFailed:
    case StepState::kPending:
      step.state = StepState::kPending;
      step.next_attempt_at = 0;
      break;
    case StepState::kUnknown:
      if (def.request.SideEffecting() && def.lookup) {
        step.next_attempt_at = 0;  // look it up again
        step.lookups = 0;
      } else if (!def.request.SideEffecting() ||
                 (def.idempotency_honored && def.recovery != RecoveryClass::kManual)) {
        step.state = StepState::kPending;  // a read, or the target deduplicates on the key
        step.next_attempt_at = 0;
      } else {
        return Refuse(StepWhere(step) +
                      " and it has no lookup; confirm whether it happened instead of retrying");
      }
      break;
    default:
      return Refuse(StepWhere(step) + "; only a failed, unknown or waiting step can be retried");
  }
  plan.state_after = InstanceState::kRunning;
  return absl::OkStatus();
}

absl::Status PlanConfirm(const WorkflowDefinition& definition, const InstanceRecord& instance,
                         std::vector<StepRecord>& steps, int index, const OperatorRequest& request,
                         Millis now, ActionPlan& plan) {
  StepRecord& step = steps[index];
  const StepDefinition& def = definition.steps[index];
  if (!request.happened) {
    return absl::InvalidArgumentError("confirm needs \"happened\": true or false");
  }
  // An optional step that failed after an unknown outcome waits for this answer too.
  const bool failed = step.state == StepState::kFailed;
  const bool unknown = step.state == StepState::kUnknown ||
                       (failed && step.error_class == ErrorClass::kUnknown) ||
                       (failed && def.optional && step.unknowns > 0);
  if (!unknown) return Refuse(StepWhere(step) + "; only an unknown outcome can be confirmed");
  if (!ForwardPaused(instance.state)) {
    return Refuse(Where(instance) +
                  "; outcomes are confirmed while it is running, failed or "
                  "needs attention");
  }
  const bool wants_id =
      !def.result_external_id.empty() || (def.lookup && !def.lookup->external_id.empty());
  step.resolution = Resolution::kOperator;
  step.unknown_since = 0;
  step.next_attempt_at = 0;
  if (*request.happened) {
    if (wants_id && request.external_id.empty()) {
      return absl::InvalidArgumentError("step '" + step.name +
                                        "' records an external id: give \"external_id\"");
    }
    MarkCompleted(step, now);  // as when the engine completes a step
    step.external_id = request.external_id.empty() ? step.external_id : request.external_id;
    step.response_json = request.response_json.empty() ? "{}" : request.response_json;
  } else {
    if (!request.external_id.empty()) {
      return absl::InvalidArgumentError("external_id is only for an outcome that happened");
    }
    step.state = StepState::kPending;  // resubmitted under the same idempotency key
  }
  plan.state_after = InstanceState::kRunning;
  return absl::OkStatus();
}

absl::Status PlanCompensate(const WorkflowDefinition& definition, const InstanceRecord& instance,
                            std::vector<StepRecord>& steps, ActionPlan& plan) {
  if (instance.state != InstanceState::kNeedsAttention &&
      instance.state != InstanceState::kFailed && instance.state != InstanceState::kCompleted &&
      instance.state != InstanceState::kRunning) {
    return Refuse(Where(instance) +
                  "; compensation starts from running, needs_attention, "
                  "failed or completed");
  }
  bool any = false;
  for (const StepRecord& step : steps) {
    if (step.state == StepState::kUnknown || step.state == StepState::kRunning) {
      return Refuse(StepWhere(step) + "; confirm its outcome before compensating");
    }
    if (step.state == StepState::kCompensationFailed) {
      return Refuse(StepWhere(step) + "; retry its compensation instead");
    }
    if (step.state == StepState::kCompleted && definition.steps[step.index].Compensable()) {
      any = true;
    }
  }
  if (!any)
    return Refuse("no completed step of instance '" + instance.key + "' has a compensation");
  plan.state_after = InstanceState::kCompensating;
  return absl::OkStatus();
}

absl::Status PlanSkip(const WorkflowDefinition& definition, const InstanceRecord& instance,
                      std::vector<StepRecord>& steps, int index, Millis now, ActionPlan& plan) {
  StepRecord& step = steps[index];
  // A manual step's outcome is the operator's to decide; an optional one's result
  // is not needed for the workflow to go on (one that may have acted waits here).
  if (definition.steps[index].recovery != RecoveryClass::kManual &&
      !definition.steps[index].optional) {
    return Refuse("step '" + step.name + "' is " +
                  std::string(ToString(definition.steps[index].recovery)) +
                  "; only manual and optional steps can be skipped");
  }
  if (!ForwardPaused(instance.state)) {
    return Refuse(Where(instance) +
                  "; a step is skipped while it is running, failed or needs "
                  "attention");
  }
  WS_RETURN_IF_ERROR(AtFrontier(definition, steps, index, "skipped"));
  if (step.state != StepState::kFailed && step.state != StepState::kUnknown &&
      step.state != StepState::kPending) {
    return Refuse(StepWhere(step) + "; only a failed, unknown or pending step can be skipped");
  }
  step.state = StepState::kSkipped;
  step.finished_at = now;
  step.next_attempt_at = 0;
  step.unknown_since = 0;
  step.resolution = Resolution::kOperator;
  plan.state_after = InstanceState::kRunning;
  return absl::OkStatus();
}

}  // namespace

std::string_view ToString(OperatorAction action) {
  switch (action) {
    case OperatorAction::kRetry:
      return "retry";
    case OperatorAction::kConfirm:
      return "confirm";
    case OperatorAction::kCompensate:
      return "compensate";
    case OperatorAction::kSkip:
      return "skip";
    case OperatorAction::kClose:
      return "close";
  }
  return "?";
}

std::optional<OperatorAction> ParseOperatorAction(std::string_view text) {
  for (auto action : {OperatorAction::kRetry, OperatorAction::kConfirm, OperatorAction::kCompensate,
                      OperatorAction::kSkip, OperatorAction::kClose}) {
    if (ToString(action) == text) return action;
  }
  return std::nullopt;
}

bool AuditHoldsBatchAction(const std::vector<AuditRecord>& audit, std::string_view action,
                           std::string_view batch) {
  for (const AuditRecord& record : audit) {
    if (record.action != action) continue;
    const nlohmann::json detail = nlohmann::json::parse(record.detail_json, nullptr, false);
    if (detail.is_object() && detail.value("batch", "") == batch) return true;
  }
  return false;
}

namespace {

// An action on an instance of a code workflow (definition.code): its steps are its
// function's, run again from the top once the instance is released. Retry runs a
// failed step again (or, on a step that completed, the function from the top:
// after a divergence, once the program is fixed); confirm settles an unknown
// outcome (happened: the step's result is the operator's; not happened: it runs
// again); compensate undoes what the function did so far; close ends the case.
absl::StatusOr<ActionPlan> PlanCodeAction(const InstanceRecord& instance,
                                          const std::vector<StepRecord>& steps,
                                          const OperatorRequest& request, Millis now) {
  ActionPlan plan;
  plan.state_before = instance.state;
  const std::string by = " by " + request.actor + ": " + request.reason;
  const bool at_rest =
      instance.state == InstanceState::kNeedsAttention || instance.state == InstanceState::kFailed;
  auto find = [&]() -> absl::StatusOr<StepRecord> {
    // The last step of that name: a function may ask for a name more than once.
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (it->name == request.step) return *it;
    }
    return absl::NotFoundError("instance '" + instance.key + "' has no step '" + request.step +
                               "'");
  };
  switch (request.action) {
    case OperatorAction::kClose:
      if (instance.state == InstanceState::kClosed) return Refuse(Where(instance) + " already");
      plan.state_after = InstanceState::kClosed;
      plan.status_reason = "closed" + by;
      return plan;
    case OperatorAction::kCompensate:
      if (!at_rest && instance.state != InstanceState::kRunning) {
        return Refuse(Where(instance) +
                      "; compensation starts from running, failed or "
                      "needs_attention");
      }
      for (const StepRecord& step : steps) {
        if (step.state == StepState::kUnknown || step.state == StepState::kRunning) {
          return Refuse(StepWhere(step) +
                        ": it may have acted; confirm whether it happened "
                        "before compensating");
        }
      }
      plan.state_after = InstanceState::kCompensating;
      plan.status_reason = "compensation started" + by;
      return plan;
    case OperatorAction::kSkip:
      return Refuse("instance '" + instance.key +
                    "' runs a function: its steps cannot be "
                    "skipped, only retried, confirmed or compensated");
    case OperatorAction::kRetry:
    case OperatorAction::kConfirm:
      break;
  }
  if (!at_rest) {
    return Refuse(Where(instance) +
                  "; an operator retries or confirms a step only while it "
                  "rests (needs_attention or failed)");
  }
  WS_ASSIGN_OR_RETURN(StepRecord step, find());
  const bool unknown = step.state == StepState::kUnknown || step.state == StepState::kRunning;
  // Once a compensation ran, the instance goes on compensating (never forward again).
  const bool undoing = std::any_of(steps.begin(), steps.end(), [](const StepRecord& s) {
    return s.state == StepState::kCompensating || s.state == StepState::kCompensated ||
           s.state == StepState::kCompensationFailed;
  });
  if (request.action == OperatorAction::kRetry) {
    if (unknown) {
      return Refuse(StepWhere(step) +
                    ": it may have acted; confirm whether it happened instead "
                    "of retrying");
    }
    if (step.state == StepState::kCompensationFailed) {
      step.state = StepState::kCompleted;  // its compensation runs again
      step.compensation_attempts = 0;
      step.next_attempt_at = 0;
      step.error_message.clear();
      plan.changed_steps.push_back(step);
      plan.status_reason = "compensation of step '" + request.step + "' retried" + by;
    } else if (step.state == StepState::kFailed) {
      step.error_class = ErrorClass::kTransient;  // runs again when the function reaches it
      step.attempts = 0;                          // with its retries by class afresh
      step.unknowns = 0;
      step.lookups = 0;
      step.next_attempt_at = 0;
      plan.changed_steps.push_back(step);
      plan.status_reason = "step '" + request.step + "' retried" + by;
    } else {
      plan.status_reason = "function run again from the top at step '" + request.step + "'" + by;
    }
    plan.state_after = undoing ? InstanceState::kCompensating : InstanceState::kRunning;
    return plan;
  }
  if (!request.happened) {
    return absl::InvalidArgumentError("confirm needs \"happened\": true or false");
  }
  if (!unknown) return Refuse(StepWhere(step) + ": only an unknown outcome is confirmed");
  if (*request.happened) {
    if (request.response_json.empty()) {
      return absl::InvalidArgumentError(
          "confirming that step '" + request.step +
          "' of a function happened needs its "
          "result (\"response\"): what the step would have returned, as JSON");
    }
    step.state = StepState::kCompleted;
    step.response_json = request.response_json;
    step.external_id = request.external_id;
    step.finished_at = now;
  } else {
    if (!request.external_id.empty()) {
      return absl::InvalidArgumentError("external_id is only for an outcome that happened");
    }
    step.state = StepState::kFailed;  // it did not act: it runs again
    step.error_class = ErrorClass::kTransient;
    step.attempts = 0;
    step.unknowns = 0;
    step.lookups = 0;
    step.next_attempt_at = 0;
  }
  step.resolution = Resolution::kOperator;
  step.unknown_since = 0;
  plan.changed_steps.push_back(step);
  plan.state_after = undoing ? InstanceState::kCompensating : InstanceState::kRunning;
  plan.status_reason = "outcome of step '" + request.step + "' confirmed as " +
                       (*request.happened ? "happened" : "not happened") + by;
  return plan;
}

}  // namespace

absl::StatusOr<ActionPlan> PlanOperatorAction(const WorkflowDefinition& definition,
                                              const InstanceRecord& instance,
                                              const std::vector<StepRecord>& steps,
                                              const OperatorRequest& request, Millis now,
                                              const StepKeyFn& step_key) {
  if (request.reason.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("a reason is required");
  }
  if (request.reason.size() > 2000) {
    return absl::InvalidArgumentError("reason is longer than 2000 characters");
  }
  if (definition.code) return PlanCodeAction(instance, steps, request, now);
  if (steps.size() != definition.steps.size()) {
    return absl::DataLossError("instance '" + instance.key + "' does not match its definition");
  }
  ActionPlan plan;
  plan.state_before = instance.state;
  std::vector<StepRecord> after = steps;
  const std::string by = " by " + request.actor + ": " + request.reason;
  switch (request.action) {
    case OperatorAction::kRetry: {
      auto index = FindStep(definition, request);
      if (!index.ok()) return index.status();
      if (auto s = PlanRetry(definition, instance, after, *index, plan); !s.ok()) return s;
      plan.status_reason = "step '" + request.step + "' retried" + by;
      break;
    }
    case OperatorAction::kConfirm: {
      auto index = FindStep(definition, request);
      if (!index.ok()) return index.status();
      if (auto s = PlanConfirm(definition, instance, after, *index, request, now, plan); !s.ok())
        return s;
      plan.status_reason = "outcome of step '" + request.step + "' confirmed as " +
                           (*request.happened ? "happened" : "not happened") + by;
      break;
    }
    case OperatorAction::kCompensate:
      if (auto s = PlanCompensate(definition, instance, after, plan); !s.ok()) return s;
      plan.status_reason = "compensation started" + by;
      break;
    case OperatorAction::kSkip: {
      auto index = FindStep(definition, request);
      if (!index.ok()) return index.status();
      if (auto s = PlanSkip(definition, instance, after, *index, now, plan); !s.ok()) return s;
      plan.status_reason = "step '" + request.step + "' skipped" + by;
      break;
    }
    case OperatorAction::kClose:
      if (instance.state == InstanceState::kClosed) return Refuse(Where(instance) + " already");
      plan.state_after = InstanceState::kClosed;
      plan.status_reason = "closed" + by;
      break;
  }
  if (plan.state_after == InstanceState::kRunning) {
    // A branch beside the settled step failed for good while it was unknown: with
    // that settled, the failure's consequence follows (compensate, or an operator).
    for (const int index : Frontier(definition, after)) {
      if (after[index].state != StepState::kFailed) continue;
      plan.state_after = StateAfterFailure(definition, after, index);
      plan.status_reason += "; step '" + after[index].name + "' had failed";
      break;
    }
  }
  for (size_t i = 0; i < after.size(); ++i) {
    if (!(after[i].state == steps[i].state &&
          after[i].next_attempt_at == steps[i].next_attempt_at &&
          after[i].resolution == steps[i].resolution && after[i].lookups == steps[i].lookups &&
          after[i].external_id == steps[i].external_id)) {
      plan.changed_steps.push_back(after[i]);
    }
  }
  Preview(definition, instance, after, now, step_key, plan);
  return plan;
}

Change ActionChange(const InstanceRecord& instance, const ActionPlan& plan,
                    const OperatorRequest& request, Millis now, Random& random) {
  Change change;
  change.now = now;
  change.state = plan.state_after;
  change.status_reason = plan.status_reason;
  change.next_run_at = now;  // released to run now
  change.steps = plan.changed_steps;
  change.resolve_alerts = true;
  nlohmann::json detail = {{"step", request.step},
                           {"state_before", ToString(plan.state_before)},
                           {"state_after", ToString(plan.state_after)}};
  if (request.happened) detail["happened"] = *request.happened;
  if (!request.external_id.empty()) detail["external_id"] = request.external_id;
  if (!request.batch.empty()) detail["batch"] = request.batch;
  change.audits.push_back({0, now, request.actor, instance.tenant, instance.id,
                           std::string(ToString(request.action)), request.reason,
                           JsonText(detail)});
  const StepRecord* about = nullptr;
  for (const StepRecord& step : plan.changed_steps) {
    if (step.name == request.step) about = &step;
  }
  change.events.push_back(MakeEvent("waystone.operator." + std::string(ToString(request.action)),
                                    instance, about, request.reason, random, now));
  if (plan.state_after != plan.state_before) {
    change.events.push_back(
        MakeEvent("waystone.instance." + std::string(ToString(plan.state_after)), instance, nullptr,
                  plan.status_reason, random, now));
  }
  return change;
}

}  // namespace waystone
