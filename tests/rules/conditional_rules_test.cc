// The rules of `when:` and `optional:` steps, as tables over the pure transitions
// and Decide: a skipped step and a failed optional step are passed over; neither is
// compensated; a failed optional step raises its own alert and moves no instance.

#include <vector>

#include <gtest/gtest.h>

#include "definition/loader.h"
#include "engine/operate/operator_plan.h"
#include "rules/state_machine.h"
#include "rules/transitions.h"
#include "support/records.h"

namespace waystone {
namespace {

using S = StepState;
using I = InstanceState;

// a: compensable create; b: optional notify; c: conditional create; d: a create
// that can fail for good. b and c have compensations, so "never compensated" is
// the rule's doing, not a step without one.
const WorkflowDefinition& ConditionalDefinition() {
  static const WorkflowDefinition definition = [] {
    auto loaded = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/a" }
    compensate: { request: { method: POST, url: "http://x/a/undo" } }
  - name: b
    optional: true
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/b" }
    compensate: { request: { method: POST, url: "http://x/b/undo" } }
    retry: { max_attempts: 2 }
  - name: c
    when: "{{input.read}}"
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/c" }
    compensate: { request: { method: POST, url: "http://x/c/undo" } }
  - name: d
    recovery: compensable
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/d" }
    compensate: { request: { method: POST, url: "http://x/d/undo" } }
)",
                                     "w.yaml");
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return *loaded;
  }();
  return definition;
}

constexpr Millis kConditionalNow = 10'000;

CallResult Answer(int status, ErrorClass error_class) {
  CallResult result;
  result.response.outcome.kind = CallOutcome::Kind::kResponse;
  result.response.outcome.status = status;
  result.response.outcome.sent = true;
  result.error_class = error_class;
  return result;
}

std::vector<StepRecord> Apply(std::vector<StepRecord> steps, const Change& change) {
  for (const StepRecord& step : change.steps) steps[step.index] = step;
  return steps;
}

// An operator's `action` on `step`, by alice, with `reason`.
OperatorRequest Request(OperatorAction action, std::string step, std::string reason) {
  OperatorRequest request;
  request.action = action;
  request.step = std::move(step);
  request.reason = std::move(reason);
  request.actor = "alice";
  return request;
}

std::string ConditionalKey(int index) { return "k:" + std::to_string(index); }

std::vector<std::string> ConditionalEventTypes(const Change& change) {
  std::vector<std::string> types;
  for (const EventRecord& event : change.events) types.push_back(event.type);
  return types;
}

TEST(ConditionalRulesTest, AFailedOptionalStepAlertsAndTheRunGoesOnToTheNextStep) {
  struct Row {
    const char* name;
    CallResult result;
    int attempts;
  };
  const std::vector<Row> table = {
      {"rejected", Answer(422, ErrorClass::kRejected), 1},
      {"transient, retries exhausted", Answer(503, ErrorClass::kTransient), 2},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.name);
    InstanceRecord instance = testing::Instance(I::kRunning);
    std::vector<StepRecord> steps =
        testing::Steps({S::kCompleted, S::kRunning, S::kPending, S::kPending});
    steps[1].attempts = row.attempts;
    SeededRandom random{3};
    const Facts facts{ConditionalDefinition(), instance, steps, kConditionalNow, random};
    const Change change = RecordCall(facts, steps[1], row.result);
    ASSERT_EQ(change.steps.size(), 1u);
    EXPECT_EQ(change.steps[0].state, S::kFailed);
    EXPECT_EQ(change.steps[0].resolution, Resolution::kPassedOver);
    EXPECT_EQ(change.state, std::nullopt);  // the instance stays running
    ASSERT_EQ(change.alerts.size(), 1u);
    EXPECT_EQ(change.alerts[0].kind, AlertKind::kOptionalStepFailed);
    EXPECT_NE(change.alerts[0].message.find("went on without it"), std::string::npos);
    EXPECT_EQ(
        ConditionalEventTypes(change),
        (std::vector<std::string>{"waystone.step.failed", "waystone.alert.optional_step_failed"}));
    EXPECT_EQ(change.next_run_at, kConditionalNow);
    const std::vector<StepRecord> after = Apply(steps, change);
    EXPECT_TRUE(StepDone(ConditionalDefinition(), after[1]));
    const NextAction next = Decide(ConditionalDefinition(), instance, after, kConditionalNow);
    EXPECT_EQ(next.kind, NextAction::Kind::kRunStep);
    EXPECT_EQ(next.step, 2);
  }
}

