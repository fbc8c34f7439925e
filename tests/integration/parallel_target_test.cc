// Parallel groups against the independent webhook receiver
// (tests/targets/webhook_receiver.py): a branch waiting for its retry holds no other,
// and a failure after the group undoes the completed branches in reverse. What counts
// is the order in which the receiver got them. And against a slow endpoint
// (tests/targets/slow_target.py): the branches' calls are open at once.

#include <algorithm>
#include <cstdlib>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "store/store.h"
#include "support/erp_target.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Two branches, each undone by a call of its own; then `done`, refused (400: it sends
// no Webhook-Id) when the input says so.
constexpr char kParallelWorkflow[] = R"(workflow: parallel
key: "{{input.id}}"
steps:
  - name: updates
    parallel:
      - name: to-crm
        recovery: compensable
        idempotency: { honored: true }
        request:
          method: POST
          url: "{{env.HOOK_URL}}/crm"
          headers: { Webhook-Id: "{{step.key_uuid}}" }
          body: { order: "{{input.id}}" }
        compensate:
          request:
            method: POST
            url: "{{env.HOOK_URL}}/undo-crm"
            headers: { Webhook-Id: "{{step.key_uuid}}" }
            body: { order: "{{input.id}}" }
        retry: { max_attempts: 3, initial_interval: 10ms }
      - branch: wms
        steps:
          - name: to-wms
            recovery: compensable
            idempotency: { honored: true }
            request:
              method: POST
              url: "{{env.HOOK_URL}}/wms"
              headers: { Webhook-Id: "{{step.key_uuid}}" }
              body: { order: "{{input.id}}" }
            compensate:
              request:
                method: POST
                url: "{{env.HOOK_URL}}/undo-wms"
                headers: { Webhook-Id: "{{step.key_uuid}}" }
                body: { order: "{{input.id}}" }
          - name: wms-label
            idempotency: { honored: true }
            request:
              method: POST
              url: "{{env.HOOK_URL}}/wms-label"
              headers: { Webhook-Id: "{{step.key_uuid}}" }
              body: { order: "{{input.id}}" }
  - name: done
    idempotency: { honored: true }
    request:
      method: POST
      url: "{{env.HOOK_URL}}/done"
      headers: { Webhook-Id: "{{input.done_id}}" }
      body: { order: "{{input.id}}" }
)";

class ParallelTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hook_ = std::make_unique<testing::TargetProcess>(dir_.path(), "webhook_receiver.py",
                                                     std::vector<std::string>{});
    ASSERT_TRUE(hook_->ok());
    setenv("HOOK_URL", hook_->base_url().c_str(), 1);
    auto store = OpenStore({dir_.File("parallel.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    auto definition = LoadDefinitionText(kParallelWorkflow, "parallel.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = *definition;
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, {});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  InstanceRecord Run(const Json& input) {
    auto started = engine_->StartInstance(definition_, {"default", input.dump()});
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    EXPECT_TRUE(state.ok()) << state.status();
    return *store_->GetInstance(started->instance.id);
  }

  // The paths the receiver delivered, in the order they arrived.
  std::vector<std::string> Delivered() {
    std::vector<std::string> paths;
    const Json stats = Json::parse(hook_->StatsJson());
    for (const Json& d : stats["deliveries"]) paths.push_back(d["path"].get<std::string>());
    return paths;
  }

  testing::TempDir dir_;
  SeededRandom random_{17};
  std::unique_ptr<testing::TargetProcess> hook_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
};

// Returns where `path` first arrives in `paths` (-1: never).
int Position(const std::vector<std::string>& paths, const std::string& path) {
  auto it = std::find(paths.begin(), paths.end(), path);
  return it == paths.end() ? -1 : static_cast<int>(it - paths.begin());
}

TEST_F(ParallelTargetTest, ABranchWaitingForItsRetryHoldsNoOther) {
  // The first branch call to arrive (the two go at once) is told to come back in a
  // second.
  hook_->Call("POST", "/_target/faults", R"({"next": ["status_503"], "retry_after_s": 1})");
  const InstanceRecord instance = Run({{"id", "o-1"}, {"done_id", "done-o-1"}});
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const std::vector<std::string> paths = Delivered();
  ASSERT_EQ(paths.size(), 4u);
  const Json stats = Json::parse(hook_->StatsJson());
  EXPECT_EQ(stats["requests_total"], 5);
  EXPECT_EQ(stats["duplicates_seen"], 0);
  EXPECT_EQ(paths.back(), "/done") << "`done` after both branches";
  EXPECT_LT(Position(paths, "/wms"), Position(paths, "/wms-label"));
  // Whichever branch was told to wait, the other ran to its end meanwhile.
  if (Position(paths, "/crm") == 2) {
    EXPECT_EQ(paths, (std::vector<std::string>{"/wms", "/wms-label", "/crm", "/done"}));
  } else {
    EXPECT_EQ(paths, (std::vector<std::string>{"/crm", "/wms", "/wms-label", "/done"}));
  }
}

TEST_F(ParallelTargetTest, AFailureAfterTheGroupUndoesItsBranchesInReverse) {
  const InstanceRecord instance = Run({{"id", "o-2"}, {"done_id", ""}});  // `done`: 400
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  const std::vector<std::string> paths = Delivered();
  ASSERT_EQ(paths.size(), 5u);
  EXPECT_LT(Position(paths, "/wms"), Position(paths, "/wms-label"));
  EXPECT_LT(Position(paths, "/crm"), 3) << "the branches went at once";
  EXPECT_EQ(std::vector<std::string>(paths.begin() + 3, paths.end()),
            (std::vector<std::string>{"/undo-wms", "/undo-crm"}));
}

// Three branches calling an endpoint that answers after 0.6 s
// (tests/targets/slow_target.py, which counts the requests open at once): the
// branches' calls are open together, from the synchronous drive (RunUntilRest) and
// from the engine's workers alike, each under its own key and each checkpointed.
class ParallelCallsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    slow_ = std::make_unique<testing::TargetProcess>(dir_.path(), "slow_target.py",
                                                     std::vector<std::string>{"--delay", "0.6"});
    ASSERT_TRUE(slow_->ok());
    auto store = OpenStore({dir_.File("calls.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    std::string text = R"(workflow: fan-out
key: "{{input.id}}"
steps:
  - name: tell
    parallel:
)";
    for (const char* name : {"erp", "crm", "wms"}) {
      text += std::string("      - name: to-") + name + R"(
        idempotency: { honored: true }
        request: { method: POST, url: ")" +
              slow_->base_url() + "/" + name +
              R"(", body: { order: "{{input.id}}" }, timeout: 10s }
)";
    }
    auto definition = LoadDefinitionText(text, "fan-out.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = *definition;
    EngineOptions options;
    options.workers = 1;  // one instance at a time: what is open at once is its branches
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  testing::TempDir dir_;
  SeededRandom random_{23};
  std::unique_ptr<testing::TargetProcess> slow_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
};

TEST_P(ParallelCallsTest, TheBranchesCallAtOnce) {
  const bool pool = GetParam();
  auto started = engine_->StartInstance(definition_, {"default", R"({"id":"o-1"})"});
  ASSERT_TRUE(started.ok()) << started.status();
  InstanceRecord instance;
  if (pool) {
    engine_->Start();
    auto rested = engine_->AwaitRest(started->instance.id, 20'000);
    ASSERT_TRUE(rested.ok()) << rested.status();
    instance = *rested;
    engine_->Stop();
  } else {
    auto state = engine_->RunUntilRest(started->instance.id, std::stop_token());
    ASSERT_TRUE(state.ok()) << state.status();
    instance = *store_->GetInstance(started->instance.id);
  }
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  const Json stats = Json::parse(slow_->Call("GET", "/_stats", ""));
  EXPECT_EQ(stats["received"], 3) << stats.dump();
  EXPECT_EQ(stats["max_open"], 3) << "the three branches' calls were open together: "
                                  << stats.dump();
  EXPECT_EQ(stats["keys"], 3);
  EXPECT_EQ(stats["duplicate_keys"], 0);
  auto steps = store_->GetSteps(started->instance.id);
  ASSERT_TRUE(steps.ok());
  for (const StepRecord& step : *steps) {
    EXPECT_EQ(step.state, StepState::kCompleted) << step.name;
    EXPECT_EQ(step.attempts, 1) << step.name;
    EXPECT_TRUE(step.external_id.empty() || step.external_id.starts_with("OBJ-")) << step.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Drives, ParallelCallsTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "pool" : "run_until_rest"; });

}  // namespace
}  // namespace waystone
