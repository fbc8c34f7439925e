// `when:` conditions and optional (non-critical) steps against
// tests/targets/erp_target.py, an ERP and message service that shares no code with
// Waystone: what counts is the orders and messages it received.

#include <cstdlib>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "store/store.h"
#include "support/erp_target.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// An order (cancelled if a later required step fails), then its confirmation over
// LINE and e-mail, each only when the input has the address and neither holding
// the order back when it fails; the order read back when the input asks; and a
// step whose condition reads the ERP's answer (so that much of it is kept).
constexpr char kWorkflow[] = R"(workflow: order-notify
key: "{{input.id}}"
steps:
  - name: create-order
    recovery: lookup
    request:
      method: POST
      url: "{{env.ERP_URL}}/erp/orders"
      body: { ref: "{{instance.ref}}" }
    result: { external_id: /id }
    lookup:
      request: { method: GET, url: "{{env.ERP_URL}}/erp/orders?ref={{instance.ref}}" }
      items: /items
      match: { /ref: "{{instance.ref}}" }
      external_id: /id
    compensate:
      request: { method: POST, url: "{{env.ERP_URL}}/erp/orders/{{steps.create-order.external_id}}/cancel" }
  - name: notify-line
    when: { present: "{{input.line_id}}" }
    optional: true
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.ERP_URL}}/notify/messages"
      body: { to: "{{input.line_id}}", text: "order {{steps.create-order.external_id}} received" }
    result: { external_id: /id }
    retry: { max_attempts: 2, initial_interval: 10ms }
  - name: notify-email
    when: { present: "{{input.email}}" }
    optional: true
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.ERP_URL}}/notify/messages"
      body: { to: "{{input.email}}", text: "order {{steps.create-order.external_id}} received" }
    result: { external_id: /id }
  - name: read-back
    when: { equals: ["{{input.check}}", "yes"] }
    request:
      method: GET
      url: "{{env.ERP_URL}}/erp/orders/{{steps.create-order.external_id}}"
  - name: mark-open
    when: { equals: ["{{steps.create-order.response.state}}", open] }
    transform: { open: true }
)";

class ConditionalStepsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_unique<testing::ErpTarget>(dir_.path());
    ASSERT_TRUE(target_->ok());
    setenv("ERP_URL", target_->base_url().c_str(), 1);
    auto store = OpenStore({dir_.File("conditional.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionText(kWorkflow, "order-notify.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = *definition;
  }

  // Runs one instance with `input` to rest on the caller's thread.
  InstanceRecord Run(const Json& input) {
    auto started = engine_->StartInstance(definition_, {"default", input.dump()});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(started->instance.id);
  }

  std::vector<StepRecord> Steps(const InstanceRecord& instance) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok()) << steps.status();
    return steps.ok() ? *steps : std::vector<StepRecord>{};
  }

  std::vector<AlertRecord> Alerts(const InstanceRecord& instance) {
    auto alerts = store_->ListAlerts(instance.id);
    EXPECT_TRUE(alerts.ok()) << alerts.status();
    return alerts.ok() ? *alerts : std::vector<AlertRecord>{};
  }

  // The messages the target holds for `to`.
  int MessagesTo(const Json& stats, const std::string& to) {
    int count = 0;
    for (const Json& message : stats["messages_by_content"]) {
      if (message["to"] == to) count += message["count"].get<int>();
    }
    return count;
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  testing::TempDir dir_;
  SeededRandom random_{5};
  std::unique_ptr<testing::ErpTarget> target_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
};

TEST_F(ConditionalStepsTest, AStepWhoseConditionDoesNotHoldIsSkippedAndNothingIsSent) {
  const InstanceRecord instance = Run({{"id", "o-1"}, {"line_id", "U1"}, {"check", "no"}});
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const std::vector<StepRecord> steps = Steps(instance);
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[1].state, StepState::kCompleted);
  EXPECT_EQ(steps[2].state, StepState::kSkipped);
  EXPECT_EQ(steps[2].attempts, 0);
  EXPECT_EQ(steps[2].error_message, "when: present {{input.email}} is false");
  EXPECT_EQ(steps[3].state, StepState::kSkipped);
  EXPECT_EQ(steps[3].error_message, "when: {{input.check}} == yes is false");
  EXPECT_EQ(steps[4].state, StepState::kCompleted);  // judged on the create's kept answer
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["messages"], 1) << stats.dump();
  EXPECT_EQ(MessagesTo(stats, "U1"), 1) << stats.dump();
  EXPECT_EQ(stats["by_route"]["get_order"], 0) << stats.dump();
  EXPECT_TRUE(Alerts(instance).empty());
}

