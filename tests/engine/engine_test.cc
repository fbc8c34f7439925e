#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "definition/loader.h"
#include "engine/drive/instance_runner.h"
#include "sim/simulator.h"
#include "store/store.h"
#include "support/backends.h"
#include "support/database_client.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// An engine on a fresh SQLite file, a real libcurl client and a simulator on
// loopback. Time is a FakeClock: retry timers pass instantly and are measured.
class EngineTest : public ::testing::TestWithParam<testing::Backend> {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start({});
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = std::move(*sim);
    for (const char* name : {"CRM_URL", "ERP_URL", "LINE_URL", "EMAIL_URL"}) {
      setenv(name, sim_->base_url().c_str(), 1);
    }
    setenv("WAYSTONE_SECRET_ERP_TOKEN", "erp-secret", 1);
    setenv("WAYSTONE_SECRET_LINE_TOKEN", "line-secret", 1);
    StoreOptions options;
    options.path = testing::FreshStorePath(GetParam(), dir_, "engine");
    ASSERT_FALSE(options.path.empty());
    path_ = options.path;
    auto store = OpenStore(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    EngineOptions engine_options;
    engine_options.lease_duration = 30'000;
    auto engine = Engine::Create(store_.get(), http_.get(), &clock_, &random_, engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionFile(testing::SourceDir() + "/examples/order-to-erp.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    example_ = *definition;
  }

  void TearDown() override {
    engine_.reset();
    sim_->Stop();
  }

  static std::string Order(const std::string& id, const std::string& customer = "C-1") {
    return Json{{"source", "crm"}, {"order_id", id}, {"customer_id", customer}, {"amount", 120}}
        .dump();
  }

  // Replaces the engine with one of `workers` workers on real time (the pool's
  // timers run on its clock).
  void UseRealTimeWorkers(int workers) {
    engine_.reset();
    EngineOptions options;
    options.workers = workers;
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // Starts an instance of `definition` for `tenant` and drives it until it rests.
  InstanceRecord Run(const WorkflowDefinition& definition, const std::string& input,
                     const std::string& tenant = "default") {
    auto started = engine_->StartInstance(definition, {tenant, input});
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

  std::vector<EventRecord> Events(const InstanceRecord& instance) {
    auto events = store_->ListEvents(instance.id);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? *events : std::vector<EventRecord>{};
  }

  StepRecord Step(const InstanceRecord& instance, const std::string& name) {
    for (const auto& step : Steps(instance)) {
      if (step.name == name) return step;
    }
    ADD_FAILURE() << "no step " << name;
    return {};
  }

  Json Stats() { return Json::parse(sim_->StatsJson()); }

  std::vector<std::string> EventTypes(const InstanceRecord& instance) {
    std::vector<std::string> types;
    for (const auto& e : Events(instance)) types.push_back(e.type);
    return types;
  }

  void ExpectExactlyOneOfEach() {
    Json stats = Stats();
    EXPECT_EQ(stats["orders"], 1) << stats.dump();
    EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
    EXPECT_EQ(stats["shipments"], 1) << stats.dump();
    EXPECT_EQ(stats["line_messages"], 1) << stats.dump();
    EXPECT_EQ(stats["emails"], 1) << stats.dump();
    EXPECT_EQ(stats["crm_writebacks"], 1) << stats.dump();
  }

  testing::TempDir dir_;
  std::string path_;  // the store's file or URI
  FakeClock clock_{1'800'000'000'000};
  SeededRandom random_{11};
  std::unique_ptr<Simulator> sim_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition example_;
};

TEST_P(EngineTest, HappyPathCompletesEveryStepOnceWithEvents) {
  InstanceRecord instance = Run(example_, Order("1"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  for (const auto& step : Steps(instance)) {
    EXPECT_EQ(step.state, StepState::kCompleted) << step.name;
    EXPECT_EQ(step.attempts, 1) << step.name;
  }
  EXPECT_EQ(Step(instance, "create-order").external_id, "SO-100001");
  EXPECT_EQ(Step(instance, "create-order").idempotency_key, "default:crm:1:create-order");
  ExpectExactlyOneOfEach();
  auto types = EventTypes(instance);
  ASSERT_EQ(types.size(), 8u);
  EXPECT_EQ(types.front(), "waystone.instance.started");
  EXPECT_EQ(std::count(types.begin(), types.end(), "waystone.step.completed"), 6);
  EXPECT_EQ(types.back(), "waystone.instance.completed");
}

// The last step's outcome and the instance's completion are one commit, not two; the
// steps before it each commit on their own. Read with psql: PostgreSQL stamps each
// outbox row with the id of the transaction that wrote it.
TEST_P(EngineTest, TheLastStepCommitsWithTheInstancesCompletion) {
  if (GetParam() == testing::Backend::kSqlite) {
    GTEST_SKIP() << "SQLite keeps no transaction id to compare";
  }
  InstanceRecord instance = Run(example_, Order("7"));
  ASSERT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const std::string id = std::to_string(instance.id);
  // One line per transaction, oldest first: its events' types, in order.
  const std::string transactions = testing::ClientQuery(
      GetParam(), path_,
      "SELECT string_agg(type, ',' ORDER BY seq) FROM outbox WHERE instance_id = " + id +
          " GROUP BY txid ORDER BY min(seq)",
      dir_.path());
  std::vector<std::string> lines;
  std::istringstream in(transactions);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), 3u) << transactions;
  EXPECT_EQ(lines.back(), "waystone.step.completed,waystone.instance.completed") << transactions;
  EXPECT_EQ(lines[lines.size() - 2], "waystone.step.completed") << transactions;
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "waystone.step.completed"), 5) << transactions;
}

TEST_P(EngineTest, LostResponseBecomesUnknownAndTheLookupAdoptsTheOrder) {
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.create_order": {"next": ["drop_response"]}})").ok());
  InstanceRecord instance = Run(example_, Order("2"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  StepRecord order = Step(instance, "create-order");
  EXPECT_EQ(order.resolution, Resolution::kLookupFound);
  EXPECT_EQ(order.unknowns, 1);
  EXPECT_EQ(order.attempts, 1);
  EXPECT_EQ(order.external_id, "SO-100001");
  ExpectExactlyOneOfEach();
  EXPECT_EQ(Stats()["requests"]["erp.create_order"], 1);
  auto types = EventTypes(instance);
  EXPECT_EQ(std::count(types.begin(), types.end(), "waystone.step.unknown"), 1);
}

TEST_P(EngineTest, TimeoutAfterTheEffectIsResolvedByLookup) {
  ASSERT_TRUE(
      sim_->SetFaults(R"({"erp.create_order": {"next": ["delay"], "delay_ms": 2600}})").ok());
  InstanceRecord instance = Run(example_, Order("3"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(Step(instance, "create-order").resolution, Resolution::kLookupFound);
  ExpectExactlyOneOfEach();
}

TEST_P(EngineTest, UnknownWithNothingFoundResubmitsUnderTheSameKey) {
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.create_order": {"next": ["error"]}})").ok());
  InstanceRecord instance = Run(example_, Order("4"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  StepRecord order = Step(instance, "create-order");
  EXPECT_EQ(order.resolution, Resolution::kResubmitted);
  EXPECT_EQ(order.attempts, 2);
  EXPECT_EQ(order.lookups, 1);
  Json stats = Stats();
  EXPECT_EQ(stats["requests"]["erp.create_order"], 2);
  EXPECT_EQ(stats["distinct_idempotency_keys"]["erp.create_order"], 1);
  EXPECT_EQ(stats["requests"]["erp.find_orders"], 1);
  ExpectExactlyOneOfEach();
}

TEST_P(EngineTest, TransientErrorsAreRetriedHonouringRetryAfter) {
  ASSERT_TRUE(
      sim_->SetFaults(
              R"({"line.push": {"next": ["unavailable", "rate_limit"], "retry_after_s": 3}})")
          .ok());
  const Millis before = clock_.NowMillis();
  InstanceRecord instance = Run(example_, Order("5"));
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(Step(instance, "notify-line").attempts, 3);
  EXPECT_GE(clock_.NowMillis() - before, 6000);  // two Retry-After: 3 waits
  Json stats = Stats();
  EXPECT_EQ(stats["distinct_idempotency_keys"]["line.push"], 1);
  ExpectExactlyOneOfEach();
}

TEST_P(EngineTest, ExhaustedRetriesAlertAndCompensate) {
  ASSERT_TRUE(sim_->SetFaults(R"({"email.send": {"fail": 1.0}})").ok());
  InstanceRecord instance = Run(example_, Order("6"));
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  StepRecord email = Step(instance, "send-email");
  EXPECT_EQ(email.state, StepState::kFailed);
  EXPECT_EQ(email.attempts, 6);
  EXPECT_EQ(email.error_class, ErrorClass::kTransient);
  EXPECT_EQ(Step(instance, "create-order").state, StepState::kCompensated);
  auto alerts = *store_->ListAlerts(instance.id);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kRetriesExhausted);
  EXPECT_EQ(alerts[0].step, "send-email");
  Json stats = Stats();
  EXPECT_EQ(stats["requests"]["email.send"], 6);
  EXPECT_EQ(stats["cancel_requests"], 1);
  EXPECT_EQ(stats["orders_cancelled"], 1);
}

TEST_P(EngineTest, RejectionAtTheThirdStepCancelsTheOrderExactlyOnce) {
  InstanceRecord instance = Run(example_, Order("7", "C-BLOCKED-7"));
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  StepRecord shipment = Step(instance, "reserve-shipment");
  EXPECT_EQ(shipment.state, StepState::kFailed);
  EXPECT_EQ(shipment.error_class, ErrorClass::kRejected);
  EXPECT_EQ(shipment.attempts, 1);
  StepRecord order = Step(instance, "create-order");
  EXPECT_EQ(order.state, StepState::kCompensated);
  EXPECT_EQ(order.compensation_attempts, 1);
  EXPECT_EQ(Step(instance, "notify-line").state, StepState::kPending);
  Json stats = Stats();
  EXPECT_EQ(stats["cancel_requests"], 1);
  EXPECT_EQ(stats["orders_cancelled"], 1);
  EXPECT_EQ(stats["line_messages"], 0);
  EXPECT_EQ(stats["distinct_idempotency_keys"]["erp.cancel_order"], 1);
  auto types = EventTypes(instance);
  EXPECT_EQ(std::count(types.begin(), types.end(), "waystone.step.compensated"), 1);
  EXPECT_EQ(types.back(), "waystone.instance.compensated");
}

TEST_P(EngineTest, FailingCancelIsRetriedThenStopsWithAlertAndContext) {
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.cancel_order": {"fail": 1.0}})").ok());
  InstanceRecord instance = Run(example_, Order("8", "C-BLOCKED-8"));
  EXPECT_EQ(instance.state, InstanceState::kNeedsAttention);
  StepRecord order = Step(instance, "create-order");
  EXPECT_EQ(order.state, StepState::kCompensationFailed);
  EXPECT_EQ(order.compensation_attempts, 4);
  auto alerts = *store_->ListAlerts(instance.id);
  ASSERT_EQ(alerts.size(), 1u);
  EXPECT_EQ(alerts[0].kind, AlertKind::kCompensationFailed);
  // The operator sees which object, which key and what went wrong.
  EXPECT_NE(alerts[0].message.find(order.external_id), std::string::npos) << alerts[0].message;
  EXPECT_NE(alerts[0].message.find("crm:8:create-order:compensate"), std::string::npos);
  EXPECT_NE(alerts[0].message.find("503"), std::string::npos);
  EXPECT_NE(instance.status_reason.find("compensation"), std::string::npos);
  EXPECT_EQ(Stats()["requests"]["erp.cancel_order"], 4);
}

TEST_P(EngineTest, SecretsReachRequestsButAreNeverStored) {
  InstanceRecord instance = Run(example_, Order("9"));
  ASSERT_EQ(instance.state, InstanceState::kCompleted);
  for (const auto& step : Steps(instance)) {
    EXPECT_EQ(step.response_json.find("erp-secret"), std::string::npos);
  }
  for (const auto& event : Events(instance)) {
    EXPECT_EQ(event.payload_json.find("erp-secret"), std::string::npos);
  }
}

TEST_P(EngineTest, AStepKeepsOnlyWhatTheTemplatesReadOfItsAnswer) {
  // The simulated CRM answers id, name, email, line_user_id, address_ok; the
  // workflow reads all but the name, so the name is never stored.
  InstanceRecord instance = Run(example_, Order("pii-1", "C-77"));
  ASSERT_EQ(instance.state, InstanceState::kCompleted);
  const Json kept = Json::parse(Step(instance, "fetch-customer").response_json);
  EXPECT_EQ(kept["id"], "C-77");
  EXPECT_TRUE(kept.contains("email") && kept.contains("line_user_id") &&
              kept.contains("address_ok"))
      << kept.dump();
  EXPECT_FALSE(kept.contains("name")) << kept.dump();

  // `store_response: none` keeps nothing, `all` everything, a list those pointers.
  for (const auto& [keep, expect_name, expect_id] :
       {std::tuple{"none", false, false}, std::tuple{"all", true, true},
        std::tuple{"[/name]", true, true}}) {
    std::string text = example_.text;
    const std::string anchor = "  - name: fetch-customer\n";
    const size_t at = text.find(anchor);
    ASSERT_NE(at, std::string::npos);
    text.insert(at + anchor.size(), std::string("    store_response: ") + keep + "\n");
    if (std::string(keep) == "none") {
      // Nothing kept: no later step may read it.
      text = std::string(R"(workflow: keep-none
key: "{{input.order_id}}"
steps:
  - name: fetch-customer
    store_response: none
    request: { method: GET, url: "{{env.CRM_URL}}/crm/customers/{{input.customer_id}}" }
)");
    }
    auto definition = LoadDefinitionText(text, std::string("keep-") + keep + ".yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    ASSERT_TRUE(engine_->Register(*definition).ok());
    InstanceRecord run = Run(*definition, Order(std::string("pii-") + keep, "C-78"));
    ASSERT_EQ(run.state, InstanceState::kCompleted) << keep << ": " << run.status_reason;
    const Json stored = Json::parse(Step(run, "fetch-customer").response_json);
    EXPECT_EQ(stored.contains("name"), expect_name) << keep << ": " << stored.dump();
    EXPECT_EQ(stored.contains("id"), expect_id) << keep << ": " << stored.dump();
  }
}

// With a worker free, a start is created leased to this engine and handed to that
// worker: the instance runs to its end under the start's lease (epoch 1; a claim
// would have made it 2). Without one (the workers stopped), it is created for any
// worker and the dispatcher claims it once they run.
TEST_P(EngineTest, AStartWithAWorkerFreeIsCreatedLeasedToItAndNeedsNoClaim) {
  ASSERT_NO_FATAL_FAILURE(UseRealTimeWorkers(2));
  engine_->Start();
  auto started = engine_->StartInstance(example_, {"default", Order("9")});
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->instance.lease_owner, engine_->owner());
  EXPECT_EQ(started->instance.lease_epoch, 1);
  auto rested = engine_->AwaitRest(started->instance.id, 30'000);
  ASSERT_TRUE(rested.ok()) << rested.status();
  EXPECT_EQ(rested->state, InstanceState::kCompleted) << rested->status_reason;
  EXPECT_EQ(rested->lease_epoch, 1);
  // The same start again finds it; the worker it reserved is given back.
  auto again = engine_->StartInstance(example_, {"default", Order("9")});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, StartOutcome::kExisting);
  EXPECT_TRUE(
      testing::WaitFor([&] { return engine_->Idle().value_or(false); }, std::chrono::seconds(10)));

  engine_->Stop();
  auto queued = engine_->StartInstance(example_, {"default", Order("10", "C-2")});
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->instance.lease_owner, "");
  EXPECT_EQ(queued->instance.lease_epoch, 0);
  engine_->Start();
  rested = engine_->AwaitRest(queued->instance.id, 30'000);
  ASSERT_TRUE(rested.ok()) << rested.status();
  EXPECT_EQ(rested->state, InstanceState::kCompleted) << rested->status_reason;
  EXPECT_EQ(rested->lease_epoch, 1);
  engine_->Stop();
  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 2) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
}