TEST(ConditionalRulesTest, ANonOptionalStepFailingTheSameWayMovesTheInstance) {
  InstanceRecord instance = testing::Instance(I::kRunning);
  std::vector<StepRecord> steps =
      testing::Steps({S::kCompleted, S::kFailed, S::kSkipped, S::kRunning});
  steps[1].resolution = Resolution::kPassedOver;
  steps[3].attempts = 1;
  SeededRandom random{3};
  const Facts facts{ConditionalDefinition(), instance, steps, kConditionalNow, random};
  const Change change = RecordCall(facts, steps[3], Answer(422, ErrorClass::kRejected));
  EXPECT_EQ(change.state, I::kCompensating);
  EXPECT_FALSE(StepDone(ConditionalDefinition(), change.steps[0]));
  // d failed, so nothing of it is undone; compensation undoes a, past the skipped c
  // and the failed b (both have compensations).
  std::vector<StepRecord> after = Apply(steps, change);
  instance.state = I::kCompensating;
  const NextAction next = Decide(ConditionalDefinition(), instance, after, kConditionalNow);
  EXPECT_EQ(next.kind, NextAction::Kind::kCompensate);
  EXPECT_EQ(next.step, 0);
}

TEST(ConditionalRulesTest, ASkippedStepIsDoneSaysWhyAndIsNeverCompensated) {
  InstanceRecord instance = testing::Instance(I::kRunning);
  std::vector<StepRecord> steps =
      testing::Steps({S::kCompleted, S::kCompleted, S::kPending, S::kPending});
  SeededRandom random{3};
  const Facts facts{ConditionalDefinition(), instance, steps, kConditionalNow, random};
  const Change change = SkipStep(facts, 2, "when: {{input.read}} is false");
  ASSERT_EQ(change.steps.size(), 1u);
  EXPECT_EQ(change.steps[0].state, S::kSkipped);
  EXPECT_EQ(change.steps[0].attempts, 0);
  EXPECT_EQ(change.steps[0].error_message, "when: {{input.read}} is false");
  EXPECT_EQ(change.state, std::nullopt);
  EXPECT_TRUE(change.alerts.empty());
  EXPECT_EQ(ConditionalEventTypes(change), (std::vector<std::string>{"waystone.step.skipped"}));
  std::vector<StepRecord> after = Apply(steps, change);
  EXPECT_EQ(Decide(ConditionalDefinition(), instance, after, kConditionalNow).step, 3);
  // After d fails for good, compensation goes back past c (skipped, though it has a
  // compensation) to b (completed here: what it did is undone).
  after[3].state = S::kFailed;
  instance.state = I::kCompensating;
  const NextAction next = Decide(ConditionalDefinition(), instance, after, kConditionalNow);
  EXPECT_EQ(next.kind, NextAction::Kind::kCompensate);
  EXPECT_EQ(next.step, 1);
}

