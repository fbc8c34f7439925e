// A target's limits and an operator's pause hold across worker processes sharing
// one PostgreSQL: `waystone serve` (API and workers) and `waystone worker`, both
// real processes, calling tests/targets/fragile_target.py (written apart from our
// code), which counts what it received. The operator pauses and resumes the
// target with the CLI, over the API.

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "store/store.h"
#include "support/arrivals.h"
#include "support/erp_target.h"
#include "support/postgres_cluster.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kWorkflow[] = R"(workflow: fragile-order
key: "{{input.id}}"
targets:
  erp:
    url: "{{env.FRAGILE_URL}}/erp"
    limits: { rate: 20, concurrency: 4 }
steps:
  - name: create-order
    recovery: lookup
    request:
      method: POST
      url: "{{env.FRAGILE_URL}}/erp/orders"
      body: { ref: "{{input.id}}" }
      timeout: 5s
    result: { external_id: /id }
    lookup:
      request: { method: GET, url: "{{env.FRAGILE_URL}}/erp/orders?ref={{input.id}}" }
      items: /items
      match: { /ref: "{{input.id}}" }
      external_id: /id
    retry: { max_attempts: 50, initial_interval: 50ms, max_interval: 200ms }
)";

// "host/pid" of a lease owner ("host/pid/random").
std::string ProcessOf(const std::string& owner) {
  return owner.substr(0, owner.find('/', owner.find('/') + 1));
}

class TargetProcessesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = testing::FreshPostgresDatabase();
    ASSERT_FALSE(db_.empty());
    target_ = std::make_unique<testing::TargetProcess>(
        dir_.path(), "fragile_target.py", std::vector<std::string>{"--service-ms", "20"});
    ASSERT_TRUE(target_->ok());
    std::filesystem::create_directories(dir_.File("definitions"));
    testing::WriteFile(dir_.File("definitions/fragile-order.yaml"), kWorkflow);
    auto store = OpenStore({db_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto token = Waystone(
        {"token", "create", "--tenant", "default", "--role", "operator", "--name", "night-ops"});
    ASSERT_EQ(token.exit_code, 0) << token.err;
    token_ = token.out.substr(0, token.out.find('\n'));
  }

  void TearDown() override {
    for (auto& p : processes_) {
      p->Signal(SIGTERM);
      p->Wait(std::chrono::seconds(30));
    }
  }

  std::map<std::string, std::string> Env() {
    return {{"WAYSTONE_DB", db_},
            {"FRAGILE_URL", target_->base_url()},
            {"WAYSTONE_TOKEN", token_},
            {"WAYSTONE_SERVER", api_}};
  }

  testing::ProcessResult Waystone(std::vector<std::string> args) {
    args.insert(args.begin(), testing::WaystoneBinary());
    return testing::RunProcess(args, Env(), dir_.path());
  }

  // Starts `waystone serve` (API and 4 workers) and `waystone worker` (4 workers).
  void StartProcesses() {
    processes_.push_back(std::make_unique<testing::Process>(
        std::vector<std::string>{testing::WaystoneBinary(), "serve", "--listen", "127.0.0.1:0",
                                 "--definitions", dir_.File("definitions"), "--workers", "4"},
        Env(), dir_.path()));
    testing::Process& serve = *processes_.back();
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          const std::string out = serve.Output() + serve.Errors();
          const size_t at = out.find("api on ");
          if (at == std::string::npos) return false;
          api_ = out.substr(at + 7, out.find('\n', at) - at - 7);
          return true;
        },
        std::chrono::seconds(30)))
        << serve.Errors();
    processes_.push_back(std::make_unique<testing::Process>(
        std::vector<std::string>{testing::WaystoneBinary(), "worker", "--definitions",
                                 dir_.File("definitions"), "--workers", "4"},
        Env(), dir_.path()));
    testing::Process& worker = *processes_.back();
    ASSERT_TRUE(
        testing::WaitFor([&] { return worker.Errors().find("running with") != std::string::npos; },
                         std::chrono::seconds(30)))
        << worker.Errors();
  }

  void StartOrders(const std::string& prefix, int count) {
    std::string lines;
    for (int i = 0; i < count; ++i) lines += Json{{"id", prefix + std::to_string(i)}}.dump() + "\n";
    testing::WriteFile(dir_.File(prefix + ".jsonl"), lines);
    auto started = Waystone({"start", dir_.File("definitions/fragile-order.yaml"), "--inputs",
                             dir_.File(prefix + ".jsonl")});
    ASSERT_EQ(started.exit_code, 0) << started.err;
  }

  int64_t Completed() {
    auto summary = store_->Summary();
    if (!summary.ok()) return -1;
    for (const auto& [state, count] : summary->instances_by_state) {
      if (state == InstanceState::kCompleted) return count;
    }
    return 0;
  }

  std::vector<InstanceRecord> Instances() {
    auto instances = store_->ListInstances({std::nullopt, std::nullopt, std::nullopt, 100000});
    EXPECT_TRUE(instances.ok());
    return instances.value_or(std::vector<InstanceRecord>{});
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  testing::TempDir dir_;
  std::string db_;
  std::string token_;
  std::string api_;
  std::unique_ptr<testing::TargetProcess> target_;
  std::unique_ptr<Store> store_;
  std::vector<std::unique_ptr<testing::Process>> processes_;
};