// A caller awaiting an instance a local worker drives takes the row that worker
// committed when it left the instance at rest, instead of reading it back: it must be
// what the store reads, whichever way the instance came to rest (its last step's
// commit finishing it; a rejection, a compensation, then the finish on its own).
TEST_P(EngineTest, TheRowAWorkerHandsToAwaitRestIsWhatTheStoreReads) {
  ASSERT_NO_FATAL_FAILURE(UseRealTimeWorkers(2));
  engine_->Start();
  const std::pair<std::string, InstanceState> cases[] = {
      {Order("20"), InstanceState::kCompleted},
      {Order("21", "C-BLOCKED-21"), InstanceState::kCompensated}};
  for (const auto& [input, rest] : cases) {
    auto started = engine_->StartInstance(example_, {"default", input});
    ASSERT_TRUE(started.ok()) << started.status();
    auto rested = engine_->AwaitRest(started->instance.id, 30'000);
    ASSERT_TRUE(rested.ok()) << rested.status();
    EXPECT_EQ(rested->state, rest) << rested->status_reason;
    auto stored = store_->GetInstance(started->instance.id);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(*rested, *stored) << input;
    EXPECT_EQ(rested->lease_owner, "");
    EXPECT_EQ(rested->lease_expires_at, 0);
  }
  engine_->Stop();
}

// The first drive of an instance this engine started begins from what the start
// created (CreatedBy) instead of reading it back: the two must be the same.
TEST_P(EngineTest, WhatAStartCreatedIsWhatTheStoreReadsBack) {
  auto started = engine_->StartInstance(example_, {"default", Order("12")});
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_EQ(started->outcome, StartOutcome::kCreated);
  std::vector<std::string> names;
  for (const auto& step : example_.steps) names.push_back(step.name);
  const CreatedInstance created = CreatedBy(started->instance, names);
  auto instance = store_->GetInstance(started->instance.id);
  auto steps = store_->GetSteps(started->instance.id);
  ASSERT_TRUE(instance.ok()) << instance.status();
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(created.instance, *instance);
  ASSERT_EQ(created.steps.size(), steps->size());
  for (size_t i = 0; i < steps->size(); ++i) {
    EXPECT_EQ(created.steps[i], (*steps)[i]) << "step " << i << " " << (*steps)[i].name;
  }
}

// Two tenants' sql steps on one business table (issue 45, item 10: globex's UPDATE changed
// acme's row). Each touches its own rows only, counted by the database's own client; a
// statement that could touch another tenant's is refused where the definition is
// registered, and an engine with tenants does not run one stored before them.
TEST_P(EngineTest, SqlStepsOfTwoTenantsTouchOnlyTheirOwnRows) {
  auto query = [&](const std::string& sql) {
    return testing::ClientQuery(GetParam(), path_, sql, dir_.path());
  };
  query(
      "CREATE TABLE accounts (tenant TEXT NOT NULL, k TEXT NOT NULL, v INTEGER NOT NULL, "
      "PRIMARY KEY (tenant, k))");
  query("INSERT INTO accounts VALUES ('acme', 'A1', 1), ('globex', 'A1', 1)");
  const char* rows = "SELECT tenant, k, v FROM accounts ORDER BY tenant, k";
  engine_.reset();
  EngineOptions options;
  const TenantPolicy policy{{"ledger", "unscoped"}, "", {}};
  options.tenants = {{"acme", policy}, {"globex", policy}};
  auto engine = Engine::Create(store_.get(), http_.get(), &clock_, &random_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  engine_ = std::move(*engine);

  auto ledger = LoadDefinitionText(R"yaml(workflow: ledger
key: "{{input.k}}-{{input.v}}"
steps:
  - name: set
    sql:
      statement: "UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k RETURNING k"
      params: { k: "{{input.k}}", v: "{{input.v}}" }
  - name: add
    sql:
      statement: "INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v)"
      params: { k: "{{input.k}}-new", v: "{{input.v}}" }
)yaml",
                                   "ledger.yaml");
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ASSERT_TRUE(engine_->Register(*ledger).ok());
  EXPECT_EQ(Run(*ledger, R"({"k":"A1","v":99})", "globex").state, InstanceState::kCompleted);
  EXPECT_EQ(query(rows), "acme|A1|1\nglobex|A1|99\nglobex|A1-new|99");
  EXPECT_EQ(Run(*ledger, R"({"k":"A1","v":7})", "acme").state, InstanceState::kCompleted);
  const std::string after = "acme|A1|7\nacme|A1-new|7\nglobex|A1|99\nglobex|A1-new|99";
  EXPECT_EQ(query(rows), after);

  // The probe's statement.
  auto unscoped = LoadDefinitionText(R"yaml(workflow: unscoped
key: "{{input.k}}-{{input.v}}"
steps:
  - name: set
    sql:
      statement: "UPDATE accounts SET v = :v WHERE k = :k"
      params: { k: "{{input.k}}", v: "{{input.v}}" }
)yaml",
                                     "unscoped.yaml");
  ASSERT_TRUE(unscoped.ok()) << unscoped.status();
  const absl::Status refused = engine_->Register(*unscoped);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find(
                "unscoped.yaml:4: step 'set': sql.statement is not scoped to its tenant"),
            std::string::npos)
      << refused;
  auto refused_start = engine_->StartInstance(*unscoped, {"globex", R"({"k":"A1","v":4})"});
  EXPECT_EQ(refused_start.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused_start.status().message().find("step 'set': sql.statement is not scoped"),
            std::string::npos)
      << refused_start.status();
  // One started by a runtime without tenants, before they were configured, does not run.
  int64_t id = 0;
  {
    auto plain = Engine::Create(store_.get(), http_.get(), &clock_, &random_, EngineOptions{});
    ASSERT_TRUE(plain.ok()) << plain.status();
    auto started = (*plain)->StartInstance(*unscoped, {"globex", R"({"k":"A1","v":5})"});
    ASSERT_TRUE(started.ok()) << started.status();
    id = started->instance.id;
  }
  clock_.Advance(60'000);  // past any lease the start took
  auto rest = engine_->RunUntilRest(id, std::stop_token());
  ASSERT_TRUE(rest.ok()) << rest.status();
  const InstanceRecord stopped = *store_->GetInstance(id);
  EXPECT_NE(stopped.state, InstanceState::kCompleted);
  EXPECT_NE(Step(stopped, "set").error_message.find("not scoped to its tenant"), std::string::npos)
      << Step(stopped, "set").error_message;
  EXPECT_EQ(query(rows), after);
}

