// Operator actions as pure plans: which states allow each action, what changes,
// and the preview of what the engine does next.

#include "engine/operate/operator_plan.h"

#include <gtest/gtest.h>

#include "definition/loader.h"
#include "rules/state_machine.h"
#include "support/records.h"

namespace waystone {
namespace {

WorkflowDefinition PlanDefinition() {
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
)",
                                       "w.yaml");
  EXPECT_TRUE(definition.ok()) << definition.status();
  return *definition;
}

using S = StepState;
using I = InstanceState;

using testing::Instance;
using testing::Steps;

std::string PlanKey(int index) { return "k:" + std::string(1, static_cast<char>('a' + index)); }

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
  return PlanOperatorAction(PlanDefinition(), Instance(state), steps, request, 1000, PlanKey);
}

TEST(OperatorPlanTest, ReasonIsMandatory) {
  auto request = Request(OperatorAction::kClose);
  request.reason = "  ";
  auto plan =
      Plan(I::kNeedsAttention,
           Steps({S::kCompleted, S::kFailed, S::kPending, S::kPending, S::kPending}), request);
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
  EXPECT_EQ(Decide(PlanDefinition(), instance, after, 1000).step, 2);
}

TEST(OperatorPlanTest, RetryIsRefusedOutsideTheStepTheInstanceStoppedAt) {
  auto steps = Steps({S::kCompleted, S::kCompleted, S::kFailed, S::kPending, S::kPending});
  EXPECT_EQ(Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "e")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "a")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Plan(I::kCompleted,
                 Steps({S::kCompleted, S::kCompleted, S::kCompleted, S::kCompleted, S::kCompleted}),
                 Request(OperatorAction::kRetry, "a"))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      Plan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "nope")).status().code(),
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
  auto definition = PlanDefinition();
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
)",
                                       "g.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const auto steps = Steps({S::kCompleted, S::kUnknown, S::kFailed});
  auto confirm = Request(OperatorAction::kConfirm, "b");
  confirm.happened = true;
  confirm.response_json = "{}";
  auto happened =
      PlanOperatorAction(*definition, Instance(I::kNeedsAttention), steps, confirm, 1000, PlanKey);
  ASSERT_TRUE(happened.ok()) << happened.status();
  EXPECT_EQ(happened->state_after, I::kCompensating) << "b happened: it is undone";
  EXPECT_NE(happened->status_reason.find("step 'c' had failed"), std::string::npos);
  confirm.happened = false;
  auto not_happened =
      PlanOperatorAction(*definition, Instance(I::kNeedsAttention), steps, confirm, 1000, PlanKey);
  ASSERT_TRUE(not_happened.ok()) << not_happened.status();
  EXPECT_EQ(not_happened->state_after, I::kFailed) << "nothing to undo";
}

// A code workflow's instance: its rows are its function's steps.
std::vector<StepRecord> CodeSteps(std::vector<std::pair<std::string, StepState>> rows) {
  std::vector<StepRecord> steps;
  for (auto& [name, state] : rows) {
    StepRecord step;
    step.index = static_cast<int>(steps.size());
    step.name = name;
    step.state = state;
    step.attempts = 3;
    step.unknowns = 2;
    step.lookups = 2;
    steps.push_back(step);
  }
  return steps;
}

absl::StatusOr<ActionPlan> CodePlan(InstanceState state, const std::vector<StepRecord>& steps,
                                    const OperatorRequest& request) {
  const WorkflowDefinition code = CodeWorkflowDefinition("saga");
  return PlanOperatorAction(code, Instance(state), steps, request, 1000,
                            [](int) { return std::string(); });
}

