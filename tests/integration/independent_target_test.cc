// The engine against a target that shares none of our code: tests/targets/erp_target.py
// (Python standard library, raw sockets), which commits an order and then loses the
// answer in every way a real server or proxy does. Counts are what the target
// received. Its create route honours no idempotency key; its message route does.

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

// tests/fixtures/target-order.yaml: check-existing (read), create-order (lookup by
// {{instance.ref}} with match, compensation), notify (honoured key).
std::string WorkflowText() {
  std::string text;
  EXPECT_TRUE(
      ReadFileText(testing::SourceDir() + "/tests/fixtures/target-order.yaml", 1 << 20, &text)
          .ok());
  return text;
}

class IndependentTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_unique<testing::ErpTarget>(dir_.path());
    ASSERT_TRUE(target_->ok());
    setenv("TARGET_URL", target_->base_url().c_str(), 1);
    auto store = OpenStore({dir_.File("target.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto engine = Engine::Create(store_.get(), http_.get(), &clock_, &random_, {});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    definition_ = Load(WorkflowText());
  }

  static WorkflowDefinition Load(const std::string& text) {
    auto definition = LoadDefinitionText(text, "target-order.yaml");
    EXPECT_TRUE(definition.ok()) << definition.status();
    return definition.ok() ? *definition : WorkflowDefinition{};
  }

  static std::string Order(const std::string& id, const std::string& customer = "U-1") {
    return Json{{"order_id", id}, {"customer", customer}, {"amount", 5}}.dump();
  }

  // From here on instances run on the engine's worker pool (two workers, real
  // time), which hands each call to the client's event loop, instead of on the
  // caller's thread.
  void UsePool() {
    engine_.reset();
    EngineOptions options;
    options.workers = 2;
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    engine_->Start();
    pool_ = true;
  }

  InstanceRecord Run(const WorkflowDefinition& definition, const std::string& input,
                     const std::string& tenant = "default") {
    auto started = engine_->StartInstance(definition, {tenant, input});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    if (pool_) {
      auto rested = engine_->AwaitRest(started->instance.id, 30'000);
      EXPECT_TRUE(rested.ok()) << rested.status();
      return *store_->GetInstance(started->instance.id);
    }
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(started->instance.id);
  }

  StepRecord Step(const InstanceRecord& instance, const std::string& name) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok()) << steps.status();
    const std::vector<StepRecord> rows = steps.ok() ? *steps : std::vector<StepRecord>{};
    for (const auto& step : rows) {
      if (step.name == name) return step;
    }
    ADD_FAILURE() << "no step " << name;
    return {};
  }

  std::vector<AlertRecord> Alerts(const InstanceRecord& instance) {
    return *store_->ListAlerts(instance.id);
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  // Requests the target received on `route`.
  int Received(const Json& stats, const std::string& route) {
    return stats["by_route"].contains(route) ? stats["by_route"][route].get<int>() : 0;
  }

  testing::TempDir dir_;
  FakeClock clock_{1'800'000'000'000};
  SeededRandom random_{5};
  std::unique_ptr<testing::ErpTarget> target_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
  bool pool_ = false;
};

// What the HTTP library does on its own when a kept-alive connection closes
// before the first response byte: it sends the request again. This is why every
// engine call takes a fresh connection.
TEST_F(IndependentTargetTest, OnlyAFreshConnectionSendsARequestExactlyOnce) {
  auto client = NewCurlHttpClient({});
  const std::string orders = target_->base_url() + "/erp/orders";
  for (ConnectionReuse reuse : {ConnectionReuse::kReuse, ConnectionReuse::kFresh}) {
    ASSERT_TRUE(
        target_->Faults(R"({"reset": true, "create_order": {"next": ["close_before_bytes"]}})"));
    const int before = Received(Stats(), "create_order");
    HttpRequest warm{"GET", orders + "?ref=warm", {}, "", 2000, reuse};
    ASSERT_EQ(client->Send(warm).outcome.status, 200);
    HttpRequest create{"POST", orders, {}, R"({"ref":"r"})", 2000, reuse};
    HttpResponse answer = client->Send(create);
    const int sent = Received(Stats(), "create_order") - before;
    EXPECT_TRUE(answer.outcome.sent);
    if (reuse == ConnectionReuse::kReuse) {
      // The caller sees one success; the target made two orders.
      EXPECT_EQ(sent, 2) << "libcurl resends on a reused connection that died before any byte";
      EXPECT_EQ(answer.outcome.status, 201);
    } else {
      EXPECT_EQ(sent, 1);
      EXPECT_EQ(answer.outcome.kind, CallOutcome::Kind::kLostAfterSend);
      EXPECT_EQ(answer.outcome.connection, ConnectionUsed::kNew);
    }
  }
}

// The engine's last-moment lease check: a request whose may_send says no when the
// connection is up never reaches the target, and is answered "not sent" (safe to
// retry), while one it lets go is received once.
TEST_F(IndependentTargetTest, ARequestWithdrawnAtTheLastMomentNeverReachesTheTarget) {
  auto client = NewCurlHttpClient({});
  const std::string orders = target_->base_url() + "/erp/orders";
  int asked = 0;
  HttpRequest withdrawn{"POST", orders, {}, R"({"ref":"w"})", 2000};
  withdrawn.may_send = [&asked] {
    ++asked;
    return false;
  };
  HttpResponse answer = client->Send(withdrawn);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(answer.outcome.kind, CallOutcome::Kind::kNotSent) << answer.error;
  EXPECT_FALSE(answer.outcome.sent);
  EXPECT_EQ(Classify(answer.outcome, {}), ErrorClass::kTransient);
  EXPECT_EQ(Received(Stats(), "create_order"), 0) << Stats().dump();
  EXPECT_EQ(Stats()["orders"], 0);

  HttpRequest allowed{"POST", orders, {}, R"({"ref":"a"})", 2000};
  allowed.may_send = [&asked] {
    ++asked;
    return true;
  };
  answer = client->Send(allowed);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(answer.outcome.status, 201) << answer.error;
  EXPECT_EQ(Received(Stats(), "create_order"), 1) << Stats().dump();
  EXPECT_EQ(Stats()["orders"], 1);
}

// Every way a committed create's answer can be lost, for a create with a lookup
// (the target honours no key) and for a notification whose key the target honours,
// driven on the caller's thread and on the worker pool (whose calls wait on the
// HTTP client's event loop, answered on whichever worker is free).
using LostResponseParam = std::tuple<std::string, std::string, std::string>;
class LostResponseTest : public IndependentTargetTest,
                         public ::testing::WithParamInterface<LostResponseParam> {};

TEST_P(LostResponseTest, OneBusinessObjectAndAttemptsEqualRequestsReceived) {
  const auto& [route, shape, driver] = GetParam();
  if (driver == "pool") UsePool();
  ASSERT_TRUE(target_->Faults(Json{{route, {{"next", {shape}}, {"delay_ms", 1500}}}}.dump()));
  InstanceRecord instance = Run(definition_, Order("1"));
  ASSERT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["orders_by_ref"]["default:crm:1"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["messages"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_messages"], 0) << stats.dump();
  const StepRecord create = Step(instance, "create-order");
  const StepRecord notify = Step(instance, "notify");
  EXPECT_EQ(create.attempts, Received(stats, "create_order")) << stats.dump();
  EXPECT_EQ(Step(instance, "check-existing").attempts + create.lookups,
            Received(stats, "find_orders"))
      << stats.dump();
  EXPECT_EQ(notify.attempts, Received(stats, "send_message")) << stats.dump();
  EXPECT_EQ(create.external_id, "ORD-1");
  EXPECT_EQ(notify.external_id, "MSG-1");
  // One attempt record per request received, each on a connection of its own.
  auto attempts = store_->ListAttempts(instance.id);
  ASSERT_TRUE(attempts.ok());
  EXPECT_EQ(static_cast<int>(attempts->size()), Received(stats, "create_order") +
                                                    Received(stats, "find_orders") +
                                                    Received(stats, "send_message"));
  for (const AttemptRecord& a : *attempts) {
    EXPECT_TRUE(a.sent) << a.detail;
    EXPECT_EQ(a.connection, ConnectionUsed::kNew) << a.detail;
  }
  for (const Json& request : stats["requests"]) {
    EXPECT_EQ(request["request_on_connection"], 1) << request.dump();
  }
}

std::string ShapeName(const ::testing::TestParamInfo<LostResponseParam>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LostResponseTest,
    ::testing::Combine(::testing::Values("create_order", "send_message"),
                       ::testing::Values("close_before_bytes", "reset", "partial_status",
                                         "partial_headers", "partial_body", "late", "status_500",
                                         "status_502", "status_504", "refuse_503"),
                       ::testing::Values("caller", "pool")),
    ShapeName);

TEST_F(IndependentTargetTest, KeysWithUrlSpecialCharactersReachTheTargetUnchanged) {
  // Each order's create answer is lost (so the lookup must find it by its ref), and
  // its notification is refused (so its compensation must name it in a URL).
  for (const std::string id : {"A&B #7", "x/y?z=1", "sp ace+plus%25", "Größe ü"}) {
    ASSERT_TRUE(target_->Faults(R"({"create_order": {"next": ["close_before_bytes"]},
                                    "send_message": {"next": ["reject_422_before"]}})"));
    InstanceRecord instance = Run(definition_, Order(id));
    EXPECT_EQ(instance.state, InstanceState::kCompensated) << id << ": " << instance.status_reason;
    const StepRecord create = Step(instance, "create-order");
    EXPECT_EQ(create.resolution, Resolution::kLookupFound) << id;
    const Json order = Json::parse(target_->Call("GET", "/erp/orders/" + create.external_id, ""));
    EXPECT_EQ(order["ref"], "default:crm:" + id);
    EXPECT_EQ(order["state"], "cancelled") << id;
    const Json stats = Stats();
    EXPECT_EQ(stats["orders_by_ref"]["default:crm:" + id], 1) << stats.dump();
    EXPECT_EQ(stats["cancels"][create.external_id], 1) << stats.dump();
  }
  EXPECT_EQ(Stats()["duplicate_orders"], 0);
}

TEST_F(IndependentTargetTest, TwoTenantsSharingATargetEachAdoptAndCompensateOnlyTheirOwn) {
  ASSERT_TRUE(target_->Faults(R"({"send_message": {"next": ["reject_422_before"]}})"));
  InstanceRecord first = Run(definition_, Order("900"), "t1");
  ASSERT_EQ(first.state, InstanceState::kCompensated) << first.status_reason;
  ASSERT_TRUE(target_->Faults(R"({"create_order": {"next": ["close_before_bytes"]},
                                  "send_message": {"next": ["reject_422_before"]}})"));
  InstanceRecord second = Run(definition_, Order("900"), "t2");
  ASSERT_EQ(second.state, InstanceState::kCompensated) << second.status_reason;
  const StepRecord mine = Step(second, "create-order");
  const StepRecord theirs = Step(first, "create-order");
  EXPECT_EQ(mine.resolution, Resolution::kLookupFound);
  EXPECT_NE(mine.external_id, theirs.external_id);
  EXPECT_EQ(Json::parse(target_->Call("GET", "/erp/orders/" + mine.external_id, ""))["ref"],
            "t2:crm:900");
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 2) << stats.dump();
  EXPECT_EQ(stats["cancels"][mine.external_id], 1) << stats.dump();
  EXPECT_EQ(stats["cancels"][theirs.external_id], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_cancels"], 0) << stats.dump();
  // Their keys differ at the target as well.
  EXPECT_NE(mine.idempotency_key, theirs.idempotency_key);
}

TEST_F(IndependentTargetTest, ALookupMatchingTwoObjectsIsAContradictionNotAnAdoption) {
  target_->Call("POST", "/erp/orders", R"({"ref":"default:crm:2"})");
  target_->Call("POST", "/erp/orders", R"({"ref":"default:crm:2"})");
  ASSERT_TRUE(target_->Faults(R"({"create_order": {"next": ["close_before_bytes"]}})"));
  InstanceRecord instance = Run(definition_, Order("2"));
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention);
  const StepRecord create = Step(instance, "create-order");
  EXPECT_EQ(create.state, StepState::kUnknown);
  EXPECT_TRUE(create.external_id.empty());
  auto alerts = Alerts(instance);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kLookupContradiction);
  EXPECT_NE(alerts[0].message.find("found 3 objects"), std::string::npos) << alerts[0].message;
}

TEST_F(IndependentTargetTest, A2xxWithoutItsExternalIdNeverCompletesSilently) {
  // The step expects its id at /order_no, which this target never sends.
  std::string text = WorkflowText();
  text.replace(text.find("result: { external_id: \"/id\" }"), 30,
               "result: { external_id: \"/order_no\" }");
  WorkflowDefinition with_lookup = Load(text);
  InstanceRecord looked = Run(with_lookup, Order("3"));
  // With a lookup, the lookup settles it: the one order is adopted, none is added.
  EXPECT_EQ(looked.state, InstanceState::kCompleted) << looked.status_reason;
  EXPECT_EQ(Step(looked, "create-order").external_id, "ORD-1");
  EXPECT_EQ(Stats()["orders"], 1);

  // Without one, an operator decides; nothing later reads an empty id.
  std::string bare = text;
  bare.erase(bare.find("    lookup:"), bare.find("    compensate:") - bare.find("    lookup:"));
  bare.replace(bare.find("recovery: lookup"), 16, "recovery: manual");
  InstanceRecord paused = Run(Load(bare), Order("4"));
  EXPECT_EQ(paused.state, InstanceState::kNeedsAttention);
  EXPECT_EQ(Step(paused, "create-order").state, StepState::kUnknown);
  auto alerts = Alerts(paused);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kResultMissing);
  EXPECT_EQ(Stats()["orders"], 2);
  EXPECT_EQ(Stats()["messages"], 1);  // only the first instance notified
}

