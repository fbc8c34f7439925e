// An approval's deadlines are durable timers the worker pool keeps: on a fake
// clock moved by the test, the engine's own workers remind, escalate (the group it
// escalated to may decide from then on) and time out the request, each once, on
// SQLite and PostgreSQL.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "rules/approvals.h"
#include "store/store.h"
#include "support/backends.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr Millis kHour = 3'600'000;

constexpr char kWorkflow[] = R"(workflow: deadlines
key: "{{input.id}}"
steps:
  - name: approve
    approval:
      material: [/amount]
      approvers: { group: finance }
      remind_after: 1h
      escalate_after: 2h
      escalate_to: leads
      timeout: 3h
      on_timeout: wait
  - name: done
    transform: { by: "{{steps.approve.response.decision.by}}" }
)";

class ApprovalClockTest : public ::testing::TestWithParam<testing::Backend> {
 protected:
  void SetUp() override {
    StoreOptions options;
    options.path = testing::FreshStorePath(GetParam(), dir_, "clock");
    ASSERT_FALSE(options.path.empty());
    auto store = OpenStore(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    EngineOptions engine_options;
    engine_options.workers = 2;
    engine_options.lease_duration = 30'000;
    auto engine = Engine::Create(store_.get(), http_.get(), &clock_, &random_, engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto definition = LoadDefinitionText(kWorkflow, "deadlines.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = *definition;
    ASSERT_TRUE(engine_->Register(definition_).ok());
  }

  void TearDown() override {
    if (engine_) engine_->Stop();
    engine_.reset();
  }

  InstanceRecord Start(const std::string& id) {
    const std::string input = Json{{"id", id}, {"amount", 9}}.dump();
    auto started = engine_->StartInstance(definition_, {"t1", input});
    EXPECT_TRUE(started.ok()) << started.status();
    return started.ok() ? started->instance : InstanceRecord{};
  }

  std::vector<std::string> ApprovalEvents(const InstanceRecord& instance) {
    std::vector<std::string> types;
    auto events = store_->ListEvents(instance.id);
    EXPECT_TRUE(events.ok()) << events.status();
    for (const EventRecord& e : *events) {
      if (e.type.starts_with("waystone.approval.")) types.push_back(e.type);
    }
    return types;
  }

  // Waits (real time) until `condition` holds of the instance's approval step.
  using Condition = std::function<bool(const StepRecord&, const InstanceRecord&)>;
  bool Until(const InstanceRecord& instance, const Condition& condition) {
    return testing::WaitFor(
        [&] {
          auto steps = store_->GetSteps(instance.id);
          auto now = store_->GetInstance(instance.id);
          return steps.ok() && now.ok() && condition((*steps)[0], *now);
        },
        std::chrono::seconds(20));
  }

  testing::TempDir dir_;
  FakeClock clock_{1'800'000'000'000};
  SeededRandom random_{21};
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
};

TEST_P(ApprovalClockTest, TheWorkersRemindEscalateAndTimeOutAsTheClockMoves) {
  engine_->Start();
  const InstanceRecord decided = Start("d1");
  const InstanceRecord forgotten = Start("f1");
  const Millis opened = clock_.NowMillis();
  ASSERT_TRUE(Until(decided, [](const StepRecord& s, const InstanceRecord&) {
    return s.state == StepState::kWaiting;
  }));
  ASSERT_TRUE(Until(forgotten, [](const StepRecord& s, const InstanceRecord&) {
    return s.state == StepState::kWaiting;
  }));
  // Nothing before its deadline.
  clock_.Advance(kHour - 1000);
  EXPECT_EQ(ApprovalEvents(decided), std::vector<std::string>{"waystone.approval.requested"});

  clock_.Set(opened + kHour);
  // The worker that recorded the reminder lets go of the instance before a
  // person acts on it (an operator's action waits for a held lease only so long).
  ASSERT_TRUE(Until(decided, [](const StepRecord& s, const InstanceRecord& i) {
    return s.response_json.find("reminded_at") != std::string::npos && i.lease_expires_at == 0;
  }));
  // A lead may not decide yet.
  auto decision = [&](const std::string& actor, std::vector<std::string> groups) {
    auto steps = store_->GetSteps(decided.id);
    Decision d;
    d.step = "approve";
    d.request = 1;
    d.data_version = (*steps)[0].request_hash;
    d.approve = true;
    d.actor = actor;
    d.role = "viewer";
    d.groups = std::move(groups);
    return engine_->operations().Decide("t1", "d1", d);
  };
  EXPECT_EQ(decision("lena", {"leads"}).status().code(), absl::StatusCode::kPermissionDenied);

  clock_.Set(opened + 2 * kHour);
  ASSERT_TRUE(Until(decided, [](const StepRecord& s, const InstanceRecord& i) {
    return s.response_json.find("escalated_to") != std::string::npos && i.lease_expires_at == 0;
  }));
  auto taken = decision("lena", {"leads"});
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(Until(decided, [](const StepRecord&, const InstanceRecord& i) {
    return i.state == InstanceState::kCompleted;
  }));

  clock_.Set(opened + 3 * kHour);
  ASSERT_TRUE(Until(forgotten, [](const StepRecord&, const InstanceRecord& i) {
    return i.state == InstanceState::kNeedsAttention;
  }));
  EXPECT_EQ(ApprovalEvents(decided),
            (std::vector<std::string>{"waystone.approval.requested", "waystone.approval.reminder",
                                      "waystone.approval.escalated"}));
  auto steps = store_->GetSteps(forgotten.id);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ((*steps)[0].state, StepState::kFailed);
  EXPECT_EQ((*steps)[0].error_message, "no decision within 3h");
  EXPECT_EQ(ApprovalEvents(forgotten),
            (std::vector<std::string>{"waystone.approval.requested", "waystone.approval.reminder",
                                      "waystone.approval.escalated"}));
  auto audit = store_->ListAudit(forgotten.id);
  ASSERT_TRUE(audit.ok());
  int timed_out = 0;
  for (const AuditRecord& a : *audit) timed_out += a.action == "approval_timed_out";
  EXPECT_EQ(timed_out, 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, ApprovalClockTest,
                         ::testing::Values(testing::Backend::kSqlite, testing::Backend::kPostgres),
                         testing::BackendName);

}  // namespace
}  // namespace waystone
