// Operator actions as pure plans: which states allow each action, what changes,
// and the preview of what the engine does next.

#include "engine/operator_plan.h"

#include <gtest/gtest.h>

#include "definition/loader.h"
#include "support/records.h"
#include "engine/state_machine.h"

namespace waystone {
namespace {

WorkflowDefinition Definition() {
  auto definition = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    request: { method: GET, url: "http://x/a" }
  - name: b
    recovery: lookup
    request: { method: POST, url: "http://x/b" }
    result: { external_id: "/id" }
    lookup:
      request: { method: GET, url: "http://x/b?ref={{instance.key}}" }
      found: "/items/0"
      external_id: "/items/0/id"
    compensate: { request: { method: POST, url: "http://x/b/undo" } }
  - name: c
    recovery: manual
    request: { method: POST, url: "http://x/c" }
  - name: d
    wait: { event: com.example.approved }
  - name: e
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/e" }
)", "w.yaml");
  EXPECT_TRUE(definition.ok()) << definition.status();
  return *definition;
}

using S = StepState;
using I = InstanceState;

using testing::Instance;
using testing::Steps;

std::string Key(int index) { return "k:" + std::string(1, static_cast<char>('a' + index)); }

OperatorRequest Request(OperatorAction action, std::string step = "") {
  OperatorRequest r;
  r.action = action;
  r.step = std::move(step);
  r.reason = "ticket 42";
  r.actor = "alice";
  return r;
}

absl::StatusOr<ActionPlan> Plan(InstanceState state, const std::vector<StepRecord>& steps,
                                const OperatorRequest& request) {
  return PlanOperatorAction(Definition(), Instance(state), steps, request, 1000, Key);
}

TEST(OperatorPlanTest, ReasonIsMandatory) {
  auto request = Request(OperatorAction::kClose);
  request.reason = "  ";
  auto plan = Plan(I::kNeedsAttention, Steps({S::kCompleted, S::kFailed, S::kPending, S::kPending,
                                              S::kPending}),
                   request);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OperatorPlanTest, RetryOfAFailedManualStepRunsItAndTheRest) {
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kFailed, S::kPending, S::kPending});
  steps[1].external_id = "ORD-1";
  auto plan = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "c"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state_after, I::kRunning);
  ASSERT_EQ(plan->changed_steps.size(), 1u);
  EXPECT_EQ(plan->changed_steps[0].state, S::kPending);
  ASSERT_EQ(plan->would_execute.size(), 3u);
  EXPECT_EQ(plan->would_execute[0], (PlannedCall{"c", "call", "POST", "http://x/c", "k:c", ""}));
  EXPECT_EQ(plan->would_execute[1], (PlannedCall{"d", "wait", "", "", "", "com.example.approved"}));
  EXPECT_EQ(plan->would_execute[2], (PlannedCall{"e", "call", "POST", "http://x/e", "k:e", ""}));
  ASSERT_EQ(plan->would_skip.size(), 2u);
  EXPECT_EQ(plan->would_skip[1].why, "completed (external id ORD-1)");
  // The planned steps are what the engine then decides to run.
  std::vector<StepRecord> after = steps;
  after[2] = plan->changed_steps[0];
  auto instance = Instance(I::kRunning);
  EXPECT_EQ(Decide(Definition(), instance, after, 1000).step, 2);
}

TEST(OperatorPlanTest, RetryIsRefusedOutsideTheStepTheInstanceStoppedAt) {
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kFailed, S::kPending, S::kPending});
  EXPECT_EQ(Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "e")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "a")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Plan(I::kCompleted, Steps({S::kCompleted, S::kCompleted, S::kCompleted, S::kCompleted,
                                       S::kCompleted}),
                 Request(OperatorAction::kRetry, "a"))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "nope")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OperatorPlanTest, RetryOfAnUnknownStepWithLookupLooksItUpAgain) {
  auto steps = Steps({S::kCompleted, S::kUnknown, S::kPending, S::kPending, S::kPending});
  steps[1].lookups = 6;
  auto plan = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "b"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->changed_steps[0].state, S::kUnknown);
  EXPECT_EQ(plan->changed_steps[0].lookups, 0);
  EXPECT_EQ(plan->would_execute[0].phase, "lookup");
  EXPECT_EQ(plan->would_execute[1].phase, "call_if_not_found");
  EXPECT_EQ(plan->would_execute[1].idempotency_key, "k:b");
}

