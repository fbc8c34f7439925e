// `notify` steps against counterparts that share no code with Waystone: a LINE push
// API simulator (tests/targets/line_target.py: retry keys with their 24 h window,
// 409 with X-Line-Accepted-Request-Id) and a webhook receiver deduplicating on
// Webhook-Id (tests/targets/webhook_receiver.py). What counts is what they received.

#include <cstdlib>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "model/keys.h"
#include "store/store.h"
#include "support/erp_target.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// An order, its confirmation over LINE and a webhook (a correction for each channel
// that had it, should the order be undone), then a step that fails when asked to.
constexpr char kWorkflow[] = R"(workflow: order-notify
key: "{{input.id}}"
templates:
  confirmed: { version: 2, text: "Order {{steps.create-order.output.number}} is confirmed" }
  cancelled: { version: 1, text: "Order {{steps.create-order.output.number}} is cancelled" }
steps:
  - name: create-order
    transform: { number: "ORD-{{input.id}}" }
  - name: confirm
    notify:
      reports: create-order
      template: confirmed
      correction: cancelled
      recipient: "{{input.customer}}"
      channels:
        line: { to: "{{input.line_id}}", token: "{{secret.LINE_TOKEN}}", url: "{{env.LINE_URL}}" }
        webhook: { url: "{{env.HOOK_URL}}/hooks/orders" }
    retry: { max_attempts: 40, initial_interval: 10ms, max_interval: 20ms }
  - name: ship
    when: { equals: ["{{input.ship}}", fail] }
    request: { method: GET, url: "{{env.LINE_URL}}/v2/no-such-route" }
)";

class NotifyTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    line_ = std::make_unique<testing::TargetProcess>(
        dir_.path(), "line_target.py", std::vector<std::string>{"--token", "line-token-0"});
    hook_ = std::make_unique<testing::TargetProcess>(dir_.path(), "webhook_receiver.py",
                                                     std::vector<std::string>{});
    ASSERT_TRUE(line_->ok() && hook_->ok());
    setenv("LINE_URL", line_->base_url().c_str(), 1);
    setenv("HOOK_URL", hook_->base_url().c_str(), 1);
    setenv("WAYSTONE_SECRET_LINE_TOKEN", "line-token-0", 1);
    auto store = OpenStore({dir_.File("notify.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto definition = LoadDefinitionText(kWorkflow, "order-notify.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = *definition;
  }

  // Runs one instance to rest on the caller's thread.
  InstanceRecord Run(const std::string& ship = "no") {
    if (!engine_) {
      auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
      EXPECT_TRUE(engine.ok()) << engine.status();
      if (!engine.ok()) return {};
      engine_ = std::move(*engine);
    }
    const Json input = {{"id", "o-1"}, {"customer", "c-7"}, {"line_id", "U1"}, {"ship", ship}};
    auto started = engine_->StartInstance(definition_, {"default", input.dump()});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(started->instance.id);
  }

  StepRecord Step(const InstanceRecord& instance, const std::string& name) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok()) << steps.status();
    for (const StepRecord& step : steps.ok() ? *steps : std::vector<StepRecord>{}) {
      if (step.name == name) return step;
    }
    ADD_FAILURE() << "no step " << name;
    return {};
  }

  std::vector<AlertKind> Alerts(const InstanceRecord& instance) {
    std::vector<AlertKind> kinds;
    auto alerts = store_->ListAlerts(instance.id);
    EXPECT_TRUE(alerts.ok()) << alerts.status();
    if (alerts.ok()) {
      for (const AlertRecord& alert : *alerts) kinds.push_back(alert.kind);
    }
    return kinds;
  }

  static void Faults(testing::TargetProcess& target, const Json& faults) {
    const std::string answer = target.Call("POST", "/_target/faults", faults.dump());
    ASSERT_NE(answer.find("\"next\""), std::string::npos) << answer;
  }
  Json LineStats() { return Json::parse(line_->StatsJson()); }
  Json HookStats() { return Json::parse(hook_->StatsJson()); }

  // The texts LINE delivered to `to`, in order.
  std::vector<std::string> LineTexts(const std::string& to) {
    std::vector<std::string> texts;
    const Json stats = LineStats();
    for (const Json& delivery : stats["deliveries"]) {
      if (delivery["to"] == to) texts.push_back(delivery["text"].get<std::string>());
    }
    return texts;
  }

  testing::TempDir dir_;
  SeededRandom random_{11};
  std::unique_ptr<testing::TargetProcess> line_;
  std::unique_ptr<testing::TargetProcess> hook_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
};