TEST_F(IndependentTargetTest, AnOutcomeStillUnknownWhenRetriesRunOutStaysUnknown) {
  ASSERT_TRUE(target_->Faults(R"({"send_message": {"rate": 1.0, "shape": "close_before_bytes"}})"));
  InstanceRecord instance = Run(definition_, Order("5"));
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention) << instance.status_reason;
  const StepRecord notify = Step(instance, "notify");
  EXPECT_EQ(notify.state, StepState::kUnknown);
  EXPECT_EQ(notify.attempts, 8);  // the fixture's max_attempts
  EXPECT_EQ(Received(Stats(), "send_message"), 8);
  auto alerts = Alerts(instance);
  ASSERT_FALSE(alerts.empty());
  EXPECT_EQ(alerts.back().kind, AlertKind::kRetriesExhausted);
  // Nothing was compensated behind the operator's back.
  EXPECT_EQ(Step(instance, "create-order").state, StepState::kCompleted);
  EXPECT_TRUE(Stats()["cancels"].empty());

  // The operator confirms what the target did; the instance goes on from there.
  OperatorRequest confirm;
  confirm.action = OperatorAction::kConfirm;
  confirm.step = "notify";
  confirm.reason = "message MSG-1 seen in the provider's console";
  confirm.actor = "op";
  confirm.happened = true;
  confirm.external_id = "MSG-1";
  confirm.response_json = R"({"id":"MSG-1"})";
  auto applied = engine_->operations().Apply("default", instance.key, confirm);
  ASSERT_TRUE(applied.ok()) << applied.status();
  ASSERT_TRUE(engine_->RunUntilRest(instance.id, std::stop_token()).ok());
  EXPECT_EQ(store_->GetInstance(instance.id)->state, InstanceState::kCompleted);
  EXPECT_EQ(Stats()["messages"], 1);
}

