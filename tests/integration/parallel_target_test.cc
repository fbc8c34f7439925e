// Parallel groups against the independent webhook receiver
// (tests/targets/webhook_receiver.py): a branch waiting for its retry holds no other,
// and a failure after the group undoes the completed branches in reverse. What counts
// is the order in which the receiver got them.

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
constexpr char kWorkflow[] = R"(workflow: parallel
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
    auto definition = LoadDefinitionText(kWorkflow, "parallel.yaml");
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

TEST_F(ParallelTargetTest, ABranchWaitingForItsRetryHoldsNoOther) {
  // The CRM branch goes first and is told to come back in a second.
  hook_->Call("POST", "/_target/faults", R"({"next": ["status_503"], "retry_after_s": 1})");
  const InstanceRecord instance = Run({{"id", "o-1"}, {"done_id", "done-o-1"}});
  EXPECT_EQ(instance.state, InstanceState::kCompleted) << instance.status_reason;
  EXPECT_EQ(Delivered(), (std::vector<std::string>{"/wms", "/wms-label", "/crm", "/done"}))
      << "the WMS branch ran to its end while the CRM branch waited; `done` after both";
  const Json stats = Json::parse(hook_->StatsJson());
  EXPECT_EQ(stats["requests_total"], 5);
  EXPECT_EQ(stats["duplicates_seen"], 0);
}

TEST_F(ParallelTargetTest, AFailureAfterTheGroupUndoesItsBranchesInReverse) {
  const InstanceRecord instance = Run({{"id", "o-2"}, {"done_id", ""}});  // `done`: 400
  EXPECT_EQ(instance.state, InstanceState::kCompensated) << instance.status_reason;
  EXPECT_EQ(Delivered(), (std::vector<std::string>{"/crm", "/wms", "/wms-label", "/undo-wms",
                                                   "/undo-crm"}));
}

}  // namespace
}  // namespace waystone