TEST_P(EngineTest, WorkerPoolRunsManyInstancesConcurrently) {
  ASSERT_NO_FATAL_FAILURE(UseRealTimeWorkers(8));
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.create_order": {"drop_response": 0.2},
                                  "line.push": {"unavailable": 0.2, "retry_after_s": 0}})")
                  .ok());
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(engine_
                    ->StartInstance(example_, {"default", Order("p" + std::to_string(i),
                                                                "C-" + std::to_string(i))})
                    .ok());
  }
  engine_->Start();
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto idle = engine_->Idle();
        return idle.ok() && *idle;
      },
      std::chrono::seconds(60)));
  engine_->Stop();
  auto completed =
      store_->ListInstances({std::nullopt, std::nullopt, InstanceState::kCompleted, 100});
  EXPECT_EQ(completed->size(), 30u);
  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 30) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0);
  EXPECT_EQ(stats["line_messages"], 30);
  EXPECT_EQ(stats["duplicate_line_messages"], 0);
  EXPECT_EQ(stats["emails"], 30);
}

// Every shape in which the simulator loses an answer after committing, on the
// order (a create with a lookup; the simulated ERP honours no key for it) and on
// the LINE push (an honoured key): one of everything, attempts = requests received.
class SimulatorShapeTest : public EngineTest {};