TEST_F(IndependentTargetTest, ABusinessKeyWithALineBreakIsRefusedAtStart) {
  // The key travels in the Idempotency-Key header of every side-effecting call.
  auto started = engine_->StartInstance(definition_, {"default", Order("A\r\nX-Admin: 1")});
  EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument) << started.status();
  EXPECT_TRUE(Stats()["requests"].empty());
}

TEST_F(IndependentTargetTest, AHeaderThatWouldCarryALineBreakIsNeverSent) {
  std::string text = WorkflowText();
  const std::string notify_url = "url: \"{{env.TARGET_URL}}/notify/messages\"";
  text.replace(text.find(notify_url), notify_url.size(),
               notify_url + "\n      headers: { X-Customer: \"{{input.customer}}\" }");
  InstanceRecord instance = Run(Load(text), Order("6", "U-6\r\nX-Injected: yes"));
  // The notification is refused before anything leaves; the order is compensated.
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  const StepRecord notify = Step(instance, "notify");
  EXPECT_EQ(notify.state, StepState::kFailed);
  EXPECT_NE(notify.error_message.find("line break"), std::string::npos) << notify.error_message;
  EXPECT_EQ(Received(Stats(), "send_message"), 0);
  EXPECT_EQ(Stats()["cancels"][Step(instance, "create-order").external_id], 1);
}

}  // namespace
}  // namespace waystone
