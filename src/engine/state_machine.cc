#include "engine/state_machine.h"

namespace waystone {
namespace {

NextAction Due(NextAction::Kind kind, int step, Millis next_attempt_at, Millis now) {
  if (next_attempt_at > now) return {NextAction::Kind::kWait, step, next_attempt_at};
  return {kind, step, 0};
}

NextAction DecideForward(const WorkflowDefinition& definition,
                         const std::vector<StepRecord>& steps, Millis now) {
  for (const StepRecord& step : steps) {
    if (StepDone(definition, step)) continue;
    switch (step.state) {
      case StepState::kCompleted:
      case StepState::kSkipped:
        continue;
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
  }
  return {NextAction::Kind::kFinish, -1, 0, InstanceState::kCompleted};
}

NextAction DecideCompensation(const WorkflowDefinition& definition,
                              const std::vector<StepRecord>& steps, Millis now) {
  bool compensated_any = false;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const StepRecord& step = *it;
    const bool has_compensation =
        step.index < static_cast<int>(definition.steps.size()) &&
        definition.steps[step.index].compensate.has_value();
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
                  const std::vector<StepRecord>& steps, Millis now) {
  switch (instance.state) {
    case InstanceState::kRunning:
      return DecideForward(definition, steps, now);
    case InstanceState::kCompensating:
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

bool StepDone(const WorkflowDefinition& /*definition*/, const StepRecord& step) {
  if (step.state == StepState::kCompleted || step.state == StepState::kSkipped) return true;
  return step.state == StepState::kFailed && step.resolution == Resolution::kPassedOver;
}

InstanceState StateAfterFailure(const WorkflowDefinition& definition,
                                const std::vector<StepRecord>& steps, int failed_step) {
  if (definition.steps[failed_step].recovery == RecoveryClass::kManual) {
    return InstanceState::kNeedsAttention;
  }
  for (const StepRecord& step : steps) {
    if (step.index < failed_step && step.state == StepState::kCompleted &&
        definition.steps[step.index].compensate.has_value()) {
      return InstanceState::kCompensating;
    }
  }
  return InstanceState::kFailed;
}

}  // namespace waystone
