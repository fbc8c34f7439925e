// Why an instance stopped (server/triage.h), from hand-made records: each reason
// the console groups by, and the order in which they win.

#include "server/triage.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

constexpr Millis kNow = 10'000'000;

struct Case {
  InstanceRecord instance;
  std::vector<StepRecord> steps;
  std::vector<AlertRecord> alerts;
};

Case Make(InstanceState state, std::vector<StepState> step_states) {
  Case c;
  c.instance.id = 1;
  c.instance.key = "crm:1";
  c.instance.state = state;
  c.instance.updated_at = kNow - 1000;
  for (size_t i = 0; i < step_states.size(); ++i) {
    StepRecord s;
    s.index = static_cast<int>(i);
    s.name = "step-" + std::to_string(i);
    s.state = step_states[i];
    c.steps.push_back(s);
  }
  return c;
}

AlertRecord Alert(AlertKind kind, AlertState state = AlertState::kOpen) {
  AlertRecord a;
  a.kind = kind;
  a.state = state;
  a.message = "the alert's message";
  return a;
}

StopExplanation Explain(const Case& c) {
  return ExplainStop(c.instance, c.steps, c.alerts, kNow, TriageOptions{});
}

TEST(TriageTest, AnUnknownOutcomeNamesItsStepAndError) {
  Case c = Make(InstanceState::kNeedsAttention,
                {StepState::kCompleted, StepState::kUnknown, StepState::kPending});
  c.steps[1].attempts = 2;
  c.steps[1].error_class = ErrorClass::kUnknown;
  c.steps[1].error_message = "Server returned nothing";
  c.alerts.push_back(Alert(AlertKind::kNeedsOperator));
  const StopExplanation why = Explain(c);
  EXPECT_EQ(why.reason, StopReason::kOutcomeUnknown);
  EXPECT_EQ(why.step, 1);
  EXPECT_EQ(why.attempt, 2);
  EXPECT_NE(why.words.find("Step 'step-1'"), std::string::npos) << why.words;
  EXPECT_NE(why.words.find("Server returned nothing"), std::string::npos) << why.words;
  EXPECT_NE(why.words.find("Confirm"), std::string::npos) << why.words;
}

TEST(TriageTest, ACompensationFailureWinsOverEverythingElse) {
  Case c =
      Make(InstanceState::kNeedsAttention, {StepState::kCompensationFailed, StepState::kUnknown});
  c.steps[0].compensation_attempts = 4;
  c.alerts.push_back(Alert(AlertKind::kIdempotencyConflict));
  const StopExplanation why = Explain(c);
  EXPECT_EQ(why.reason, StopReason::kCompensationFailed);
  EXPECT_EQ(why.step, 0);
  EXPECT_NE(why.words.find("4 attempts"), std::string::npos) << why.words;
}

TEST(TriageTest, ConflictsRetriesExhaustedAndOperatorAlerts) {
  Case conflict = Make(InstanceState::kNeedsAttention, {StepState::kFailed});
  conflict.alerts.push_back(Alert(AlertKind::kInboxConflict));
  EXPECT_EQ(Explain(conflict).reason, StopReason::kConflict);
  EXPECT_NE(Explain(conflict).words.find("event came again"), std::string::npos);

  Case exhausted = Make(InstanceState::kNeedsAttention, {StepState::kFailed});
  exhausted.steps[0].attempts = 6;
  exhausted.steps[0].error_class = ErrorClass::kTransient;
  exhausted.alerts.push_back(Alert(AlertKind::kRetriesExhausted));
  EXPECT_EQ(Explain(exhausted).reason, StopReason::kRetriesExhausted);
  EXPECT_NE(Explain(exhausted).words.find("6 attempts"), std::string::npos);

  // A resolved alert no longer explains anything.
  Case resolved = exhausted;
  resolved.alerts[0].state = AlertState::kResolved;
  resolved.instance.state = InstanceState::kRunning;
  EXPECT_EQ(Explain(resolved).reason, StopReason::kInProgress);

  Case operator_needed = Make(InstanceState::kNeedsAttention, {StepState::kFailed});
  operator_needed.alerts.push_back(Alert(AlertKind::kLookupContradiction));
  EXPECT_EQ(Explain(operator_needed).reason, StopReason::kNeedsOperator);
  EXPECT_NE(Explain(operator_needed).words.find("the alert's message"), std::string::npos);
}

TEST(TriageTest, WaitingIsOverdueOnlyPastItsDeadline) {
  Case c = Make(InstanceState::kRunning, {StepState::kCompleted, StepState::kWaiting});
  c.steps[1].next_attempt_at = kNow + 60'000;
  EXPECT_EQ(Explain(c).reason, StopReason::kWaitingForEvent);
  EXPECT_FALSE(Explain(c).overdue);
  c.steps[1].next_attempt_at = kNow - 1;
  EXPECT_TRUE(Explain(c).overdue);
  EXPECT_NE(Explain(c).words.find("was due by"), std::string::npos);
}

TEST(TriageTest, RetryingStuckAndInProgress) {
  Case c = Make(InstanceState::kRunning, {StepState::kPending});
  c.steps[0].attempts = 3;
  c.steps[0].error_class = ErrorClass::kTransient;
  c.steps[0].error_message = "HTTP 503";
  c.steps[0].next_attempt_at = kNow + 5000;
  StopExplanation why = Explain(c);
  EXPECT_EQ(why.reason, StopReason::kRetrying);
  EXPECT_EQ(why.attempt, 3);
  EXPECT_EQ(why.next_attempt_at, kNow + 5000);
  // A retry long overdue with nothing changing is stuck (no worker came for it).
  c.steps[0].next_attempt_at = kNow - 3'600'000;
  c.instance.updated_at = kNow - 3'600'000;
  EXPECT_EQ(Explain(c).reason, StopReason::kStuck);
  EXPECT_NE(Explain(c).words.find("no worker holds it"), std::string::npos);
  // Recently changed and not waiting for a retry: simply in progress.
  c.instance.updated_at = kNow - 1000;
  EXPECT_EQ(Explain(c).reason, StopReason::kInProgress);
  TriageOptions strict;
  strict.stuck_after = 500;
  EXPECT_EQ(ExplainStop(c.instance, c.steps, c.alerts, kNow, strict).reason, StopReason::kStuck);
}

TEST(TriageTest, FinishedInstancesAreNotStopped) {
  for (InstanceState state :
       {InstanceState::kCompleted, InstanceState::kCompensated, InstanceState::kClosed}) {
    Case c = Make(state, {StepState::kCompleted});
    c.alerts.push_back(Alert(AlertKind::kNeedsOperator));  // even with an old open alert
    EXPECT_EQ(Explain(c).reason, StopReason::kFinished);
  }
}

}  // namespace
}  // namespace waystone