TEST_P(SimulatorShapeTest, EveryLostResponseShapeEndsWithOneOfEverything) {
  for (const std::string shape :
       {"close_before_bytes", "reset", "partial_status", "partial_headers", "drop_response",
        "delay", "status_500", "status_502", "status_504"}) {
    ASSERT_TRUE(sim_->SetFaults(Json{{"erp.create_order", {{"next", {shape}}, {"delay_ms", 2200}}},
                                     {"line.push", {{"next", {shape}}, {"delay_ms", 2200}}}}
                                    .dump())
                    .ok());
    const Json before = Stats();
    InstanceRecord instance = Run(example_, Order("shape-" + shape));
    EXPECT_EQ(instance.state, InstanceState::kCompleted) << shape << ": " << instance.status_reason;
    const Json after = Stats();
    EXPECT_EQ(after["faults"]["erp.create_order"][shape].get<int>() -
                  before["faults"].value("erp.create_order", Json::object()).value(shape, 0),
              1)
        << shape << " was not applied";
    auto received = [&](const char* route) {
      return after["requests"].value(route, 0) - before["requests"].value(route, 0);
    };
    EXPECT_EQ(Step(instance, "create-order").attempts, received("erp.create_order")) << shape;
    EXPECT_EQ(Step(instance, "create-order").lookups, received("erp.find_orders")) << shape;
    EXPECT_EQ(Step(instance, "notify-line").attempts, received("line.push")) << shape;
    EXPECT_EQ(after["duplicate_orders"], 0) << shape;
    EXPECT_EQ(after["duplicate_line_messages"], 0) << shape;
    EXPECT_EQ(after["orders"].get<int>() - before["orders"].get<int>(), 1) << shape;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SimulatorShapeTest, ::testing::Values(testing::Backend::kSqlite),
                         testing::BackendName);

// The reused-connection shape hits only a request on a kept-alive connection: what
// libcurl then does by itself (send it again) is why the engine never reuses one.
TEST(SimulatorTest, TheReusedConnectionShapeOnlyHitsReusedConnections) {
  auto sim = Simulator::Start({});
  ASSERT_TRUE(sim.ok());
  ASSERT_TRUE(
      (*sim)->SetFaults(R"({"erp.create_order": {"next": ["close_before_bytes_reused"]}})").ok());
  auto client = NewCurlHttpClient({});
  const std::string url = (*sim)->base_url() + "/erp/orders";
  for (ConnectionReuse reuse : {ConnectionReuse::kFresh, ConnectionReuse::kReuse}) {
    for (int i = 0; i < 2; ++i) {
      HttpRequest create{"POST", url,  {}, Json{{"ref", "r"}, {"customer", "C-1"}}.dump(),
                         2000,   reuse};
      EXPECT_EQ(client->Send(create).outcome.status, 201);
    }
  }
  const Json stats = Json::parse((*sim)->StatsJson());
  // Fresh: never faulted. Reused: the second request lost its answer before any
  // byte and libcurl sent it again on a new connection, unseen by its caller.
  EXPECT_EQ(stats["faults"]["erp.create_order"]["close_before_bytes_reused"], 1) << stats.dump();
  EXPECT_EQ(stats["requests"]["erp.create_order"], 5) << stats.dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineTest,
                         ::testing::Values(testing::Backend::kSqlite, testing::Backend::kPostgres),
                         testing::BackendName);

}  // namespace
}  // namespace waystone
