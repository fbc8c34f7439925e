#include "rules/state_machine.h"

#include <gtest/gtest.h>

#include "base/random.h"
#include "definition/loader.h"
#include "rules/transitions.h"
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
)",
                                       "w.yaml");
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
  for (auto state : {InstanceState::kCompleted, InstanceState::kCompensated, InstanceState::kFailed,
                     InstanceState::kNeedsAttention, InstanceState::kClosed}) {
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
  EXPECT_EQ(
      StateAfterFailure(d, Steps({S::kCompleted, S::kCompleted, S::kCompleted, S::kFailed}), 3),
      InstanceState::kNeedsAttention);
}

// a; then a group: branch 0 is b0 (compensable) then b1, branch 1 is w (waits for an
// event), branch 2 is c; then z.
WorkflowDefinition Grouped() {
  auto definition = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    request: { method: GET, url: "http://x" }
  - name: updates
    parallel:
      - branch: erp
        steps:
          - name: b0
            recovery: compensable
            idempotency: { honored: true }
            request: { method: POST, url: "http://x" }
            compensate: { request: { method: POST, url: "http://x/undo" } }
          - name: b1
            request: { method: GET, url: "http://x" }
      - name: w
        wait: { event: approved }
      - name: c
        idempotency: { honored: true }
        request: { method: POST, url: "http://x" }
  - name: z
    request: { method: GET, url: "http://x" }
)",
                                       "g.yaml");
  EXPECT_TRUE(definition.ok()) << definition.status();
  return *definition;
}

TEST(StateMachineTest, AGroupsBranchesStandSideBySide) {
  auto d = Grouped();
  ASSERT_EQ(d.steps.size(), 6u);
  EXPECT_EQ(d.steps[1].group, "updates");
  EXPECT_EQ(d.steps[2].branch, 0);
  EXPECT_EQ(d.steps[3].branch, 1);
  EXPECT_EQ(d.steps[4].branch, 2);
  EXPECT_TRUE(d.steps[5].group.empty());
  auto steps =
      Steps({S::kCompleted, S::kPending, S::kPending, S::kPending, S::kPending, S::kPending});
  EXPECT_EQ(Frontier(d, steps), (std::vector<int>{1, 3, 4}));
  steps[1].state = S::kCompleted;
  EXPECT_EQ(Frontier(d, steps), (std::vector<int>{2, 3, 4})) << "b1 follows b0 in its branch";
  for (int i : {2, 3, 4}) steps[i].state = S::kCompleted;
  EXPECT_EQ(Frontier(d, steps), std::vector<int>{5}) << "z runs once every branch is done";
}

TEST(StateMachineTest, ABranchThatWaitsHoldsNoOther) {
  auto d = Grouped();
  const auto running = Instance(InstanceState::kRunning);
  auto steps =
      Steps({S::kCompleted, S::kPending, S::kPending, S::kPending, S::kPending, S::kPending});
  steps[1].next_attempt_at = 500;  // b0 backs off
  steps[3].state = S::kWaiting;    // w waits for its event, no deadline
  EXPECT_EQ(Decide(d, running, steps, 100), (NextAction{K::kRunStep, 4})) << "c goes ahead";
  steps[4].state = S::kUnknown;
  steps[4].next_attempt_at = 300;
  // Nothing due: parked for the event, woken for the earliest retry.
  EXPECT_EQ(Decide(d, running, steps, 100), (NextAction{K::kAwaitEvent, 3, 300}));
  EXPECT_EQ(Decide(d, running, steps, 300), (NextAction{K::kResolveUnknown, 4}));
  steps[3].state = S::kCompleted;
  EXPECT_EQ(Decide(d, running, steps, 100), (NextAction{K::kWait, 1, 300}));
  steps[1].state = S::kRunning;  // found running after a crash: only that branch recovers
  EXPECT_EQ(Decide(d, running, steps, 100), (NextAction{K::kRecoverRunning, 1}));
}

TEST(StateMachineTest, AFailureInABranchUndoesTheCompletedBranchesOrWaitsForTheUnknown) {
  auto d = Grouped();
  // b0 completed (with a compensation), c fails: b0 is undone though it is earlier.
  auto steps =
      Steps({S::kCompleted, S::kCompleted, S::kPending, S::kPending, S::kFailed, S::kPending});
  EXPECT_EQ(StateAfterFailure(d, steps, 4), InstanceState::kCompensating);
  // c completed after b0 failed: still undone in reverse (c has none; b0 failed).
  steps =
      Steps({S::kCompleted, S::kFailed, S::kPending, S::kCompleted, S::kCompleted, S::kPending});
  EXPECT_EQ(StateAfterFailure(d, steps, 1), InstanceState::kFailed);
  // A branch beside it has an unknown outcome: an operator settles it first.
  steps = Steps({S::kCompleted, S::kUnknown, S::kPending, S::kPending, S::kFailed, S::kPending});
  EXPECT_EQ(StateAfterFailure(d, steps, 4), InstanceState::kNeedsAttention);
  // Compensation goes in reverse over every completed step, whatever its branch.
  steps = Steps({S::kCompleted, S::kCompleted, S::kPending, S::kPending, S::kFailed, S::kPending});
  EXPECT_EQ(Decide(d, Instance(InstanceState::kCompensating), steps, 100),
            (NextAction{K::kCompensate, 1}));
}

