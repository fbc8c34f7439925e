#include "engine/state_machine.h"

#include <gtest/gtest.h>

#include "definition/loader.h"
#include "support/records.h"

namespace waystone {
namespace {

WorkflowDefinition Definition() {
  auto definition = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    request: { method: GET, url: "http://x" }
  - name: b
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x" }
    compensate: { request: { method: POST, url: "http://x/undo" } }
  - name: c
    idempotency: { honored: true }
    request: { method: POST, url: "http://x" }
  - name: d
    recovery: manual
    request: { method: POST, url: "http://x" }
)", "w.yaml");
  EXPECT_TRUE(definition.ok()) << definition.status();
  return *definition;
}

using testing::Instance;
using testing::Steps;

using K = NextAction::Kind;
using S = StepState;

TEST(StateMachineTest, RunsTheFirstPendingStep) {
  auto d = Definition();
  auto steps = Steps({S::kCompleted, S::kPending, S::kPending, S::kPending});
  EXPECT_EQ(Decide(d, Instance(InstanceState::kRunning), steps, 100), (NextAction{K::kRunStep, 1}));
}

TEST(StateMachineTest, WaitsForARetryTimer) {
  auto d = Definition();
  auto steps = Steps({S::kPending, S::kPending, S::kPending, S::kPending});
  steps[0].next_attempt_at = 500;
  EXPECT_EQ(Decide(d, Instance(InstanceState::kRunning), steps, 100),
            (NextAction{K::kWait, 0, 500}));
  EXPECT_EQ(Decide(d, Instance(InstanceState::kRunning), steps, 500).kind, K::kRunStep);
}

TEST(StateMachineTest, RunningAfterACrashIsRecoveredAsUnknownNeverFailed) {
  auto d = Definition();
  auto steps = Steps({S::kCompleted, S::kRunning, S::kPending, S::kPending});
  EXPECT_EQ(Decide(d, Instance(InstanceState::kRunning), steps, 100).kind, K::kRecoverRunning);
  steps[1].state = S::kUnknown;
  EXPECT_EQ(Decide(d, Instance(InstanceState::kRunning), steps, 100),
            (NextAction{K::kResolveUnknown, 1}));
}

TEST(StateMachineTest, FinishesWhenEveryStepIsDone) {
  auto d = Definition();
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kSkipped, S::kCompleted});
  EXPECT_EQ(Decide(d, Instance(InstanceState::kRunning), steps, 100),
            (NextAction{K::kFinish, -1, 0, InstanceState::kCompleted}));
}

TEST(StateMachineTest, CompensatesInReverseOrderOnlyStepsWithACompensation) {
  auto d = Definition();
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kCompleted, S::kFailed});
  // c (index 2) has no compensation; b (index 1) does.
  EXPECT_EQ(Decide(d, Instance(InstanceState::kCompensating), steps, 100),
            (NextAction{K::kCompensate, 1}));
  steps[1].state = S::kCompensated;
  EXPECT_EQ(Decide(d, Instance(InstanceState::kCompensating), steps, 100),
            (NextAction{K::kFinish, -1, 0, InstanceState::kCompensated}));
}

TEST(StateMachineTest, ACompensationInFlightIsRetried) {
  auto d = Definition();
  auto steps = Steps({S::kCompleted, S::kCompensating, S::kFailed, S::kPending});
  EXPECT_EQ(Decide(d, Instance(InstanceState::kCompensating), steps, 100),
            (NextAction{K::kCompensate, 1}));
}

TEST(StateMachineTest, FailedCompensationStops) {
  auto d = Definition();
  auto steps = Steps({S::kCompleted, S::kCompensationFailed, S::kFailed, S::kPending});
  EXPECT_EQ(Decide(d, Instance(InstanceState::kCompensating), steps, 100).kind, K::kIdle);
}

TEST(StateMachineTest, TerminalAndPausedInstancesAreIdle) {
  auto d = Definition();
  auto steps = Steps({S::kPending, S::kPending, S::kPending, S::kPending});
  for (auto state : {InstanceState::kCompleted, InstanceState::kCompensated,
                     InstanceState::kFailed, InstanceState::kNeedsAttention,
                     InstanceState::kClosed}) {
    EXPECT_EQ(Decide(d, Instance(state), steps, 100).kind, K::kIdle);
  }
}

TEST(StateMachineTest, StateAfterFailure) {
  auto d = Definition();
  // Nothing completed before the failure: failed.
  EXPECT_EQ(StateAfterFailure(d, Steps({S::kFailed, S::kPending, S::kPending, S::kPending}), 0),
            InstanceState::kFailed);
  // A completed step with a compensation: compensate.
  EXPECT_EQ(StateAfterFailure(d, Steps({S::kCompleted, S::kCompleted, S::kFailed, S::kPending}), 2),
            InstanceState::kCompensating);
  // A manual step failing: an operator decides.
  EXPECT_EQ(StateAfterFailure(d, Steps({S::kCompleted, S::kCompleted, S::kCompleted, S::kFailed}), 3),
            InstanceState::kNeedsAttention);
}

}  // namespace
}  // namespace waystone