TEST_F(TargetProcessesTest, APauseAndTheLimitsHoldAcrossTwoWorkerProcesses) {
  StartProcesses();
  if (HasFatalFailure()) return;

  // 1. Paused from the CLI, over the API: neither process calls; the instances say why.
  auto paused = Waystone({"target", "pause", "erp", "--reason", "ERP reindexing, CHG-42"});
  ASSERT_EQ(paused.exit_code, 0) << paused.err << paused.out;
  StartOrders("r", 60);
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        int said = 0;
        for (const InstanceRecord& i : Instances()) {
          said +=
              i.status_reason.starts_with("waiting for target 'erp': paused by night-ops at ") &&
              i.status_reason.ends_with(": ERP reindexing, CHG-42");
        }
        return said == 60;
      },
      std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  Json stats = Stats();
  EXPECT_EQ(stats["requests"], 0) << stats.dump();
  auto listed = Waystone({"targets", "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  Json targets = Json::parse(listed.out, nullptr, false);
  ASSERT_TRUE(targets.is_object()) << listed.out;
  EXPECT_EQ(targets["items"][0]["paused"], true) << listed.out;
  EXPECT_EQ(targets["items"][0]["pause_reason"], "ERP reindexing, CHG-42");
  EXPECT_EQ(Waystone({"target", "pause", "erp", "--reason", "again"}).exit_code, 1)
      << "paused already";

  // 2. Resumed: all 60 due at once in two processes; together they keep to the rate
  //    the target can take, one order each.
  auto resumed = Waystone({"target", "resume", "erp", "--reason", "reindex done"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  ASSERT_TRUE(testing::WaitFor([&] { return Completed() == 60; }, std::chrono::seconds(60)))
      << Stats().dump();
  stats = Stats();
  EXPECT_EQ(stats["requests"], 60) << stats.dump();
  EXPECT_EQ(stats["orders"], 60) << stats.dump();
  const Json& arrivals = stats["arrivals"];
  const auto times = arrivals.get<std::vector<double>>();
  const double rate = testing::ReceivedRate(times);
  // The promise is the limit: never more than 20 a second from both processes together
  // (10 % for the measurement). How close to it they get is the machine's, not a test's
  // to assert: under ASan at -O0 beside two other tests and a build, two worker processes
  // managed 14.5 a second on one cold CI run and 9.3 on the next (a floor of 18, then of
  // 10, failed there). The 60 s they have to finish all 60 bounds a limiter that holds
  // calls back far too long; the rate reached is printed below.
  EXPECT_LE(rate, 22.0) << arrivals.dump();
  std::printf("the target received %.2f calls a second (limit 20; %.2f first to last)\n", rate,
              testing::OverallRate(times));
  // Spread, not bunched: each call leaves at its slot, give or take this machine's
  // scheduling (under ASan ~150 ms), so a second holds its 20 slots and a few late
  // ones from the second before; without the shared limit it would hold all 60.
  EXPECT_LE(stats["max_per_second_1s"].get<int>(), 25) << arrivals.dump();
  std::set<std::string> senders;
  for (const InstanceRecord& instance : Instances()) {
    EXPECT_EQ(instance.status_reason.find("waiting for target"), std::string::npos)
        << instance.key << ": " << instance.status_reason;
    auto attempts = store_->ListAttempts(instance.id);
    ASSERT_TRUE(attempts.ok());
    for (const AttemptRecord& a : *attempts) senders.insert(ProcessOf(a.worker));
  }
  EXPECT_EQ(senders.size(), 2u) << "both processes sent calls";

  // 3. A slow ERP: the concurrency cap, not the rate, is the bound, and holds for
  //    both processes together.
  ASSERT_NE(target_->Call("POST", "/_target/reset", "").find("reset"), std::string::npos);
  ASSERT_NE(target_->Call("POST", "/_target/config", R"({"service_ms": 300})").find("300"),
            std::string::npos);
  StartOrders("s", 24);
  ASSERT_TRUE(testing::WaitFor([&] { return Completed() == 84; }, std::chrono::seconds(60)))
      << Stats().dump();
  stats = Stats();
  EXPECT_EQ(stats["orders"], 24) << stats.dump();
  EXPECT_EQ(stats["in_flight_max"], 4) << stats.dump();

  auto audit = store_->ListAudit(0);
  ASSERT_TRUE(audit.ok());
  std::vector<std::string> said;
  for (const AuditRecord& a : *audit) said.push_back(a.action + " " + a.actor + " " + a.reason);
  EXPECT_EQ(said, (std::vector<std::string>{"target.pause night-ops ERP reindexing, CHG-42",
                                            "target.resume night-ops reindex done"}));
}

// A worker process stopped (SIGSTOP) while it holds calls for their rate slots: when
// it goes on (SIGCONT) their slots have passed, and it takes new ones instead of
// sending them together, so the target still receives its rate.
TEST_F(TargetProcessesTest, AStoppedWorkerGoesOnAtTheRateNotWithABurstOfTheCallsItHeld) {
  std::string workflow = kWorkflow;
  const std::string limits = "limits: { rate: 20, concurrency: 4 }";
  workflow.replace(workflow.find(limits), limits.size(), "limits: { rate: 10 }");
  testing::WriteFile(dir_.File("definitions/fragile-order.yaml"), workflow);
  StartOrders("h", 40);
  processes_.push_back(std::make_unique<testing::Process>(
      std::vector<std::string>{testing::WaystoneBinary(), "worker", "--definitions",
                               dir_.File("definitions"), "--workers", "16"},
      Env(), dir_.path()));
  testing::Process& worker = *processes_.back();
  // A few calls in, the worker holds the next second's slots (kRateHorizon): stopped
  // for 1.5 s, every one of them has passed when it goes on.
  ASSERT_TRUE(testing::WaitFor([&] { return Stats()["requests"].get<int>() >= 4; },
                               std::chrono::seconds(30)))
      << worker.Errors();
  worker.Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const int before = Stats()["requests"].get<int>();
  worker.Signal(SIGCONT);
  ASSERT_TRUE(testing::WaitFor([&] { return Completed() == 40; }, std::chrono::seconds(60)))
      << Stats().dump() << worker.Errors();
  const Json stats = Stats();
  EXPECT_EQ(stats["requests"], 40) << stats.dump();
  EXPECT_EQ(stats["orders"], 40) << stats.dump();
  const auto times = stats["arrivals"].get<std::vector<double>>();
  // Sent on the passed slots, the ~10 calls held would arrive at once beside the next
  // second's 10: 20 in a second. On retaken slots a second holds its 10, one a call
  // may be late by (LateSlotTolerance: 100 ms at 10 a second) and one for scheduling.
  EXPECT_LE(stats["max_per_second_1s"].get<int>(), 12)
      << "stopped after " << before << " calls; arrivals " << stats["arrivals"].dump();
  EXPECT_LE(testing::ReceivedRate(times), 11.0) << stats["arrivals"].dump();
  std::printf("stopped after %d calls; the busiest second held %d (limit 10)\n", before,
              stats["max_per_second_1s"].get<int>());
}

}  // namespace
}  // namespace waystone