TEST_F(NotifyTargetTest, AnswersLostAfterDeliveryNeverDeliverTwice) {
  Faults(*line_, {{"next", {"accept_then_reset"}}});
  Faults(*hook_, {{"next", {"accept_then_close"}}});
  const InstanceRecord instance = Run();
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;

  const Json line = LineStats();
  EXPECT_EQ(LineTexts("U1"), std::vector<std::string>{"Order ORD-o-1 is confirmed"});
  EXPECT_EQ(line["delivered_by_to"]["U1"], 1) << line.dump();
  EXPECT_EQ(line["conflicts_409"], 1) << "the resend under the same retry key: " << line.dump();
  ASSERT_EQ(line["requests"].size(), 2u);
  const Json& first = line["requests"][0];
  EXPECT_EQ(first["retry_key"], line["requests"][1]["retry_key"]);
  const StepRecord confirm_line = Step(instance, "confirm-line");
  EXPECT_EQ(confirm_line.attempts, 2);
  EXPECT_EQ(confirm_line.idempotency_key, "notify:c-7:confirmed@2:default:o-1/create-order:line");
  EXPECT_EQ(first["retry_key"], KeyUuid("default", confirm_line.idempotency_key));
  EXPECT_EQ(confirm_line.external_id, first["request_id"])
      << "the accepted request's id, from X-Line-Accepted-Request-Id";

  const Json hook = HookStats();
  EXPECT_EQ(hook["delivered"], 1) << hook.dump();
  EXPECT_EQ(hook["requests_total"], 2) << hook.dump();
  ASSERT_EQ(hook["deliveries"].size(), 1u);
  const Json& body = hook["deliveries"][0]["body"];
  EXPECT_EQ(body["delivery"], "notify:c-7:confirmed@2:default:o-1/create-order:webhook");
  EXPECT_EQ(body["version"], 2);
  EXPECT_EQ(body["text"], "Order ORD-o-1 is confirmed");
  EXPECT_EQ(body["id"], KeyUuid("default", body["delivery"].get<std::string>()));
}

TEST_F(NotifyTargetTest, WhenTheWebhookFailsOnlyItIsRetriedAndTheOrderStands) {
  Json failing = Json::array();
  for (int i = 0; i < 40; ++i) failing.push_back("status_503");
  Faults(*hook_, {{"next", failing}, {"retry_after_s", 0}});
  const InstanceRecord instance = Run();
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_NE(instance.status_reason.find("confirm-webhook"), std::string::npos)
      << instance.status_reason;
  EXPECT_EQ(Step(instance, "confirm-line").attempts, 1) << "LINE delivered: never resent";
  EXPECT_EQ(Step(instance, "confirm-webhook").attempts, 40);
  EXPECT_EQ(Step(instance, "confirm-webhook").resolution, Resolution::kPassedOver);
  EXPECT_EQ(LineStats()["requests_total"], 1);
  EXPECT_EQ(LineStats()["delivered_by_to"]["U1"], 1);
  EXPECT_EQ(HookStats()["requests_total"], 40);
  EXPECT_EQ(HookStats()["delivered"], 0);
  EXPECT_EQ(Alerts(instance), std::vector<AlertKind>{AlertKind::kOptionalStepFailed});
}

TEST_F(NotifyTargetTest, ACorrectionReachesOnlyTheChannelsThatHadTheOriginal) {
  Json failing = Json::array();
  for (int i = 0; i < 40; ++i) failing.push_back("status_503");
  Faults(*hook_, {{"next", failing}, {"retry_after_s", 0}});
  Faults(*line_, {{"next", {"ok", "accept_then_reset"}}});  // the correction's answer lost
  const InstanceRecord instance = Run("fail");
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  EXPECT_EQ(LineTexts("U1"),
            (std::vector<std::string>{"Order ORD-o-1 is confirmed", "Order ORD-o-1 is cancelled"}));
  const Json line = LineStats();
  EXPECT_EQ(line["conflicts_409"], 1) << "the correction resent under its own key: " << line.dump();
  std::set<std::string> keys;
  for (const Json& request : line["requests"]) {
    if (request["path"] == "/v2/bot/message/push") keys.insert(request["retry_key"]);
  }
  EXPECT_EQ(keys.size(), 2u) << "the correction has an identity of its own";
  EXPECT_EQ(Step(instance, "confirm-line").state, StepState::kCompensated);
  EXPECT_EQ(HookStats()["requests_total"], 40) << "no correction where nothing was delivered";
  EXPECT_EQ(HookStats()["delivered"], 0);
}

}  // namespace
}  // namespace waystone
