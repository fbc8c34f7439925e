// A notify step's email channel against a real SMTP server that shares no code with
// Waystone (tests/targets/smtp: npm smtp-server), beside the LINE simulator. The
// server drops 30 % of its 250 replies to DATA after taking the message: such an
// email is `unknown` and waits for an operator; it is never sent a second time.
// What counts is what the server received.

#include <cstdlib>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "engine/operate/operator_plan.h"
#include "model/keys.h"
#include "store/store.h"
#include "support/erp_target.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kEmailWorkflow[] = R"(workflow: order-mail
key: "{{input.id}}"
templates:
  confirmed:
    version: 4
    subject: "ご注文 {{steps.create-order.output.number}} を承りました"
    text: "Order {{steps.create-order.output.number}} is confirmed.\n.\nありがとうございます"
steps:
  - name: create-order
    transform: { number: "ORD-{{input.id}}" }
  - name: confirm
    notify:
      reports: create-order
      template: confirmed
      recipient: "{{input.customer}}"
      channels:
        line: { to: "{{input.line_id}}", token: "{{secret.LINE_TOKEN}}", url: "{{env.LINE_URL}}" }
        email:
          url: "{{env.SMTP_URL}}"
          from: orders@shop.example
          to: "{{input.email}}"
          user: "{{env.SMTP_USER}}"
          password: "{{secret.SMTP_PASSWORD}}"
    retry: { max_attempts: 6, initial_interval: 10ms, max_interval: 20ms }
)";