TEST(OperatorPlanTest, ACodeWorkflowsUnknownStepIsConfirmedNotRetried) {
  const auto steps = CodeSteps({{"read", S::kCompleted}, {"create", S::kUnknown}});
  auto retried = CodePlan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "create"));
  EXPECT_TRUE(absl::IsFailedPrecondition(retried.status())) << retried.status();
  auto compensated = CodePlan(I::kNeedsAttention, steps, Request(OperatorAction::kCompensate));
  EXPECT_TRUE(absl::IsFailedPrecondition(compensated.status())) << compensated.status();

  OperatorRequest happened = Request(OperatorAction::kConfirm, "create");
  happened.happened = true;
  // Happened: with the result the step would have returned (the function decodes it).
  EXPECT_TRUE(absl::IsInvalidArgument(CodePlan(I::kNeedsAttention, steps, happened).status()));
  happened.response_json = R"("ORD-7")";
  happened.external_id = "ORD-7";
  auto plan = CodePlan(I::kNeedsAttention, steps, happened);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state_after, I::kRunning);
  ASSERT_EQ(plan->changed_steps.size(), 1u);
  EXPECT_EQ(plan->changed_steps[0].state, S::kCompleted);
  EXPECT_EQ(plan->changed_steps[0].response_json, R"("ORD-7")");
  EXPECT_EQ(plan->changed_steps[0].resolution, Resolution::kOperator);

  OperatorRequest not_happened = Request(OperatorAction::kConfirm, "create");
  not_happened.happened = false;
  plan = CodePlan(I::kNeedsAttention, steps, not_happened);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->changed_steps.size(), 1u);
  EXPECT_EQ(plan->changed_steps[0].state, S::kFailed);  // runs again when reached
  EXPECT_EQ(plan->changed_steps[0].error_class, ErrorClass::kTransient);
  EXPECT_EQ(plan->changed_steps[0].attempts, 0);  // both retry budgets afresh
  EXPECT_EQ(plan->changed_steps[0].unknowns, 0);
  EXPECT_EQ(plan->changed_steps[0].lookups, 0);
}

TEST(OperatorPlanTest, ACodeWorkflowIsRetriedClosedAndCompensatedButNotSkipped) {
  const auto steps = CodeSteps({{"read", S::kCompleted}, {"create", S::kFailed}});
  auto retried = CodePlan(I::kFailed, steps, Request(OperatorAction::kRetry, "create"));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->state_after, I::kRunning);
  ASSERT_EQ(retried->changed_steps.size(), 1u);
  EXPECT_EQ(retried->changed_steps[0].attempts, 0);
  EXPECT_EQ(retried->changed_steps[0].unknowns, 0);
  EXPECT_EQ(retried->changed_steps[0].lookups, 0);
  // A completed step named: the function runs again from the top (after a fix).
  auto rerun = CodePlan(I::kNeedsAttention, steps, Request(OperatorAction::kRetry, "read"));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->changed_steps.empty());
  EXPECT_EQ(rerun->state_after, I::kRunning);
  EXPECT_TRUE(absl::IsNotFound(
      CodePlan(I::kFailed, steps, Request(OperatorAction::kRetry, "nope")).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      CodePlan(I::kRunning, steps, Request(OperatorAction::kRetry, "create")).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      CodePlan(I::kFailed, steps, Request(OperatorAction::kSkip, "create")).status()));
  auto compensate = CodePlan(I::kFailed, steps, Request(OperatorAction::kCompensate));
  ASSERT_TRUE(compensate.ok()) << compensate.status();
  EXPECT_EQ(compensate->state_after, I::kCompensating);
  // A compensation that failed is retried: the instance goes on compensating.
  const auto undoing = CodeSteps(
      {{"read", S::kCompleted}, {"create", S::kCompensationFailed}, {"notify", S::kCompensated}});
  auto again = CodePlan(I::kNeedsAttention, undoing, Request(OperatorAction::kRetry, "create"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state_after, I::kCompensating);
  ASSERT_EQ(again->changed_steps.size(), 1u);
  EXPECT_EQ(again->changed_steps[0].state, S::kCompleted);
  EXPECT_EQ(again->changed_steps[0].compensation_attempts, 0);
  auto closed = CodePlan(I::kNeedsAttention, steps, Request(OperatorAction::kClose));
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->state_after, I::kClosed);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      CodePlan(I::kClosed, steps, Request(OperatorAction::kClose)).status()));
}

}  // namespace
}  // namespace waystone