TEST(OperatorPlanTest, UnknownManualStepWithoutLookupMustBeConfirmedNotRetried) {
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kUnknown, S::kPending, S::kPending});
  auto retry = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "c"));
  EXPECT_EQ(retry.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(retry.status().message().find("confirm"), std::string::npos);

  auto happened = Request(OperatorAction::kConfirm, "c");
  happened.happened = true;
  auto plan = Plan(I::kNeedsAttention, steps, happened);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->changed_steps[0].state, S::kCompleted);
  EXPECT_EQ(plan->changed_steps[0].resolution, Resolution::kOperator);
  EXPECT_EQ(plan->changed_steps[0].finished_at, 1000);  // like a step the engine completes
  // Nothing calls c again: the next call is e, after the wait.
  ASSERT_EQ(plan->would_execute.size(), 2u);
  EXPECT_EQ(plan->would_execute[0].step, "d");
  EXPECT_EQ(plan->would_execute[1].step, "e");

  auto not_happened = Request(OperatorAction::kConfirm, "c");
  not_happened.happened = false;
  plan = Plan(I::kNeedsAttention, steps, not_happened);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->changed_steps[0].state, S::kPending);
  EXPECT_EQ(plan->would_execute[0], (PlannedCall{"c", "call", "POST", "http://x/c", "k:c", ""}));
}

TEST(OperatorPlanTest, ConfirmNeedsAnUnknownStepAndTheExternalIdItRecords) {
  auto steps = Steps({S::kCompleted, S::kUnknown, S::kPending, S::kPending, S::kPending});
  auto request = Request(OperatorAction::kConfirm, "b");
  request.happened = true;
  EXPECT_EQ(Plan(I::kNeedsAttention, steps, request).status().code(),
            absl::StatusCode::kInvalidArgument);  // b records an external id
  request.external_id = "ORD-9";
  auto plan = Plan(I::kNeedsAttention, steps, request);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->changed_steps[0].external_id, "ORD-9");

  auto completed = Steps({S::kCompleted, S::kCompleted, S::kPending, S::kPending, S::kPending});
  EXPECT_EQ(Plan(I::kRunning, completed, request).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto no_answer = Request(OperatorAction::kConfirm, "b");
  EXPECT_EQ(Plan(I::kNeedsAttention, steps, no_answer).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OperatorPlanTest, CompensateUndoesCompletedStepsInReverseAndRefusesUnknownOnes) {
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kFailed, S::kPending, S::kPending});
  auto plan = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kCompensate));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state_after, I::kCompensating);
  ASSERT_EQ(plan->would_execute.size(), 1u);
  EXPECT_EQ(plan->would_execute[0],
            (PlannedCall{"b", "compensate", "POST", "http://x/b/undo", "k:b:compensate", ""}));

  auto unknown = Steps({S::kCompleted, S::kUnknown, S::kPending, S::kPending, S::kPending});
  EXPECT_EQ(Plan(I::kNeedsAttention, unknown, Request(OperatorAction::kCompensate)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto nothing = Steps({S::kCompleted, S::kFailed, S::kPending, S::kPending, S::kPending});
  EXPECT_EQ(Plan(I::kFailed, nothing, Request(OperatorAction::kCompensate)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Plan(I::kCompensated, steps, Request(OperatorAction::kCompensate)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(OperatorPlanTest, OnlyManualStepsCanBeSkipped) {
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kFailed, S::kPending, S::kPending});
  auto plan = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kSkip, "c"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->changed_steps[0].state, S::kSkipped);
  EXPECT_EQ(plan->changed_steps[0].finished_at, 1000);
  EXPECT_EQ(plan->would_execute[0].step, "d");

  auto failed_b = Steps({S::kCompleted, S::kFailed, S::kPending, S::kPending, S::kPending});
  auto refused = Plan(I::kNeedsAttention, failed_b, Request(OperatorAction::kSkip, "b"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("manual"), std::string::npos);
}

TEST(OperatorPlanTest, CloseStopsEverythingOnce) {
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kFailed, S::kPending, S::kPending});
  auto plan = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kClose));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->state_after, I::kClosed);
  EXPECT_TRUE(plan->would_execute.empty());
  EXPECT_EQ(plan->would_skip.size(), 3u);
  EXPECT_EQ(Plan(I::kClosed, steps, Request(OperatorAction::kClose)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(OperatorPlanTest, ACompensationThatFailedCanBeRetried) {
  auto steps = Steps({S::kCompleted, S::kCompensationFailed, S::kFailed, S::kPending, S::kPending});
  auto plan = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "b"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state_after, I::kCompensating);
  EXPECT_EQ(plan->would_execute[0].phase, "compensate");
  // An attempt's outcome not yet recorded (error class unknown, BeginCompensation): a
  // retry after compensation_failed clears it (the operator's word); a retry of one
  // still compensating keeps it, so an email correction found under way is not resent.
  steps[1].error_class = ErrorClass::kUnknown;
  plan = Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "b"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->changed_steps.size(), 1u);
  EXPECT_EQ(plan->changed_steps[0].error_class, ErrorClass::kNone);
  steps[1].state = S::kCompensating;
  steps[1].next_attempt_at = 5000;  // its retry, brought forward
  plan = Plan(I::kCompensating, steps, Request(OperatorAction::kRetry, "b"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->changed_steps.size(), 1u);
  EXPECT_EQ(plan->changed_steps[0].error_class, ErrorClass::kUnknown);
}

TEST(OperatorPlanTest, WaitStepsWaitAndTimeOut) {
  auto definition = Definition();
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kCompleted, S::kWaiting, S::kPending});
  auto instance = Instance(I::kRunning);
  EXPECT_EQ(Decide(definition, instance, steps, 1000),
            (NextAction{NextAction::Kind::kAwaitEvent, 3, 0}));
  steps[3].next_attempt_at = 5000;  // its deadline
  EXPECT_EQ(Decide(definition, instance, steps, 1000),
            (NextAction{NextAction::Kind::kAwaitEvent, 3, 5000}));
  EXPECT_EQ(Decide(definition, instance, steps, 5000).kind, NextAction::Kind::kRunStep);
}