class NotifyEmailTest : public ::testing::Test {
 protected:
  void SetUp() override {
    line_ = std::make_unique<testing::TargetProcess>(
        dir_.path(), "line_target.py", std::vector<std::string>{"--token", "line-token-0"});
    smtp_ = std::make_unique<testing::SmtpTarget>(
        dir_.path(), std::vector<std::string>{"--seed", "5", "--password", "smtp-pass-0"});
    ASSERT_TRUE(line_->ok() && smtp_->ok());
    setenv("LINE_URL", line_->base_url().c_str(), 1);
    setenv("SMTP_URL", smtp_->smtp_url().c_str(), 1);
    setenv("SMTP_USER", "mailer", 1);
    setenv("WAYSTONE_SECRET_LINE_TOKEN", "line-token-0", 1);
    setenv("WAYSTONE_SECRET_SMTP_PASSWORD", "smtp-pass-0", 1);
    auto store = OpenStore({dir_.File("mail.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto definition = LoadDefinitionText(kEmailWorkflow, "order-mail.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = *definition;
  }

  // Runs the order `id` (of `definition`, else the workflow above) to rest on the
  // caller's thread (the engine, made at the first run, reads its secrets then).
  InstanceRecord Run(const std::string& id, const WorkflowDefinition* definition = nullptr) {
    if (!engine_) {
      auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
      EXPECT_TRUE(engine.ok()) << engine.status();
      if (!engine.ok()) return {};
      engine_ = std::move(*engine);
    }
    const Json input = {{"id", id},
                        {"customer", "c-" + id},
                        {"line_id", "U-" + id},
                        {"email", id + "@customer.example"}};
    auto started = engine_->StartInstance(definition != nullptr ? *definition : definition_,
                                          {"default", input.dump()});
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

  std::vector<AlertRecord> Alerts(const InstanceRecord& instance) {
    auto alerts = store_->ListAlerts(instance.id);
    EXPECT_TRUE(alerts.ok()) << alerts.status();
    return alerts.ok() ? *alerts : std::vector<AlertRecord>{};
  }

  void SmtpFaults(const Json& faults) {
    const std::string answer = smtp_->Call("POST", "/_target/faults", faults.dump());
    ASSERT_NE(answer.find("\"next\""), std::string::npos) << answer;
  }
  Json SmtpStats() { return Json::parse(smtp_->StatsJson()); }
  Json LineStats() { return Json::parse(line_->StatsJson()); }

  testing::TempDir dir_;
  SeededRandom random_{13};
  std::unique_ptr<testing::TargetProcess> line_;
  std::unique_ptr<testing::SmtpTarget> smtp_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
};

// The order is confirmed on LINE and by email, then its shipment is refused and the
// order undone: the correction goes, under its own identity, to each channel whose
// original was accepted, and to no other.
constexpr char kCorrected[] = R"(workflow: order-mail-corrected
key: "{{input.id}}"
templates:
  confirmed: { version: 1, subject: "Order {{steps.create-order.output.number}}", text: "confirmed" }
  cancelled: { version: 1, subject: "Order {{steps.create-order.output.number}} cancelled", text: "cancelled" }
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
        email:
          url: "{{env.SMTP_URL}}"
          from: orders@shop.example
          to: "{{input.email}}"
          user: "{{env.SMTP_USER}}"
          password: "{{secret.SMTP_PASSWORD}}"
    retry: { max_attempts: 3, initial_interval: 10ms, max_interval: 20ms }
  - name: ship
    idempotency: { honored: true }
    request: { method: POST, url: "{{env.LINE_URL}}/no-such-shipping-api", body: { order: "{{input.id}}" } }
)";

TEST_F(NotifyEmailTest, ACorrectionReachesOnlyTheChannelsThatHadTheOriginal) {
  auto definition = LoadDefinitionText(kCorrected, "order-mail-corrected.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  auto texts = [&](const std::string& to) {
    std::vector<std::string> found;
    const Json stats = LineStats();
    for (const Json& d : stats["deliveries"]) {
      if (d["to"] == to) found.push_back(d["text"].get<std::string>());
    }
    return found;
  };
  auto subjects = [&](const std::string& to) {
    std::vector<std::string> found;
    const Json stats = SmtpStats();
    for (const Json& m : stats["messages"]) {
      if (m["envelope_to"][0] == to) found.push_back(m["subject"].get<std::string>());
    }
    return found;
  };

  // Both originals accepted: both corrected.
  InstanceRecord both = Run("c-1", &*definition);
  EXPECT_EQ(both.state, InstanceState::kCompensated) << both.status_reason;
  EXPECT_EQ(texts("U-c-1"), (std::vector<std::string>{"confirmed", "cancelled"}));
  EXPECT_EQ(subjects("c-1@customer.example"),
            (std::vector<std::string>{"Order ORD-c-1", "Order ORD-c-1 cancelled"}));
  EXPECT_EQ(Step(both, "confirm-email").state, StepState::kCompensated);

  // The email refused for good (550): passed over, so no correction goes by email.
  SmtpFaults({{"next", {"reject_550"}}});
  InstanceRecord line_only = Run("c-2", &*definition);
  EXPECT_EQ(line_only.state, InstanceState::kCompensated) << line_only.status_reason;
  EXPECT_EQ(texts("U-c-2"), (std::vector<std::string>{"confirmed", "cancelled"}));
  EXPECT_EQ(subjects("c-2@customer.example"), std::vector<std::string>{});
  EXPECT_EQ(Step(line_only, "confirm-email").state, StepState::kFailed);

  // The correction's 250 lost after the server took it: never sent again; an operator
  // looks (the compensation stops there, so LINE's correction waits with it).
  SmtpFaults({{"next", {"ok", "accept_then_close"}}});
  InstanceRecord lost = Run("c-3", &*definition);
  EXPECT_EQ(lost.state, InstanceState::kNeedsAttention) << lost.status_reason;
  EXPECT_NE(lost.status_reason.find("it is not sent again"), std::string::npos)
      << lost.status_reason;
  EXPECT_EQ(Step(lost, "confirm-email").state, StepState::kCompensationFailed);
  auto again = engine_->RunUntilRest(lost.id, std::stop_token());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(subjects("c-3@customer.example"),
            (std::vector<std::string>{"Order ORD-c-3", "Order ORD-c-3 cancelled"}))
      << "the correction arrived once, and is not sent again";
  EXPECT_EQ(texts("U-c-3"), std::vector<std::string>{"confirmed"});
  EXPECT_EQ(SmtpStats()["duplicates"], 0);
}

TEST_F(NotifyEmailTest, TheMessageCarriesItsIdentityAndReadsRight) {
  const InstanceRecord instance = Run("o-1");
  ASSERT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const StepRecord email = Step(instance, "confirm-email");
  EXPECT_EQ(email.state, StepState::kCompleted);
  EXPECT_EQ(email.idempotency_key, "notify:c-o-1:confirmed@4:default:o-1/create-order:email");

  const Json stats = SmtpStats();
  ASSERT_EQ(stats["messages_received"], 1) << stats.dump();
  const Json& message = stats["messages"][0];
  EXPECT_EQ(message["envelope_from"], "orders@shop.example");
  EXPECT_EQ(message["envelope_to"], Json::array({"o-1@customer.example"}));
  EXPECT_EQ(message["auth_user"], "mailer");
  EXPECT_EQ(message["message_id"],
            "<" + KeyUuid("default", email.idempotency_key) + "@shop.example>");
  EXPECT_EQ(message["subject"], "ご注文 ORD-o-1 を承りました");
  EXPECT_EQ(message["text"], "Order ORD-o-1 is confirmed.\n.\nありがとうございます")
      << "a lone '.' line survives (the client dot-stuffs it)";
  EXPECT_EQ(message["headers"]["x-waystone-delivery"], email.idempotency_key);
  EXPECT_FALSE(message["headers"]["date"].get<std::string>().empty()) << message.dump();
  EXPECT_EQ(LineStats()["delivered_by_to"]["U-o-1"], 1);
}

TEST_F(NotifyEmailTest, DroppedRepliesAfterDataAreUnknownNeverResent) {
  SmtpFaults({{"drop_percent", 30}});
  constexpr int kOrders = 20;
  std::map<std::string, InstanceRecord> instances;
  for (int i = 0; i < kOrders; ++i) {
    const std::string id = "d-" + std::to_string(i);
    instances[id] = Run(id);
  }
  const Json stats = SmtpStats();
  EXPECT_EQ(stats["messages_received"], kOrders) << "every email was sent exactly once";
  EXPECT_EQ(stats["duplicates"], 0) << stats.dump();
  const int dropped = stats["replies_dropped"].get<int>();
  ASSERT_GT(dropped, 0) << "the seed drops some replies";
  ASSERT_LT(dropped, kOrders);

  int unknown = 0;
  const Json line = LineStats();
  for (const auto& [id, instance] : instances) {
    SCOPED_TRACE(id);
    EXPECT_EQ(line["delivered_by_to"]["U-" + id], 1) << "LINE is not held back by the email";
    EXPECT_EQ(stats["by_recipient"][id + "@customer.example"].size(), 1u);
    const StepRecord email = Step(instance, "confirm-email");
    EXPECT_EQ(email.attempts, 1);
    if (email.state == StepState::kUnknown) {
      ++unknown;
      EXPECT_EQ(instance.state, InstanceState::kNeedsAttention);
      const auto alerts = Alerts(instance);
      ASSERT_EQ(alerts.size(), 1u);
      EXPECT_EQ(alerts[0].kind, AlertKind::kNeedsOperator);
      EXPECT_EQ(alerts[0].step, "confirm-email");
    } else {
      EXPECT_EQ(email.state, StepState::kCompleted);
      EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
    }
  }
  EXPECT_EQ(unknown, dropped) << "exactly the emails whose 250 was lost wait for an operator";

  // The operator finds one in the recipient's mailbox and says so: the instance
  // completes and nothing is sent again.
  for (const auto& [id, instance] : instances) {
    if (instance.state != InstanceState::kNeedsAttention) continue;
    OperatorRequest confirm;
    confirm.action = OperatorAction::kConfirm;
    confirm.step = "confirm-email";
    confirm.reason = "the customer's mailbox has it (Message-ID checked)";
    confirm.actor = "op";
    confirm.happened = true;
    confirm.response_json = "{}";
    auto applied = engine_->operations().Apply("default", instance.key, confirm);
    ASSERT_TRUE(applied.ok()) << applied.status();
    ASSERT_TRUE(engine_->RunUntilRest(instance.id, std::stop_token()).ok());
    EXPECT_EQ(store_->GetInstance(instance.id)->state, InstanceState::kCompleted);
    EXPECT_EQ(Step(instance, "confirm-email").state, StepState::kCompleted);
    break;
  }
  EXPECT_EQ(SmtpStats()["messages_received"], kOrders);
}

TEST_F(NotifyEmailTest, WhenOnlyEmailFailsOnlyEmailIsRetriedAndTheOrderStands) {
  // Refused for now (451) twice, and the connection cut at MAIL FROM: never taken.
  SmtpFaults({{"next", {"reject_451", "close_at_mail", "reject_451"}}});
  const InstanceRecord retried = Run("r-1");
  EXPECT_EQ(retried.state, InstanceState::kCompleted) << retried.status_reason;
  EXPECT_EQ(Step(retried, "confirm-email").attempts, 4);
  EXPECT_EQ(Step(retried, "confirm-line").attempts, 1);
  Json stats = SmtpStats();
  EXPECT_EQ(stats["messages_received"], 1) << stats.dump();
  EXPECT_EQ(stats["rejected"], 2);

  // Refused for good (550): the order stands, the email alerts and is passed over.
  SmtpFaults({{"next", {"reject_550"}}});
  const InstanceRecord refused = Run("r-2");
  EXPECT_EQ(refused.state, InstanceState::kCompleted) << refused.status_reason;
  const StepRecord email = Step(refused, "confirm-email");
  EXPECT_EQ(email.state, StepState::kFailed);
  EXPECT_EQ(email.attempts, 1) << "a permanent refusal is not retried";
  EXPECT_NE(email.error_message.find("550"), std::string::npos) << email.error_message;
  const auto alerts = Alerts(refused);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kOptionalStepFailed);
  EXPECT_EQ(LineStats()["delivered_by_to"]["U-r-2"], 1);
  stats = SmtpStats();
  EXPECT_EQ(stats["messages_received"], 1) << "nothing more was taken";
}

TEST_F(NotifyEmailTest, AWrongPasswordIsRefusedAndNotRetried) {
  setenv("WAYSTONE_SECRET_SMTP_PASSWORD", "not-the-password", 1);
  const InstanceRecord instance = Run("p-1");
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const StepRecord email = Step(instance, "confirm-email");
  EXPECT_EQ(email.state, StepState::kFailed);
  EXPECT_EQ(email.attempts, 1);
  EXPECT_NE(email.error_message.find("535"), std::string::npos) << email.error_message;
  EXPECT_EQ(email.error_message.find("not-the-password"), std::string::npos);
  const Json stats = SmtpStats();
  EXPECT_EQ(stats["messages_received"], 0);
  EXPECT_EQ(stats["auth_failures"], 1);
}

// One delivery per identity: a second instance announcing the same business event to
// the same recipient with the same message sends nothing; its channels are skipped.
TEST_F(NotifyEmailTest, ASecondInstanceOfTheSameDeliverySendsNothing) {
  std::string text = kEmailWorkflow;
  const std::string recipient = "      recipient: \"{{input.customer}}\"\n";
  text.replace(text.find(recipient), recipient.size(),
               recipient + "      event: \"order-confirmed/{{input.order}}\"\n");
  const std::string number = "{{steps.create-order.output.number}}";  // differs per instance
  for (size_t at; (at = text.find(number)) != std::string::npos;) {
    text.replace(at, number.size(), "{{input.order}}");
  }
  auto definition = LoadDefinitionText(text, "order-mail.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  definition_ = *definition;
  std::vector<InstanceRecord> runs;
  for (const char* id : {"s-1", "s-2"}) {
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
    ASSERT_TRUE(engine.ok());
    const Json input = {{"id", id},
                        {"order", "O-9"},
                        {"customer", "c-9"},
                        {"line_id", "U-9"},
                        {"email", "kim@customer.example"}};
    auto started = (*engine)->StartInstance(definition_, {"default", input.dump()});
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_TRUE((*engine)->RunUntilRest(started->instance.id, std::stop_token()).ok());
    runs.push_back(*store_->GetInstance(started->instance.id));
  }
  for (const InstanceRecord& run : runs) {
    EXPECT_EQ(run.state, InstanceState::kCompleted) << run.status_reason;
    EXPECT_TRUE(Alerts(run).empty());
  }
  EXPECT_EQ(Step(runs[0], "confirm-email").state, StepState::kCompleted);
  for (const char* channel : {"confirm-email", "confirm-line"}) {
    const StepRecord skipped = Step(runs[1], channel);
    EXPECT_EQ(skipped.state, StepState::kSkipped) << channel;
    EXPECT_NE(skipped.error_message.find("of another instance"), std::string::npos)
        << skipped.error_message;
  }
  EXPECT_EQ(SmtpStats()["messages_received"], 1);
  EXPECT_EQ(LineStats()["requests_total"], 1);

  // A third instance whose owner gave up: the recipient's server refused the first
  // email for good (550), so nothing of it arrived and the delivery passes on.
  smtp_->Call("POST", "/_target/faults", R"({"next": ["reject_550"]})");
  InstanceRecord third, fourth;
  for (auto [id, out] :
       {std::pair<const char*, InstanceRecord*>{"s-3", &third}, {"s-4", &fourth}}) {
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
    ASSERT_TRUE(engine.ok());
    const Json input = {{"id", id},
                        {"order", "O-10"},
                        {"customer", "c-10"},
                        {"line_id", "U-10"},
                        {"email", "lee@customer.example"}};
    auto started = (*engine)->StartInstance(definition_, {"default", input.dump()});
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_TRUE((*engine)->RunUntilRest(started->instance.id, std::stop_token()).ok());
    *out = *store_->GetInstance(started->instance.id);
  }
  EXPECT_EQ(Step(third, "confirm-email").state, StepState::kFailed);
  EXPECT_EQ(Step(fourth, "confirm-email").state, StepState::kCompleted);
  EXPECT_EQ(Step(fourth, "confirm-line").state, StepState::kSkipped) << "LINE had it from s-3";
  EXPECT_EQ(SmtpStats()["by_recipient"]["lee@customer.example"].size(), 1u);
}

// The client itself: a request withdrawn at the last moment (a lease ran out) never
// reaches DATA, and a message cut at MAIL is not sent; both say so.
TEST_F(NotifyEmailTest, TheClientSaysWhetherTheMessageCouldHaveArrived) {
  HttpRequest request;
  request.url = smtp_->smtp_url();
  request.mail = {.from = "a@shop.example",
                  .to = {"b@customer.example"},
                  .user = "u",
                  .password = "smtp-pass-0"};
  request.body =
      "From: a@shop.example\r\nTo: b@customer.example\r\nSubject: s\r\n"
      "Message-ID: <m-1@shop.example>\r\n\r\nhello\r\n";
  request.may_send = [] { return false; };
  HttpResponse withdrawn = http_->Send(request);
  EXPECT_EQ(withdrawn.outcome.kind, CallOutcome::Kind::kNotSent) << withdrawn.error;
  EXPECT_TRUE(withdrawn.outcome.withdrawn);

  request.may_send = nullptr;
  SmtpFaults({{"next", {"close_at_mail", "accept_then_reset"}}});
  HttpResponse cut = http_->Send(request);
  EXPECT_EQ(cut.outcome.kind, CallOutcome::Kind::kNotSent) << cut.error;
  EXPECT_FALSE(cut.outcome.sent);
  HttpResponse lost = http_->Send(request);
  EXPECT_EQ(lost.outcome.kind, CallOutcome::Kind::kLostAfterSend) << lost.error;
  EXPECT_TRUE(lost.outcome.sent);
  HttpResponse taken = http_->Send(request);
  EXPECT_EQ(taken.outcome.kind, CallOutcome::Kind::kResponse) << taken.error;
  EXPECT_EQ(taken.outcome.status, 250);
  EXPECT_TRUE(taken.outcome.smtp);
  EXPECT_TRUE(taken.body.starts_with("250")) << taken.body;
  EXPECT_EQ(SmtpStats()["messages_received"], 2) << "the lost one and the taken one";
}

}  // namespace
}  // namespace waystone
