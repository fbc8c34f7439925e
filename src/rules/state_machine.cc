#include "rules/state_machine.h"

#include <algorithm>

namespace waystone {
namespace {

NextAction Due(NextAction::Kind kind, int step, Millis next_attempt_at, Millis now) {
  if (next_attempt_at > now) return {NextAction::Kind::kWait, step, next_attempt_at};
  return {kind, step, 0};
}

// What the forward run does next for one step that is not done.
NextAction DecideStep(const StepRecord& step, Millis now) {
  switch (step.state) {
    case StepState::kCompleted:
    case StepState::kSkipped:
      return {NextAction::Kind::kIdle, step.index, 0};  // not reached: done
    case StepState::kPending:
      return Due(NextAction::Kind::kRunStep, step.index, step.next_attempt_at, now);
    case StepState::kRunning:
      return {NextAction::Kind::kRecoverRunning, step.index, 0};
    case StepState::kUnknown:
      return Due(NextAction::Kind::kResolveUnknown, step.index, step.next_attempt_at, now);
    case StepState::kWaiting:
      if (step.next_attempt_at != 0 && step.next_attempt_at <= now) {
        return {NextAction::Kind::kRunStep, step.index, 0};  // its deadline passed
      }
      return {NextAction::Kind::kAwaitEvent, step.index, step.next_attempt_at};
    case StepState::kFailed:
    case StepState::kCompensating:
    case StepState::kCompensated:
    case StepState::kCompensationFailed:
      // A failed step (unless optional) moves the instance out of `running` in the
      // same commit; reaching one here means an operator must look.
      return {NextAction::Kind::kIdle, step.index, 0};
  }
  return {NextAction::Kind::kIdle, step.index, 0};
}

// Of the branches' next actions, in step order: an operator's look first, then a step
// found running, then whatever is due now; otherwise the earliest wake-up (an event
// awaited, or a retry's time), so a branch that waits never holds the others.
NextAction DecideGroup(const std::vector<NextAction>& actions) {
  for (const NextAction& a : actions) {
    if (a.kind == NextAction::Kind::kIdle) return a;
  }
  for (const NextAction& a : actions) {
    if (a.kind == NextAction::Kind::kRecoverRunning) return a;
  }
  for (const NextAction& a : actions) {
    if (a.kind == NextAction::Kind::kRunStep || a.kind == NextAction::Kind::kResolveUnknown) {
      return a;
    }
  }
  const NextAction* awaiting = nullptr;
  Millis earliest = 0;  // 0: none
  for (const NextAction& a : actions) {
    if (a.kind == NextAction::Kind::kAwaitEvent && awaiting == nullptr) awaiting = &a;
    if (a.wait_until != 0 && (earliest == 0 || a.wait_until < earliest)) earliest = a.wait_until;
  }
  if (awaiting != nullptr) return {NextAction::Kind::kAwaitEvent, awaiting->step, earliest};
  return {NextAction::Kind::kWait, actions.front().step, earliest};
}

bool Contains(const std::vector<int>& list, int value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

NextAction DecideForward(const WorkflowDefinition& definition, const std::vector<StepRecord>& steps,
                         Millis now, const std::vector<int>& busy) {
  const std::vector<int> frontier = Frontier(definition, steps);
  if (frontier.empty()) return {NextAction::Kind::kFinish, -1, 0, InstanceState::kCompleted};
  std::vector<NextAction> actions;
  for (const int index : frontier) {
    if (Contains(busy, index)) continue;
    if (steps[index].state == StepState::kFailed) {
      // Failed beside a call under way: its outcome first; then the failure's course.
      if (!busy.empty()) return {NextAction::Kind::kAwaitCalls, index, 0};
      return {NextAction::Kind::kSettleFailure, index, 0};
    }
    actions.push_back(DecideStep(steps[index], now));
  }
  if (actions.empty()) return {NextAction::Kind::kAwaitCalls, busy.front(), 0};
  return actions.size() == 1 ? actions.front() : DecideGroup(actions);
}

NextAction DecideCompensation(const WorkflowDefinition& definition,
                              const std::vector<StepRecord>& steps, Millis now) {
  bool compensated_any = false;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const StepRecord& step = *it;
    const bool has_compensation = step.index < static_cast<int>(definition.steps.size()) &&
                                  definition.steps[step.index].Compensable();
    switch (step.state) {
      case StepState::kCompensating:
        return Due(NextAction::Kind::kCompensate, step.index, step.next_attempt_at, now);
      case StepState::kCompleted:
        if (has_compensation) {
          return Due(NextAction::Kind::kCompensate, step.index, step.next_attempt_at, now);
        }
        break;
      case StepState::kCompensationFailed:
        return {NextAction::Kind::kIdle, step.index, 0};
      case StepState::kCompensated:
        compensated_any = true;
        break;
      case StepState::kPending:
      case StepState::kRunning:
      case StepState::kUnknown:
      case StepState::kFailed:
      case StepState::kSkipped:
      case StepState::kWaiting:
        break;
    }
  }
  return {NextAction::Kind::kFinish, -1, 0,
          compensated_any ? InstanceState::kCompensated : InstanceState::kFailed};
}

}  // namespace

NextAction Decide(const WorkflowDefinition& definition, const InstanceRecord& instance,
                  const std::vector<StepRecord>& steps, Millis now, const std::vector<int>& busy) {
  switch (instance.state) {
    case InstanceState::kRunning:
      return DecideForward(definition, steps, now, busy);
    case InstanceState::kCompensating:
      // One compensation at a time, in reverse order.
      if (!busy.empty()) return {NextAction::Kind::kAwaitCalls, busy.front(), 0};
      return DecideCompensation(definition, steps, now);
    case InstanceState::kCompleted:
    case InstanceState::kCompensated:
    case InstanceState::kFailed:
    case InstanceState::kNeedsAttention:
    case InstanceState::kClosed:
      return {NextAction::Kind::kIdle, -1, 0};
  }
  return {NextAction::Kind::kIdle, -1, 0};
}

std::vector<int> Frontier(const WorkflowDefinition& definition,
                          const std::vector<StepRecord>& steps) {
  std::vector<int> frontier;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (StepDone(definition, steps[i])) continue;
    frontier.push_back(static_cast<int>(i));
    const std::string& group = definition.steps[i].group;
    if (group.empty()) return frontier;
    // Every branch of the group stands at its first step not done.
    std::vector<int> branches = {definition.steps[i].branch};
    for (size_t j = i + 1; j < steps.size() && definition.steps[j].group == group; ++j) {
      const int branch = definition.steps[j].branch;
      if (StepDone(definition, steps[j]) ||
          std::find(branches.begin(), branches.end(), branch) != branches.end()) {
        continue;
      }
      branches.push_back(branch);
      frontier.push_back(static_cast<int>(j));
    }
    return frontier;
  }
  return frontier;
}