// Branch c failed for good while branch b's outcome was unknown, so the instance waits
// for an operator; once b is settled, c's failure takes its course.
TEST(OperatorPlanTest, SettlingABranchLetsTheFailureBesideItTakeItsCourse) {
  auto definition = LoadDefinitionText(R"(workflow: w
key: "{{input.id}}"
steps:
  - name: a
    request: { method: GET, url: "http://x/a" }
  - name: g
    parallel:
      - name: b
        recovery: manual
        request: { method: POST, url: "http://x/b" }
        compensate: { request: { method: POST, url: "http://x/b/undo" } }
      - name: c
        idempotency: { honored: true }
        request: { method: POST, url: "http://x/c" }
)", "g.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const auto steps = Steps({S::kCompleted, S::kUnknown, S::kFailed});
  auto confirm = Request(OperatorAction::kConfirm, "b");
  confirm.happened = true;
  confirm.response_json = "{}";
  auto happened = PlanOperatorAction(*definition, Instance(I::kNeedsAttention), steps, confirm,
                                     1000, Key);
  ASSERT_TRUE(happened.ok()) << happened.status();
  EXPECT_EQ(happened->state_after, I::kCompensating) << "b happened: it is undone";
  EXPECT_NE(happened->status_reason.find("step 'c' had failed"), std::string::npos);
  confirm.happened = false;
  auto not_happened = PlanOperatorAction(*definition, Instance(I::kNeedsAttention), steps,
                                         confirm, 1000, Key);
  ASSERT_TRUE(not_happened.ok()) << not_happened.status();
  EXPECT_EQ(not_happened->state_after, I::kFailed) << "nothing to undo";
}

}  // namespace
}  // namespace waystone
