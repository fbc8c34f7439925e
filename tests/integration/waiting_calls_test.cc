// Calls under way hold no worker thread: the engine against tests/targets/slow_target.py
// (Python asyncio, shares no code with Waystone), which answers every request after a
// delay and counts what it received and how many requests were open at once.

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/engine.h"
#include "store/store.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Threads of this process now (from /proc/self/status).
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

class WaitingCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_unique<testing::Process>(
        std::vector<std::string>{"/usr/bin/env", "python3",
                                 testing::SourceDir() + "/tests/targets/slow_target.py",
                                 // 3 s: long enough for the workers to hand over every
                                 // call before the first answers, even under ASan on a
                                 // loaded machine (at 1 s a cold CI run saw 44 and 39 open
                                 // at once where the tests need 50).
                                 "--delay", "3.0"},
        std::map<std::string, std::string>{}, dir_.path());
    port_ = testing::WaitForPortLine(*target_, std::chrono::seconds(10));
    ASSERT_GT(port_, 0) << target_->Errors();
    auto store = OpenStore({dir_.File("calls.db")});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    http_ = NewCurlHttpClient({});
    const std::string text = R"(
workflow: slow-order
key: "order:{{input.n}}"
steps:
  - name: create
    recovery: repeatable
    idempotency: { honored: true }
    request:
      method: POST
      url: "http://127.0.0.1:)" +
                             std::to_string(port_) + R"(/orders"
      body: { n: "{{input.n}}" }
      timeout: 10s
    result: { external_id: "/id" }
)";
    auto definition = LoadDefinitionText(text, "slow-order.yaml");
    ASSERT_TRUE(definition.ok()) << definition.status();
    definition_ = *definition;
  }

  void MakeEngine(int workers) {
    EngineOptions options;
    options.workers = workers;
    auto engine = Engine::Create(store_.get(), http_.get(), SystemClock::Get(), &random_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  std::vector<int64_t> StartMany(int count) {
    std::vector<int64_t> ids;
    for (int i = 0; i < count; ++i) {
      auto started = engine_->StartInstance(definition_, {"default", Json{{"n", i}}.dump()});
      EXPECT_TRUE(started.ok()) << started.status();
      if (started.ok()) ids.push_back(started->instance.id);
    }
    return ids;
  }

  Json Stats() {
    HttpRequest request{
        "GET", "http://127.0.0.1:" + std::to_string(port_) + "/_stats", {}, "", 5000};
    HttpResponse response = http_->Send(request);
    return Json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::Process> target_;
  int port_ = -1;
  SeededRandom random_{9};
  std::unique_ptr<Store> store_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Engine> engine_;
  WorkflowDefinition definition_;
};

TEST_F(WaitingCallsTest, TwoWorkersKeepTwoHundredCallsWaitingAtOnce) {
  const int before = ThreadCount();
  MakeEngine(2);
  const std::vector<int64_t> ids = StartMany(200);
  ASSERT_EQ(ids.size(), 200u);
  int most_threads = 0;
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      most_threads = std::max(most_threads, ThreadCount());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  engine_->Start();
  for (int64_t id : ids) {
    auto rested = engine_->AwaitRest(id, 30'000);
    ASSERT_TRUE(rested.ok()) << rested.status();
    EXPECT_EQ(rested->state, InstanceState::kCompleted) << rested->status_reason;
  }
  done = true;
  watch.join();
  const Json stats = Stats();
  ASSERT_TRUE(stats.is_object());
  EXPECT_EQ(stats["received"], 200) << stats.dump();
  EXPECT_EQ(stats["keys"], 200) << stats.dump();
  EXPECT_EQ(stats["duplicate_keys"], 0) << stats.dump();
  // With a thread per call, two workers would keep at most two requests open. Here
  // the two workers hand over as many as they claim within the target's 3 s delay
  // (within 1 s: ~200 in a release build, 44 under ASan beside a build on a cold CI run),
  // so the bound is 25 times what a thread per call could reach.
  EXPECT_GE(stats["max_open"].get<int>(), 50) << stats.dump();
  // The engine's own threads: workers, dispatcher, commit queue, lease keeper (and
  // this test's watcher); none per call.
  EXPECT_LE(most_threads - before, 12)
      << "threads before " << before << ", at most " << most_threads;
  for (int64_t id : ids) {
    auto steps = store_->GetSteps(id);
    ASSERT_TRUE(steps.ok());
    EXPECT_EQ((*steps)[0].attempts, 1);
    EXPECT_EQ((*steps)[0].external_id.rfind("OBJ-", 0), 0u) << (*steps)[0].external_id;
  }
}

TEST_F(WaitingCallsTest, StopWaitsForTheCallsUnderWayAndRecordsTheirOutcome) {
  MakeEngine(2);
  const std::vector<int64_t> ids = StartMany(50);
  engine_->Start();
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const Json stats = Stats();
        return stats.is_object() && stats["open"].get<int>() == 50;
      },
      std::chrono::seconds(10)))
      << Stats().dump();
  engine_->Stop();  // every request is out, none answered yet
  const Json stats = Stats();
  EXPECT_EQ(stats["answered"], 50) << "Stop returned before the answers came: " << stats.dump();
  for (int64_t id : ids) {
    auto steps = store_->GetSteps(id);
    ASSERT_TRUE(steps.ok());
    EXPECT_EQ((*steps)[0].state, StepState::kCompleted)
        << "an answered call left " << ToString((*steps)[0].state);
  }
  // Started again, nothing is sent twice.
  engine_->Start();
  for (int64_t id : ids) {
    auto rested = engine_->AwaitRest(id, 30'000);
    ASSERT_TRUE(rested.ok()) << rested.status();
    EXPECT_EQ(rested->state, InstanceState::kCompleted) << rested->status_reason;
  }
  EXPECT_EQ(Stats()["received"], 50);
  EXPECT_EQ(Stats()["duplicate_keys"], 0);
}

TEST_F(WaitingCallsTest, AClientDestroyedMidCallAnswersEachRequestAsSentAndUnknown) {
  auto client = NewCurlHttpClient({});
  std::mutex mu;
  std::vector<HttpResponse> answers;
  for (int i = 0; i < 5; ++i) {
    HttpRequest request{"POST",
                        "http://127.0.0.1:" + std::to_string(port_) + "/orders",
                        {{"Idempotency-Key", "shutdown-" + std::to_string(i)}},
                        "{}",
                        10'000};
    client->SendAsync(std::move(request), [&](HttpResponse response) {
      std::lock_guard<std::mutex> lock(mu);
      answers.push_back(std::move(response));
    });
  }
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const Json stats = Stats();
        return stats.is_object() && stats["open"].get<int>() == 5;
      },
      std::chrono::seconds(10)));
  client.reset();  // every request has left; none is answered yet
  ASSERT_EQ(answers.size(), 5u);
  for (const HttpResponse& answer : answers) {
    EXPECT_EQ(answer.outcome.kind, CallOutcome::Kind::kLostAfterSend) << answer.error;
    EXPECT_TRUE(answer.outcome.sent);
  }
}

}  // namespace
}  // namespace waystone