TEST(ConditionalRulesTest, AnOperatorRetriesTheStepTheRunStoppedAtNotAPassedOverOne) {
  // b (optional) failed and was passed over; d failed and waits for an operator.
  std::vector<StepRecord> steps =
      testing::Steps({S::kCompleted, S::kFailed, S::kSkipped, S::kFailed});
  steps[1].resolution = Resolution::kPassedOver;
  const OperatorRequest request = Request(OperatorAction::kRetry, "b", "ticket 7");
  auto refused = PlanOperatorAction(ConditionalDefinition(), testing::Instance(I::kNeedsAttention),
                                    steps, request, kConditionalNow, ConditionalKey);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("('d')"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

TEST(ConditionalRulesTest, AnOperatorSkipsOrConfirmsAnOptionalStepThatMayHaveActed) {
  // b's first request was lost (unknown), its resubmission refused: the instance
  // waits; skip and confirm both go on without undoing a.
  InstanceRecord instance = testing::Instance(I::kRunning);
  std::vector<StepRecord> steps =
      testing::Steps({S::kCompleted, S::kRunning, S::kPending, S::kPending});
  steps[1].attempts = 2;
  steps[1].unknowns = 1;
  SeededRandom random{3};
  const Facts facts{ConditionalDefinition(), instance, steps, kConditionalNow, random};
  const Change failed = RecordCall(facts, steps[1], Answer(422, ErrorClass::kRejected));
  ASSERT_EQ(failed.state, I::kNeedsAttention);
  const std::vector<StepRecord> waiting = Apply(steps, failed);
  const InstanceRecord paused = testing::Instance(I::kNeedsAttention);
  OperatorRequest skip = Request(OperatorAction::kSkip, "b", "checked: the message arrived");
  auto skipped = PlanOperatorAction(ConditionalDefinition(), paused, waiting, skip, kConditionalNow,
                                    ConditionalKey);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->state_after, I::kRunning);
  ASSERT_EQ(skipped->changed_steps.size(), 1u);
  EXPECT_EQ(skipped->changed_steps[0].state, S::kSkipped);
  OperatorRequest confirm = skip;
  confirm.action = OperatorAction::kConfirm;
  confirm.happened = true;
  auto confirmed = PlanOperatorAction(ConditionalDefinition(), paused, waiting, confirm,
                                      kConditionalNow, ConditionalKey);
  ASSERT_TRUE(confirmed.ok()) << confirmed.status();
  EXPECT_EQ(confirmed->changed_steps[0].state, S::kCompleted);
  // A required step is not skipped that way.
  std::vector<StepRecord> at_d =
      testing::Steps({S::kCompleted, S::kCompleted, S::kSkipped, S::kFailed});
  skip.step = "d";
  EXPECT_FALSE(PlanOperatorAction(ConditionalDefinition(), paused, at_d, skip, kConditionalNow,
                                  ConditionalKey)
                   .ok());
}

TEST(ConditionalRulesTest, ASuccessItCouldNotReadIsNotPassedOver) {
  InstanceRecord instance = testing::Instance(I::kRunning);
  std::vector<StepRecord> steps =
      testing::Steps({S::kCompleted, S::kRunning, S::kPending, S::kPending});
  steps[1].attempts = 1;
  SeededRandom random{3};
  const Facts facts{ConditionalDefinition(), instance, steps, kConditionalNow, random};
  CallResult unreadable = Answer(200, ErrorClass::kNone);
  unreadable.response.body = std::string(200, '[') + std::string(200, ']');  // nested too deep
  const Change said_yes = RecordCall(facts, steps[1], unreadable);
  EXPECT_EQ(said_yes.state, I::kNeedsAttention);
  EXPECT_NE(said_yes.steps[0].resolution, Resolution::kPassedOver);
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

TEST(ConditionalRulesTest, AnOptionalStepThatMayHaveActedIsNotPassedOver) {
  // After an unknown outcome, a refused resubmission does not prove the first
  // request did nothing; a key conflict and a refused certificate need an operator.
  // The business before it stands: an operator decides.
  InstanceRecord instance = testing::Instance(I::kRunning);
  std::vector<StepRecord> steps =
      testing::Steps({S::kCompleted, S::kRunning, S::kPending, S::kPending});
  steps[1].attempts = 2;
  steps[1].unknowns = 1;
  steps[1].resolution = Resolution::kResubmitted;
  SeededRandom random{3};
  const Facts facts{ConditionalDefinition(), instance, steps, kConditionalNow, random};
  const Change after_unknown = RecordCall(facts, steps[1], Answer(422, ErrorClass::kRejected));
  // It waits for an operator: neither passed over nor undoing the order before it.
  EXPECT_EQ(after_unknown.state, I::kNeedsAttention);
  EXPECT_NE(after_unknown.steps[0].resolution, Resolution::kPassedOver);
  ASSERT_EQ(after_unknown.alerts.size(), 1u);
  EXPECT_EQ(after_unknown.alerts[0].kind, AlertKind::kNeedsOperator);

  steps[1].unknowns = 0;
  steps[1].resolution = Resolution::kNone;
  const Change conflict = FailStep(facts, steps[1], ErrorClass::kRejected, "request changed",
                                   AlertKind::kIdempotencyConflict);
  EXPECT_EQ(conflict.state, I::kNeedsAttention);
  ASSERT_FALSE(conflict.alerts.empty());
  EXPECT_EQ(conflict.alerts[0].kind, AlertKind::kIdempotencyConflict);

  const Change certificate = FailStepAndWait(facts, steps[1], "certificate refused");
  EXPECT_EQ(certificate.state, I::kNeedsAttention);
  std::vector<StepRecord> waiting = Apply(steps, certificate);
  EXPECT_FALSE(StepDone(ConditionalDefinition(), waiting[1]));
  // The operator retries b, the step it stopped at, not the one after it.
  OperatorRequest request = Request(OperatorAction::kRetry, "c", "certificate renewed");
  auto refused = PlanOperatorAction(ConditionalDefinition(), testing::Instance(I::kNeedsAttention),
                                    waiting, request, kConditionalNow, ConditionalKey);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("('b')"), std::string::npos) << refused.status();
  request.step = "b";
  EXPECT_TRUE(PlanOperatorAction(ConditionalDefinition(), testing::Instance(I::kNeedsAttention),
                                 waiting, request, kConditionalNow, ConditionalKey)
                  .ok());
}

}  // namespace
}  // namespace waystone