TEST(StateMachineTest, BranchesWithACallUnderWayArePassedOver) {
  auto d = Grouped();
  const auto running = Instance(InstanceState::kRunning);
  auto steps =
      Steps({S::kCompleted, S::kPending, S::kPending, S::kPending, S::kPending, S::kPending});
  steps[3].state = S::kCompleted;  // w got its event
  EXPECT_EQ(Decide(d, running, steps, 100), (NextAction{K::kRunStep, 1}));
  steps[1].state = S::kRunning;  // b0's call is under way in this drive: c goes beside it
  EXPECT_EQ(Decide(d, running, steps, 100, {1}), (NextAction{K::kRunStep, 4}));
  steps[4].state = S::kRunning;
  EXPECT_EQ(Decide(d, running, steps, 100, {1, 4}).kind, K::kAwaitCalls);
  // Without `busy`, a step found running is a crash's unknown outcome.
  EXPECT_EQ(Decide(d, running, steps, 100), (NextAction{K::kRecoverRunning, 1}));
  // While compensating, one compensation at a time.
  EXPECT_EQ(Decide(d, Instance(InstanceState::kCompensating), steps, 100, {1}).kind,
            K::kAwaitCalls);
}

TEST(StateMachineTest, AFailureBesideACallUnderWayWaitsForItsOutcome) {
  auto d = Grouped();
  const auto running = Instance(InstanceState::kRunning);
  // b0 (compensable) is calling; c is refused for good meanwhile.
  auto steps =
      Steps({S::kCompleted, S::kRunning, S::kPending, S::kCompleted, S::kRunning, S::kPending});
  steps[4].attempts = 1;
  SeededRandom random(1);
  const std::vector<int> busy = {1};
  const Facts facts{d, running, steps, 100, random, &busy};
  StepRecord failing = steps[4];
  const Change failed = FailStep(facts, failing, ErrorClass::kRejected, "HTTP 422", std::nullopt);
  ASSERT_EQ(failed.steps.size(), 1u);
  EXPECT_EQ(failed.steps[0].state, S::kFailed);
  EXPECT_FALSE(failed.state.has_value()) << "the instance goes on running until b0 answers";
  EXPECT_EQ(StateAfterFailure(d, steps, 4, busy), InstanceState::kRunning);
  steps[4] = failed.steps[0];
  EXPECT_EQ(Decide(d, running, steps, 100, busy).kind, K::kAwaitCalls);

  // b0's call completed: the failure takes its course, b0 undone.
  steps[1].state = S::kCompleted;
  EXPECT_EQ(Decide(d, running, steps, 100), (NextAction{K::kSettleFailure, 4}));
  const Facts after{d, running, steps, 200, random};
  const Change settled = SettleFailure(after, 4);
  ASSERT_TRUE(settled.state.has_value());
  EXPECT_EQ(*settled.state, InstanceState::kCompensating);
  EXPECT_NE(settled.status_reason->find("failed (rejected): HTTP 422"), std::string::npos)
      << *settled.status_reason;

  // A manual step failed beside it first: the instance stays before an operator, and a
  // later failure does not move it on.
  {
    auto manual = LoadDefinitionText(R"(workflow: m
key: "{{input.id}}"
steps:
  - name: g
    parallel:
      - name: by-hand
        recovery: manual
        request: { method: POST, url: "http://x" }
      - name: other
        idempotency: { honored: true }
        request: { method: POST, url: "http://x" }
      - name: undoable
        recovery: compensable
        idempotency: { honored: true }
        request: { method: POST, url: "http://x" }
        compensate: { request: { method: POST, url: "http://x/undo" } }
)",
                                     "m.yaml");
    ASSERT_TRUE(manual.ok()) << manual.status();
    auto three = Steps({S::kFailed, S::kRunning, S::kCompleted});
    EXPECT_EQ(StateAfterFailure(*manual, three, 1), InstanceState::kNeedsAttention);
    const auto paused = Instance(InstanceState::kNeedsAttention);
    three[1].attempts = 1;
    const Facts at{*manual, paused, three, 300, random};
    const Change later = FailStep(at, three[1], ErrorClass::kRejected, "HTTP 400", std::nullopt);
    EXPECT_EQ(later.state.value_or(InstanceState::kNeedsAttention), InstanceState::kNeedsAttention)
        << "it stays needs_attention; nothing is undone";
    // Paused for another reason (a lookup that found two orders, say): a failure beside
    // it, which alone would compensate `undoable`, leaves it before the operator too.
    three[0].state = S::kUnknown;
    EXPECT_EQ(StateAfterFailure(*manual, three, 1), InstanceState::kNeedsAttention);
    three[0].state = S::kPending;
    ASSERT_EQ(StateAfterFailure(*manual, three, 1), InstanceState::kCompensating);
    const Facts paused_at{*manual, paused, three, 300, random};
    const Change kept =
        FailStep(paused_at, three[1], ErrorClass::kRejected, "HTTP 400", std::nullopt);
    EXPECT_FALSE(kept.state.has_value()) << "it stays needs_attention; nothing is undone";
  }

  // b0's call was lost instead: an operator settles it before anything is undone.
  steps[1].state = S::kUnknown;
  const Change waits = SettleFailure(after, 4);
  ASSERT_TRUE(waits.state.has_value());
  EXPECT_EQ(*waits.state, InstanceState::kNeedsAttention);
  ASSERT_EQ(waits.alerts.size(), 1u);
  EXPECT_EQ(waits.alerts[0].kind, AlertKind::kNeedsOperator);
}

}  // namespace
}  // namespace waystone