bool StepDone(const WorkflowDefinition& /*definition*/, const StepRecord& step) {
  if (step.state == StepState::kCompleted || step.state == StepState::kSkipped) return true;
  return step.state == StepState::kFailed && step.resolution == Resolution::kPassedOver;
}

InstanceState StateAfterFailure(const WorkflowDefinition& definition,
                                const std::vector<StepRecord>& steps, int failed_step,
                                const std::vector<int>& busy) {
  for (const StepRecord& step : steps) {
    // A manual step failed (this one, or a branch beside it that failed before): an
    // operator decides.
    if ((step.index == failed_step ||
         (step.state == StepState::kFailed && step.resolution != Resolution::kPassedOver)) &&
        definition.steps[step.index].recovery == RecoveryClass::kManual) {
      return InstanceState::kNeedsAttention;
    }
  }
  // `on_failure: pause`: nothing before it is undone; an operator decides (after an
  // approval, its decision is not compensated away).
  if (definition.steps[failed_step].pause_on_failure) return InstanceState::kNeedsAttention;
  for (const int index : busy) {
    if (index != failed_step) return InstanceState::kRunning;  // its outcome comes first
  }
  for (const StepRecord& step : steps) {
    // A branch beside it whose call may have acted: settled by an operator before
    // anything is undone (a compensation would pass it over).
    if (step.index != failed_step &&
        (step.state == StepState::kUnknown || step.state == StepState::kRunning)) {
      return InstanceState::kNeedsAttention;
    }
  }
  for (const StepRecord& step : steps) {
    // Steps of branches beside it may have completed after it in step order.
    if (step.index != failed_step && step.state == StepState::kCompleted &&
        definition.steps[step.index].Compensable()) {
      return InstanceState::kCompensating;
    }
  }
  return InstanceState::kFailed;
}

}  // namespace waystone