TEST_F(ConditionalStepsTest, AFailedOptionalStepAlertsAndTheOrderStandsWithItsOtherMessage) {
  // The LINE message finds the service busy (503, nothing committed) on both its
  // attempts; the e-mail and the read-back still go, and nothing is compensated.
  ASSERT_TRUE(target_->Faults(R"({"send_message": {"next": ["refuse_503", "refuse_503"]}})"));
  const InstanceRecord instance =
      Run({{"id", "o-2"}, {"line_id", "U2"}, {"email", "a@example.com"}, {"check", "yes"}});
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(instance.status_reason,
            "completed without optional step(s) 'notify-line', which failed");
  const std::vector<StepRecord> steps = Steps(instance);
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[1].state, StepState::kFailed);
  EXPECT_EQ(steps[1].error_class, ErrorClass::kTransient);
  EXPECT_EQ(steps[1].attempts, 2);
  EXPECT_EQ(steps[1].resolution, Resolution::kPassedOver);
  EXPECT_EQ(steps[2].state, StepState::kCompleted);
  EXPECT_EQ(steps[3].state, StepState::kCompleted);
  EXPECT_EQ(steps[4].state, StepState::kCompleted);
  const std::vector<AlertRecord> alerts = Alerts(instance);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kOptionalStepFailed);
  EXPECT_EQ(alerts[0].step, "notify-line");
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(MessagesTo(stats, "U2"), 0) << stats.dump();
  EXPECT_EQ(stats["by_route"]["send_message"], 3) << stats.dump();  // LINE twice, e-mail once
  EXPECT_EQ(MessagesTo(stats, "a@example.com"), 1) << stats.dump();
  EXPECT_EQ(stats["by_route"]["get_order"], 1) << stats.dump();
  EXPECT_EQ(stats["by_route"]["cancel_order"], 0) << stats.dump();
}

TEST_F(ConditionalStepsTest, AnOptionalMessageThatMayHaveGoneWaitsAndAnOperatorSkipsIt) {
  // The LINE service takes the message and resets the connection (the answer is
  // lost), then refuses the resubmission: the message may have gone, so the run
  // neither passes it over nor cancels the order; it waits for an operator.
  ASSERT_TRUE(target_->Faults(R"({"send_message": {"next": ["reset", "reject_422_before"]}})"));
  const InstanceRecord first = Run({{"id", "o-4"}, {"line_id", "U4"}, {"check", "no"}});
  ASSERT_EQ(first.state, InstanceState::kNeedsAttention) << first.status_reason;
  std::vector<StepRecord> steps = Steps(first);
  EXPECT_EQ(steps[1].state, StepState::kFailed);
  EXPECT_EQ(steps[1].unknowns, 1);
  EXPECT_NE(steps[1].resolution, Resolution::kPassedOver);
  bool asks_operator = false;
  for (const AlertRecord& alert : Alerts(first)) {
    asks_operator = asks_operator || alert.kind == AlertKind::kNeedsOperator;
    EXPECT_NE(alert.kind, AlertKind::kOptionalStepFailed);
  }
  EXPECT_TRUE(asks_operator);
  OperatorRequest skip;
  skip.action = OperatorAction::kSkip;
  skip.step = "notify-line";
  skip.reason = "checked with LINE: the message arrived (ticket 9)";
  skip.actor = "night-ops";
  auto applied = engine_->operations().Apply("default", "o-4", skip);
  ASSERT_TRUE(applied.ok()) << applied.status();
  auto rested = engine_->RunUntilRest(first.id, std::stop_token());
  ASSERT_TRUE(rested.ok()) << rested.status();
  const InstanceRecord after = *store_->GetInstance(first.id);
  EXPECT_EQ(after.state, InstanceState::kCompleted) << after.status_reason;
  steps = Steps(after);
  EXPECT_EQ(steps[1].state, StepState::kSkipped);
  EXPECT_EQ(steps[4].state, StepState::kCompleted);
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(MessagesTo(stats, "U4"), 1) << stats.dump();  // the first one, never a second
  EXPECT_EQ(stats["by_route"]["cancel_order"], 0) << stats.dump();
}

TEST_F(ConditionalStepsTest, AConditionThatCannotBeJudgedFailsTheStepNamingIt) {
  // `check` missing: {{input.check}} cannot be rendered, so read-back fails (it is
  // not optional) and the order is cancelled.
  const InstanceRecord instance = Run({{"id", "o-3"}});
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  const std::vector<StepRecord> steps = Steps(instance);
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[1].state, StepState::kSkipped);
  EXPECT_EQ(steps[2].state, StepState::kSkipped);
  EXPECT_EQ(steps[3].state, StepState::kFailed);
  EXPECT_NE(steps[3].error_message.find("when: "), std::string::npos) << steps[3].error_message;
  EXPECT_NE(steps[3].error_message.find("input.check"), std::string::npos)
      << steps[3].error_message;
  EXPECT_EQ(steps[4].state, StepState::kPending);
  const Json stats = Stats();
  EXPECT_EQ(stats["messages"], 0) << stats.dump();
  EXPECT_EQ(stats["by_route"]["get_order"], 0) << stats.dump();
  EXPECT_EQ(stats["by_route"]["cancel_order"], 1) << stats.dump();
}

}  // namespace
}  // namespace waystone
