// The engine against a scripted HttpClient (tests/support/fake_http_client.h):
// no sockets, no simulator. What these tests check is the engine's side of a call
// (which requests, how many, under which key, what it concludes), not transport.
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "definition/loader.h"
#include "engine/drive/call_metrics.h"
#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "model/keys.h"
#include "store/store.h"
#include "support/backends.h"
#include "support/fake_http_client.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;
using testing::FakeReply;

// The routes of examples/order-to-erp.yaml for customer C-1 (order SO-1).
constexpr char kCustomer[] = "GET /crm/customers/C-1";
constexpr char kCreateOrder[] = "POST /erp/orders";
constexpr char kFindOrders[] = "GET /erp/orders";
constexpr char kCancelOrder[] = "POST /erp/orders/SO-1/cancel";
constexpr char kShipment[] = "POST /erp/shipments";
constexpr char kLinePush[] = "POST /line/push";
constexpr char kEmail[] = "POST /email/messages";
constexpr char kLinkInCrm[] = "PUT /crm/customers/C-1/orders/SO-1";

// An engine on a fresh store, a FakeHttpClient and a FakeClock (a timeout moves
// it on by the request's timeout; retry timers pass instantly).
class EngineFakeHttpTest : public ::testing::TestWithParam<testing::Backend> {
 protected:
  void SetUp() override {
    for (const char* name : {"CRM_URL", "ERP_URL", "LINE_URL", "EMAIL_URL"}) {
      setenv(name, "http://fake.invalid", 1);
    }
    setenv("WAYSTONE_SECRET_ERP_TOKEN", "erp-secret", 1);
    setenv("WAYSTONE_SECRET_LINE_TOKEN", "line-secret", 1);
    StoreOptions options;
    options.path = testing::FreshStorePath(GetParam(), dir_, "engine");
    ASSERT_FALSE(options.path.empty());
    auto store = OpenStore(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    EngineOptions engine_options;
    engine_options.lease_duration = 30'000;
    engine_options.call_metrics = &metrics_;
    auto engine = Engine::Create(store_.get(), &http_, &clock_, &random_, engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionFile(testing::SourceDir() + "/examples/order-to-erp.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    example_ = *definition;
  }

  void TearDown() override { engine_.reset(); }

  static std::string Order(const std::string& id, const std::string& customer = "C-1") {
    return Json{{"source", "crm"}, {"order_id", id}, {"customer_id", customer}, {"amount", 120}}
        .dump();
  }

  // Every route of the example answers as a healthy downstream would.
  void AnswerTheExample() {
    http_.Always(kCustomer, FakeReply::Answer(200, Json{{"id", "C-1"},
                                                        {"name", "Aiko"},
                                                        {"email", "a@x"},
                                                        {"line_user_id", "U1"},
                                                        {"address_ok", true}}
                                                       .dump()));
    http_.Always(kCreateOrder, FakeReply::Answer(201, R"({"id": "SO-1"})"));
    http_.Always(kFindOrders, FakeReply::Answer(200, R"({"items": []})"));
    http_.Always(kCancelOrder, FakeReply::Answer(200, R"({"status": "cancelled"})"));
    http_.Always(kShipment, FakeReply::Answer(201, R"({"id": "SH-1"})"));
    http_.Always(kLinePush, FakeReply::Answer(200, R"({"sentMessages": [{"id": "L-1"}]})"));
    http_.Always(kEmail, FakeReply::Answer(202, R"({"message_id": "E-1"})"));
    http_.Always(kLinkInCrm, FakeReply::Answer(200, R"({"status": "linked"})"));
  }

  absl::StatusOr<StartResult> Start(const WorkflowDefinition& definition,
                                    const std::string& input) {
    return engine_->StartInstance(definition, {"default", input});
  }

  InstanceRecord Drive(int64_t id) {
    auto state = engine_->RunUntilRest(id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(id);
  }

  // Starts an instance of `definition` and drives it until it rests.
  InstanceRecord Run(const WorkflowDefinition& definition, const std::string& input) {
    auto started = Start(definition, input);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    return Drive(started->instance.id);
  }

  StepRecord Step(const InstanceRecord& instance, const std::string& name) {
    auto steps = store_->GetSteps(instance.id);
    EXPECT_TRUE(steps.ok()) << steps.status();
    for (const auto& step : steps.ok() ? *steps : std::vector<StepRecord>{}) {
      if (step.name == name) return step;
    }
    ADD_FAILURE() << "no step " << name;
    return {};
  }

  // The distinct Idempotency-Key headers the requests on `route` carried.
  std::set<std::string> KeysSentTo(const std::string& route) {
    std::set<std::string> keys;
    for (const HttpRequest& request : http_.Requests(route)) {
      for (const auto& [name, value] : request.headers) {
        if (name == "Idempotency-Key") keys.insert(value);
      }
    }
    return keys;
  }

  testing::TempDir dir_;
  FakeClock clock_{1'800'000'000'000};
  testing::FakeHttpClient http_{&clock_};
  CallMetrics metrics_;
  SeededRandom random_{11};
  std::unique_ptr<Store> store_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition example_;
};

// One delivery row per identity, created in the same transaction as the business
// step it reports: once the order is created (and before anything is sent) the LINE
// channel's delivery identity is reserved for this instance's channel step. A second
// instance reaching the same identity finds it taken; the owner's send fills it in.
TEST_P(EngineFakeHttpTest, TheReportedStepsCommitReservesItsDeliveries) {
  AnswerTheExample();
  http_.Always("POST /v2/bot/message/push", FakeReply::Answer(200, "{}"));
  auto definition = LoadDefinitionText(R"(workflow: owed
key: "{{input.order_id}}"
templates:
  confirmed: { version: 1, text: "Order {{steps.create-order.external_id}} is confirmed" }
steps:
  - name: create-order
    idempotency: { honored: true }
    request: { method: POST, url: "{{env.ERP_URL}}/erp/orders", body: { ref: "{{input.order_id}}" } }
    result: { external_id: "/id" }
  - name: hold
    wait: { event: go }
  - name: confirm
    notify:
      reports: create-order
      template: confirmed
      recipient: "{{input.customer_id}}"
      event: "confirmed/{{input.customer_id}}"
      channels:
        line: { to: U1, token: "{{secret.LINE_TOKEN}}", url: "{{env.LINE_URL}}" }
)",
                                       "owed.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const std::string identity = "notify:C-1:confirmed@1:confirmed/C-1:line";
  const InstanceRecord first = Run(*definition, Order("o-1"));
  ASSERT_EQ(Step(first, "hold").state, StepState::kWaiting) << first.status_reason;
  EXPECT_EQ(http_.Count("POST /v2/bot/message/push"), 0) << "nothing sent yet";
  auto owed = store_->GetIdempotencyClaim("default", identity);
  ASSERT_TRUE(owed.ok()) << owed.status();
  ASSERT_TRUE(owed->has_value()) << "reserved with the order's checkpoint";
  EXPECT_EQ((*owed)->instance_id, first.id);
  EXPECT_EQ((*owed)->step, "confirm-line");
  EXPECT_EQ((*owed)->request_hash, "") << "the message is rendered when it is sent";

  const InstanceRecord second = Run(*definition, Order("o-2"));
  ASSERT_EQ(Step(second, "hold").state, StepState::kWaiting);
  EXPECT_EQ((*store_->GetIdempotencyClaim("default", identity))->instance_id, first.id)
      << "a reservation never takes a delivery from its owner";
}

// The reported step completed by an operator (its outcome confirmed): the delivery is
// reserved in the confirm's transaction, as a worker's commit would.
TEST_P(EngineFakeHttpTest, AnOperatorsConfirmReservesTheDeliveriesItReports) {
  http_.Next(kCreateOrder, FakeReply::Timeout());
  http_.Always("POST /v2/bot/message/push", FakeReply::Answer(200, "{}"));
  auto definition = LoadDefinitionText(R"(workflow: confirmed-by-hand
key: "{{input.order_id}}"
templates:
  confirmed: { version: 1, text: "Order {{steps.create-order.external_id}} is confirmed" }
steps:
  - name: create-order
    recovery: manual
    request: { method: POST, url: "{{env.ERP_URL}}/erp/orders", body: { ref: "{{input.order_id}}" }, timeout: 1s }
    result: { external_id: "/id" }
  - name: confirm
    notify:
      reports: create-order
      template: confirmed
      recipient: "{{input.customer_id}}"
      channels:
        line: { to: U1, token: "{{secret.LINE_TOKEN}}", url: "{{env.LINE_URL}}" }
)",
                                       "by-hand.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const InstanceRecord paused = Run(*definition, Order("o-7"));
  ASSERT_EQ(paused.state, InstanceState::kNeedsAttention) << paused.status_reason;
  const std::string identity = "notify:C-1:confirmed@1:default:o-7/create-order:line";
  EXPECT_FALSE(store_->GetIdempotencyClaim("default", identity)->has_value());
  OperatorRequest confirm;
  confirm.action = OperatorAction::kConfirm;
  confirm.step = "create-order";
  confirm.happened = true;
  confirm.external_id = "SO-7";
  confirm.reason = "found in the ERP";
  confirm.actor = "ops";
  auto applied = engine_->operations().Apply("default", paused.key, confirm);
  ASSERT_TRUE(applied.ok()) << applied.status();
  auto owed = *store_->GetIdempotencyClaim("default", identity);
  ASSERT_TRUE(owed.has_value()) << "reserved with the confirm";
  EXPECT_EQ(owed->step, "confirm-line");
  EXPECT_EQ(owed->request_hash, "");
  EXPECT_EQ(Drive(paused.id).state, InstanceState::kCompleted);
  EXPECT_EQ(http_.Count("POST /v2/bot/message/push"), 1);
  EXPECT_NE((*store_->GetIdempotencyClaim("default", identity))->request_hash, "")
      << "filled in when it was sent";
}

// Two branches call at once; the WMS branch is refused for good while the ERP
// branch's call is under way (the fake answers in the order sent: `reserve` first).
// The refusal waits for the ERP answer (its outcome is recorded, not left running),
// then the completed ERP step is undone: one cancel.
TEST_P(EngineFakeHttpTest, ABranchRefusedBesideACallUnderWayWaitsForItThenUndoesIt) {
  AnswerTheExample();
  http_.Always("POST /wms/reserve", FakeReply::Answer(422, R"({"error": "no stock"})"));
  auto definition = LoadDefinitionText(R"(workflow: side-by-side
key: "{{input.order_id}}"
steps:
  - name: both
    parallel:
      - name: reserve
        idempotency: { honored: true }
        request: { method: POST, url: "{{env.ERP_URL}}/wms/reserve", body: { ref: "{{input.order_id}}" } }
      - name: create-order
        recovery: compensable
        idempotency: { honored: true }
        request: { method: POST, url: "{{env.ERP_URL}}/erp/orders", body: { ref: "{{input.order_id}}" } }
        result: { external_id: "/id" }
        compensate:
          request: { method: POST, url: "{{env.ERP_URL}}/erp/orders/{{steps.create-order.external_id}}/cancel" }
)",
                                       "side.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const InstanceRecord instance = Run(*definition, Order("o-9"));
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  EXPECT_EQ(Step(instance, "create-order").state, StepState::kCompensated);
  EXPECT_EQ(Step(instance, "reserve").state, StepState::kFailed);
  EXPECT_EQ(http_.Count(kCreateOrder), 1);
  EXPECT_EQ(http_.Count("POST /wms/reserve"), 1);
  EXPECT_EQ(http_.Count(kCancelOrder), 1);
}

TEST_P(EngineFakeHttpTest, AStartWakesAnIdlePoolAndAwaitRestReturnsTheResult) {
  AnswerTheExample();
  // A pool that polls only every ten minutes, on real time: only a wake-up from the
  // start can have it run the instance within the wait below.
  EngineOptions options;
  options.workers = 2;
  options.poll_interval = 600'000;
  options.call_metrics = &metrics_;
  auto pool = Engine::Create(store_.get(), &http_, SystemClock::Get(), &random_, options);
  ASSERT_TRUE(pool.ok()) << pool.status();

  auto first = (*pool)->StartInstance(example_, {"default", Order("O-1")});
  ASSERT_TRUE(first.ok()) << first.status();
  // Nobody drives it yet: the wait runs out and shows it as it is.
  auto waited = (*pool)->AwaitRest(first->instance.id, 200);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->state, InstanceState::kRunning);

  (*pool)->Start();
  waited = (*pool)->AwaitRest(first->instance.id, 20'000);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->state, InstanceState::kCompleted) << waited->status_reason;

  // Deliberately let the dispatcher find nothing more and go to sleep for its poll.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto second = (*pool)->StartInstance(example_, {"default", Order("O-2", "C-1")});
  ASSERT_TRUE(second.ok()) << second.status();
  waited = (*pool)->AwaitRest(second->instance.id, 20'000);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->state, InstanceState::kCompleted) << "the start did not wake the pool";
  (*pool)->Stop();
}

// A caller awaiting an instance takes the row its worker committed: with a secret a
// downstream echoed into the reason it came to rest with, that row is redacted as
// the stored one is.
TEST_P(EngineFakeHttpTest, TheRowAwaitRestTakesFromItsWorkerIsRedactedAsStored) {
  AnswerTheExample();
  http_.Always(kCreateOrder,
               FakeReply::Answer(422, R"({"error": "token erp-secret may not order"})"));
  EngineOptions options;
  options.workers = 2;
  options.call_metrics = &metrics_;
  auto pool = Engine::Create(store_.get(), &http_, SystemClock::Get(), &random_, options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  (*pool)->Start();
  auto started = (*pool)->StartInstance(example_, {"default", Order("O-9")});
  ASSERT_TRUE(started.ok()) << started.status();
  auto rested = (*pool)->AwaitRest(started->instance.id, 20'000);
  (*pool)->Stop();
  ASSERT_TRUE(rested.ok()) << rested.status();
  auto stored = store_->GetInstance(started->instance.id);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_NE(stored->status_reason.find("***"), std::string::npos) << stored->status_reason;
  EXPECT_EQ(rested->status_reason.find("erp-secret"), std::string::npos) << rested->status_reason;
  EXPECT_EQ(*rested, *stored) << rested->status_reason;
}

TEST_P(EngineFakeHttpTest, TheExampleSendsOneRequestPerStepAndCountsThemInTheGivenMetrics) {
  AnswerTheExample();
  InstanceRecord instance = Run(example_, Order("1"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  for (const char* route : {kCustomer, kCreateOrder, kShipment, kLinePush, kEmail, kLinkInCrm}) {
    EXPECT_EQ(http_.Count(route), 1) << route;
  }
  EXPECT_EQ(http_.Requests().size(), 6u);
  EXPECT_EQ(Step(instance, "create-order").external_id, "SO-1");
  EXPECT_EQ(Step(instance, "send-email").external_id, "E-1");
  // The engine counted into the CallMetrics its options named, nowhere else.
  EXPECT_EQ(&engine_->call_metrics(), &metrics_);
  EXPECT_EQ(metrics_.OutcomeCount(CallPhase::kCall, ErrorClass::kNone), 6u);
  EXPECT_EQ(metrics_.LatencySnapshot(CallPhase::kCall).count, 6u);
  EXPECT_EQ(metrics_.LatencySnapshot(CallPhase::kLookup).count, 0u);
  CallMetrics unused;
  EXPECT_EQ(unused.LatencySnapshot(CallPhase::kCall).count, 0u);
}

TEST_P(EngineFakeHttpTest, AFailureBeforeSendingIsRetriedUnderTheSameKeyWithoutALookup) {
  AnswerTheExample();
  http_.Next(kCreateOrder, FakeReply::FailBeforeSend());
  http_.Next(kCreateOrder, FakeReply::FailBeforeSend());
  InstanceRecord instance = Run(example_, Order("2"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  StepRecord order = Step(instance, "create-order");
  EXPECT_EQ(order.attempts, 3);
  EXPECT_EQ(order.unknowns, 0);
  EXPECT_EQ(order.lookups, 0);
  EXPECT_EQ(http_.Count(kCreateOrder), 3);
  EXPECT_EQ(http_.Count(kFindOrders), 0);
  EXPECT_EQ(KeysSentTo(kCreateOrder).size(), 1u);
  EXPECT_EQ(metrics_.OutcomeCount(CallPhase::kCall, ErrorClass::kTransient), 2u);
}

TEST_P(EngineFakeHttpTest, AFailureAfterSendingIsUnknownAndTheLookupAdoptsTheOrder) {
  AnswerTheExample();
  auto started = Start(example_, Order("3"));
  ASSERT_TRUE(started.ok()) << started.status();
  const std::string ref = InstanceRef(started->instance.tenant, started->instance.key);
  http_.Next(kCreateOrder, FakeReply::FailAfterSend());
  http_.Next(kFindOrders,
             FakeReply::Answer(200, Json{{"items", {{{"id", "SO-1"}, {"ref", ref}}}}}.dump()));
  InstanceRecord instance = Drive(started->instance.id);
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  StepRecord order = Step(instance, "create-order");
  EXPECT_EQ(order.resolution, Resolution::kLookupFound);
  EXPECT_EQ(order.unknowns, 1);
  EXPECT_EQ(order.attempts, 1);
  EXPECT_EQ(order.external_id, "SO-1");
  EXPECT_EQ(http_.Count(kCreateOrder), 1);  // adopted, never sent again
  EXPECT_EQ(http_.Count(kFindOrders), 1);
  EXPECT_EQ(metrics_.OutcomeCount(CallPhase::kCall, ErrorClass::kUnknown), 1u);
  EXPECT_EQ(metrics_.OutcomeCount(CallPhase::kLookup, ErrorClass::kNone), 1u);
}

TEST_P(EngineFakeHttpTest, RetryAfterIsWaitedOutOnTheClock) {
  AnswerTheExample();
  FakeReply unavailable = FakeReply::Answer(503, "{}");
  unavailable.retry_after = 3000;
  http_.Next(kLinePush, unavailable);
  http_.Next(kLinePush, unavailable);
  const Millis before = clock_.NowMillis();
  InstanceRecord instance = Run(example_, Order("4"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(Step(instance, "notify-line").attempts, 3);
  EXPECT_GE(clock_.NowMillis() - before, 6000);  // two Retry-After: 3 waits
  EXPECT_EQ(KeysSentTo(kLinePush).size(), 1u);
}

TEST_P(EngineFakeHttpTest, ManualStepWithUnknownOutcomePausesForAnOperator) {
  auto definition = LoadDefinitionText(R"(workflow: manual-notify
key: "{{input.id}}"
steps:
  - name: push
    recovery: manual
    request:
      method: POST
      url: "{{env.LINE_URL}}/line/push"
      body: { to: "U1", messages: [ { type: text, text: "hello {{input.id}}" } ] }
      timeout: 1s
)",
                                       "manual.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  http_.Next(kLinePush, FakeReply::Timeout());  // sent; no answer within the 1 s timeout
  const Millis before = clock_.NowMillis();
  InstanceRecord instance = Run(*definition, R"({"id": "m1"})");
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention);
  EXPECT_EQ(Step(instance, "push").state, StepState::kUnknown);
  auto alerts = *store_->ListAlerts(instance.id);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kNeedsOperator);
  EXPECT_EQ(http_.Count(kLinePush), 1);  // never resubmitted on its own
  EXPECT_GE(clock_.NowMillis() - before, 1000);
}

TEST_P(EngineFakeHttpTest, ReusedKeyWithAnotherRequestIsAnIdempotencyConflict) {
  auto definition = LoadDefinitionText(R"(workflow: shared-key
key: "{{input.id}}"
steps:
  - name: push
    idempotency: { key: "notify:{{input.customer}}", honored: true }
    request:
      method: POST
      url: "{{env.LINE_URL}}/line/push"
      body: { to: "{{input.customer}}", messages: [ { type: text, text: "{{input.id}}" } ] }
)",
                                       "shared.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  http_.Always(kLinePush, FakeReply::Answer(200, R"({"sentMessages": [{"id": "L-1"}]})"));
  InstanceRecord first = Run(*definition, R"({"id": "a", "customer": "U9"})");
  EXPECT_EQ(first.state, InstanceState::kCompleted);
  InstanceRecord second = Run(*definition, R"({"id": "b", "customer": "U9"})");
  EXPECT_EQ(second.state, InstanceState::kFailed);
  StepRecord push = Step(second, "push");
  EXPECT_EQ(push.state, StepState::kFailed);
  EXPECT_NE(push.error_message.find("notify:U9"), std::string::npos) << push.error_message;
  auto alerts = *store_->ListAlerts(second.id);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kIdempotencyConflict);
  EXPECT_EQ(http_.Count(kLinePush), 1);  // the second request never left
}

TEST_P(EngineFakeHttpTest, BadInputIsRefusedAndWritesNothing) {
  const std::string big =
      Json{{"source", "crm"}, {"order_id", "x"}, {"pad", std::string(kMaxInputBytes, 'x')}}.dump();
  for (const std::string& input :
       {std::string("not json"), std::string("[1,2]"), std::string(R"({"source": "crm"})"), big}) {
    auto started = engine_->StartInstance(example_, {"default", input});
    ASSERT_FALSE(started.ok()) << input.substr(0, 40);
    EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(store_->ListInstances({})->empty());
  EXPECT_TRUE(http_.Requests().empty());
}

TEST_P(EngineFakeHttpTest, SameStartTwiceAndConcurrentStartsMakeOneInstance) {
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<StartResult>> results(8, absl::UnknownError("not run"));
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      results[i] = engine_->StartInstance(example_, {"default", Order("10")});
    });
  }
  for (auto& t : threads) t.join();
  int created = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    created += r->outcome == StartOutcome::kCreated ? 1 : 0;
    EXPECT_EQ(r->instance.id, results[0]->instance.id);
  }
  EXPECT_EQ(created, 1);
  StartRequest event{"default", Order("11"), "crm", "evt-11"};
  auto first = engine_->StartInstance(example_, event);
  auto again = engine_->StartInstance(example_, event);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(again->outcome, StartOutcome::kDuplicateEvent);
  EXPECT_EQ(store_->ListInstances({})->size(), 2u);
  auto conflict = engine_->StartInstance(example_, {"default", Order("10", "C-other")});
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kFailedPrecondition);
}

// An operator action waits for a worker's lease on the engine's clock: with a
// FakeClock its patience runs out (it used to sleep on real time and, as the fake
// clock never moved, wait forever).
TEST_P(EngineFakeHttpTest, AnOperatorActionGivesUpOnAHeldLeaseAfterItsPatience) {
  AnswerTheExample();
  auto started = Start(example_, Order("12"));
  ASSERT_TRUE(started.ok()) << started.status();
  auto held =
      store_->ClaimInstance(started->instance.id, "another-worker", clock_.NowMillis(), 60'000);
  ASSERT_TRUE(held.ok()) << held.status();
  const Millis before = clock_.NowMillis();
  OperatorRequest close;
  close.action = OperatorAction::kClose;
  close.reason = "test";
  close.actor = "op";
  auto result = engine_->operations().Apply("default", started->instance.key, close);
  EXPECT_TRUE(absl::IsAborted(result.status())) << result.status();
  EXPECT_GE(clock_.NowMillis() - before, 3000);
  EXPECT_EQ(store_->GetInstance(started->instance.id)->state, InstanceState::kRunning);
}

// Operations holds an instance under its lease for one action or event, and lets it
// go on every way out: refused by the plan, a dry run, no step waiting for an event,
// and a change committed. Another worker can take the instance at once after each.
TEST_P(EngineFakeHttpTest, EveryWayOutOfAnOperatorActionOrEventLetsTheInstanceGo) {
  AnswerTheExample();
  auto started = Start(example_, Order("13"));
  ASSERT_TRUE(started.ok()) << started.status();
  const int64_t id = started->instance.id;
  auto free_for_another = [&](const char* after) {
    const InstanceRecord instance = *store_->GetInstance(id);
    EXPECT_EQ(instance.lease_expires_at, 0) << after << ": still held by " << instance.lease_owner;
    auto taken = store_->ClaimInstance(id, "another-worker", clock_.NowMillis(), 60'000);
    ASSERT_TRUE(taken.ok()) << after << ": " << taken.status();
    Change release;
    release.lease = *taken;
    release.now = clock_.NowMillis();
    release.lease_expires_at = 0;
    ASSERT_TRUE(store_->Commit({release}).ok());
  };
  free_for_another("the start");

  OperatorRequest confirm;  // no step is unknown: the plan refuses it
  confirm.action = OperatorAction::kConfirm;
  confirm.step = "create-order";
  confirm.happened = true;
  confirm.reason = "test";
  confirm.actor = "op";
  auto refused = engine_->operations().Apply("default", started->instance.key, confirm);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  free_for_another("a refused action");

  Signal nobody_waits;
  nobody_waits.tenant = "default";
  nobody_waits.key = started->instance.key;
  nobody_waits.event_type = "order.paid";
  nobody_waits.source = "test";
  nobody_waits.id = "evt-1";
  nobody_waits.data_json = "{}";
  nobody_waits.actor = "op";
  auto delivered = engine_->operations().Deliver(nobody_waits);
  EXPECT_EQ(delivered.status().code(), absl::StatusCode::kFailedPrecondition) << delivered.status();
  free_for_another("an event no step waits for");

  OperatorRequest close;
  close.action = OperatorAction::kClose;
  close.reason = "test";
  close.actor = "op";
  close.dry_run = true;
  auto previewed = engine_->operations().Apply("default", started->instance.key, close);
  ASSERT_TRUE(previewed.ok()) << previewed.status();
  EXPECT_FALSE(previewed->applied);
  free_for_another("a dry run");

  close.dry_run = false;
  auto closed = engine_->operations().Apply("default", started->instance.key, close);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_TRUE(closed->applied);
  free_for_another("a committed action");
}

// Each attempt names the worker and lease epoch it was sent under: after a second
// worker takes over an expired lease, its attempt shows it and a newer epoch.
TEST_P(EngineFakeHttpTest, AnAttemptAfterATakeoverShowsTheNewWorkerAndANewerEpoch) {
  auto definition = LoadDefinitionText(R"(workflow: manual-notify
key: "{{input.id}}"
steps:
  - name: push
    recovery: manual
    request:
      method: POST
      url: "{{env.LINE_URL}}/line/push"
      body: { to: "U1", messages: [ { type: text, text: "hello {{input.id}}" } ] }
      timeout: 1s
)",
                                       "manual.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  http_.Next(kLinePush, FakeReply::Timeout());
  http_.Always(kLinePush, FakeReply::Answer(200, R"({"sentMessages": [{"id": "L-9"}]})"));
  InstanceRecord instance = Run(*definition, R"({"id": "t1"})");
  ASSERT_EQ(instance.state, InstanceState::kNeedsAttention);
  OperatorRequest resend;  // it did not happen: send it again
  resend.action = OperatorAction::kConfirm;
  resend.step = "push";
  resend.happened = false;
  resend.reason = "LINE shows no such message";
  resend.actor = "op";
  auto retried = engine_->operations().Apply("default", instance.key, resend);
  ASSERT_TRUE(retried.ok()) << retried.status();
  // The first worker claims it again and stops without a word: its lease runs out.
  ASSERT_TRUE(
      store_->ClaimInstance(instance.id, engine_->owner(), clock_.NowMillis(), 30'000).ok());
  clock_.Advance(31'000);
  EngineOptions options;
  options.owner = "worker-b";
  options.reap_dead_local_owners = false;
  auto second = Engine::Create(store_.get(), &http_, &clock_, &random_, options);
  ASSERT_TRUE(second.ok()) << second.status();
  auto rested = (*second)->RunUntilRest(instance.id, std::stop_token());
  ASSERT_TRUE(rested.ok()) << rested.status();
  EXPECT_EQ(*rested, InstanceState::kCompleted);
  EXPECT_EQ(http_.Count(kLinePush), 2);
  EXPECT_EQ(store_->Summary()->lease_takeovers, 1);
  auto attempts = store_->ListAttemptPage({instance.id, std::nullopt, std::nullopt, 10});
  ASSERT_TRUE(attempts.ok()) << attempts.status();
  ASSERT_EQ(attempts->size(), 2u);
  const AttemptRecord& newest = (*attempts)[0];
  const AttemptRecord& first = (*attempts)[1];
  EXPECT_EQ(first.worker, engine_->owner());
  EXPECT_EQ(first.error_class, ErrorClass::kUnknown);
  EXPECT_EQ(newest.worker, "worker-b");
  EXPECT_EQ(newest.status, 200);
  EXPECT_GT(first.lease_epoch, 0);
  // The takeover's epoch is the current one; the first attempt's is older.
  EXPECT_EQ(newest.lease_epoch, store_->GetInstance(instance.id)->lease_epoch);
  EXPECT_GT(newest.lease_epoch, first.lease_epoch);
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineFakeHttpTest,
                         ::testing::Values(testing::Backend::kSqlite, testing::Backend::kPostgres),
                         testing::BackendName);

}  // namespace
}  // namespace waystone
