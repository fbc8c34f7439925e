// Chaos against the independent target (tests/targets/erp_target.py): it closes 30 %
// of create responses before any byte, after committing, and honours no key for
// orders; 30 % of notifications answer only after the client gave up. Worker
// processes are SIGKILLed whenever the target has received a few more requests
// (so the kills land mid-run however fast the machine is), and on PostgreSQL one
// worker is also SIGSTOPped past its lease. What counts is what the target received.

#include <signal.h>

#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "store/store.h"
#include "support/erp_target.h"
#include "support/postgres_cluster.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kFaults[] = R"({
  "create_order": {"rate": 0.3, "shape": "close_before_bytes"},
  "send_message": {"rate": 0.3, "shape": "late", "delay_ms": 1200}
})";

class IndependentChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_unique<testing::ErpTarget>(dir_.path(), 2026);
    ASSERT_TRUE(target_->ok());
    ASSERT_TRUE(target_->Faults(kFaults));
  }

  void UseDatabase(const std::string& db) {
    db_ = db;
    auto store = OpenStore({db_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  std::map<std::string, std::string> Env() {
    return {{"WAYSTONE_DB", db_}, {"TARGET_URL", target_->base_url()}};
  }

  std::vector<std::string> Worker(bool exit_when_idle) {
    std::vector<std::string> argv = {
        testing::WaystoneBinary(), "worker", "--workers", "4", "--lease", "2s"};
    if (exit_when_idle) argv.push_back("--exit-when-idle");
    return argv;
  }

  void StartOrders(int count) {
    std::string lines;
    for (int i = 0; i < count; ++i) {
      lines += Json{{"order_id", std::to_string(i)},
                    {"customer", "U-" + std::to_string(i)},
                    {"amount", i + 1}}
                   .dump() +
               "\n";
    }
    testing::WriteFile(dir_.File("orders.jsonl"), lines);
    auto started = testing::RunProcess({testing::WaystoneBinary(), "start",
                                        testing::SourceDir() + "/tests/fixtures/target-order.yaml",
                                        "--inputs", dir_.File("orders.jsonl")},
                                       Env(), dir_.path());
    ASSERT_EQ(started.exit_code, 0) << started.err;
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  int Received() {
    const std::string text = target_->StatsJson();
    return text.empty() ? 0 : static_cast<int>(Json::parse(text)["requests"].size());
  }

  bool AllAtRest() {
    auto summary = store_->Summary();
    if (!summary.ok()) return false;
    int64_t moving = 0;
    int64_t any = 0;
    for (const auto& [state, n] : summary->instances_by_state) {
      any += n;
      if (state == InstanceState::kRunning || state == InstanceState::kCompensating) moving += n;
    }
    return any > 0 && moving == 0;
  }

  // Kills one of `workers` (never `frozen`) with SIGKILL and starts it again each
  // time the target has received 4 to 12 more requests, until every instance rests.
  int KillAsTheyGo(std::vector<std::unique_ptr<testing::Process>>& workers, int frozen,
                   const std::function<void(int kills)>& after_kill) {
    std::mt19937 random(7);
    int kills = 0;
    int seen = Received();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
    while (!AllAtRest() && std::chrono::steady_clock::now() < deadline) {
      const int want = seen + 4 + static_cast<int>(random() % 9);
      testing::WaitFor([&] { return Received() >= want || AllAtRest(); }, std::chrono::seconds(5));
      if (AllAtRest()) break;
      seen = Received();
      size_t victim = random() % workers.size();
      if (static_cast<int>(victim) == frozen) victim = (victim + 1) % workers.size();
      workers[victim]->Signal(SIGKILL);
      workers[victim]->Wait();
      workers[victim] = std::make_unique<testing::Process>(Worker(false), Env(), dir_.path());
      ++kills;
      after_kill(kills);
    }
    return kills;
  }

  // Every instance completed; one order and one message each at the target; and
  // each step's recorded attempts account for every request the target received
  // (a kill between the `running` checkpoint and the send leaves an attempt the
  // target never saw, so attempts may exceed requests by at most the kills).
  void ExpectRightOutcome(int instances, int kills) {
    const Json stats = Stats();
    auto summary = store_->Summary();
    ASSERT_TRUE(summary.ok());
    std::map<InstanceState, int64_t> by_state(summary->instances_by_state.begin(),
                                              summary->instances_by_state.end());
    EXPECT_EQ(by_state[InstanceState::kCompleted], instances);
    auto resting =
        store_->ListInstances({std::nullopt, std::nullopt, InstanceState::kNeedsAttention});
    if (resting.ok()) {
      for (const auto& r : *resting) ADD_FAILURE() << r.key << ": " << r.status_reason;
    }
    EXPECT_EQ(stats["orders"], instances) << stats.dump();
    EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
    EXPECT_EQ(stats["messages"], instances) << stats.dump();
    EXPECT_EQ(stats["duplicate_messages"], 0) << stats.dump();
    auto all = store_->ListInstances({std::nullopt, std::nullopt, std::nullopt, 100000});
    ASSERT_TRUE(all.ok());
    int creates = 0;
    int messages = 0;
    for (const auto& instance : *all) {
      auto steps = store_->GetSteps(instance.id);
      ASSERT_TRUE(steps.ok());
      for (const auto& step : *steps) {
        if (step.name == "create-order") creates += step.attempts;
        if (step.name == "notify") messages += step.attempts;
      }
    }
    const int received_creates = stats["by_route"].value("create_order", 0);
    const int received_messages = stats["by_route"].value("send_message", 0);
    EXPECT_LE(received_creates, creates) << "a create was sent that no attempt records";
    EXPECT_GE(received_creates, creates - kills);
    EXPECT_LE(received_messages, messages) << "a message was sent that no attempt records";
    EXPECT_GE(received_messages, messages - kills);
    int lost = 0;
    for (const Json& request : stats["requests"]) {
      if (request["route"] == "create_order" && request["shape"] != "ok") ++lost;
    }
    EXPECT_GE(lost, 3) << "hardly any create response was lost: a weak run";
  }

  testing::TempDir dir_;
  std::string db_;
  std::unique_ptr<testing::ErpTarget> target_;
  std::unique_ptr<Store> store_;
};

TEST_F(IndependentChaosTest, OneSqliteProcessKilledAtRandomMoments) {
  UseDatabase(dir_.File("chaos.db"));
  StartOrders(30);
  std::vector<std::unique_ptr<testing::Process>> workers;
  workers.push_back(std::make_unique<testing::Process>(Worker(false), Env(), dir_.path()));
  const int kills = KillAsTheyGo(workers, -1, [](int) {});
  for (auto& w : workers) {
    w->Signal(SIGTERM);
    w->Wait();
  }
  auto finisher = testing::RunProcess(Worker(true), Env(), dir_.path());
  ASSERT_EQ(finisher.exit_code, 0) << finisher.err;
  EXPECT_GE(kills, 3) << "the run ended before the worker was killed a few times";
  ExpectRightOutcome(30, kills);
}

// Worker A commits create-order `running`, checks its lease and then stalls before
// its request leaves (the SIGSTOP that once made a second order in the chaos run
// below). B takes over when A's lease runs out, finds the step running, waits a
// request timeout, looks the order up at the target (which honours no key), finds
// nothing and sends it. When A wakes its request must not leave: the client asks
// the lease once more before the first byte. The target counts one create.
TEST_F(IndependentChaosTest, AWorkerStalledBetweenItsLeaseCheckAndTheSendSendsNothing) {
  ASSERT_TRUE(target_->Faults(R"({"reset": true})"));
  UseDatabase(dir_.File("stall.db"));
  StartOrders(1);
  auto create_order_state = [&]() -> std::optional<StepState> {
    auto instances = store_->ListInstances({std::nullopt, std::nullopt, std::nullopt, 10});
    if (!instances.ok() || instances->empty()) return std::nullopt;
    auto steps = store_->GetSteps(instances->front().id);
    if (!steps.ok() || steps->size() < 2) return std::nullopt;
    return (*steps)[1].state;
  };
  auto env = Env();
  env["WAYSTONE_PAUSE_AT"] = "before-send:create-order=6000";
  env["WAYSTONE_LOG"] = "info";
  testing::Process a(
      {testing::WaystoneBinary(), "worker", "--workers", "1", "--lease", "2s", "--exit-when-idle"},
      env, dir_.path());
  ASSERT_TRUE(testing::WaitFor([&] { return create_order_state() == StepState::kRunning; },
                               std::chrono::seconds(30)))
      << a.Errors();
  EXPECT_EQ(Stats()["by_route"].value("create_order", 0), 0) << "A's request left before its stall";
  auto b = testing::RunProcess(
      {testing::WaystoneBinary(), "worker", "--lease", "2s", "--exit-when-idle"}, Env(),
      dir_.path());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(create_order_state(), StepState::kCompleted);
  EXPECT_EQ(Stats()["orders"], 1) << "B sent the order after finding nothing";
  auto ra = a.Wait(std::chrono::seconds(60));  // A wakes 6 s after its stall began
  EXPECT_EQ(ra.exit_code, 0) << ra.err;
  const Json stats = Stats();
  EXPECT_EQ(stats["by_route"].value("create_order", 0), 1) << stats.dump();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["messages"], 1) << stats.dump();
  auto all = store_->ListInstances({std::nullopt, std::nullopt, std::nullopt, 10});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(all->front().state, InstanceState::kCompleted) << all->front().status_reason;
  auto steps = store_->GetSteps(all->front().id);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ((*steps)[1].unknowns, 1);
  EXPECT_EQ((*steps)[1].lookups, 1);
  EXPECT_EQ((*steps)[1].resolution, Resolution::kResubmitted) << "B sent it after its lookup";
}

TEST_F(IndependentChaosTest, ThreePostgresWorkersKilledAndOneFrozenPastItsLease) {
  UseDatabase(testing::FreshPostgresDatabase());
  StartOrders(60);
  std::vector<std::unique_ptr<testing::Process>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(std::make_unique<testing::Process>(Worker(false), Env(), dir_.path()));
  }
  // Worker 0 freezes mid-run for longer than its 2 s lease, then wakes: whatever
  // it was doing, the instance has moved on without it and its commits are refused.
  bool frozen = false;
  bool thawed = false;
  std::chrono::steady_clock::time_point frozen_at;
  const int kills = KillAsTheyGo(workers, 0, [&](int n) {
    if (n == 2 && !frozen) {
      workers[0]->Signal(SIGSTOP);
      frozen = true;
      frozen_at = std::chrono::steady_clock::now();
    }
    if (frozen && !thawed &&
        std::chrono::steady_clock::now() - frozen_at > std::chrono::seconds(3)) {
      workers[0]->Signal(SIGCONT);
      thawed = true;
    }
  });
  if (frozen && !thawed) {
    // The run finished while it slept: it must still change nothing when it wakes.
    // Deliberate: it stays stopped its full 3 s, past its leases, whatever else happened.
    std::this_thread::sleep_for(std::chrono::seconds(3) -
                                (std::chrono::steady_clock::now() - frozen_at));
    workers[0]->Signal(SIGCONT);
  }
  for (auto& w : workers) {
    w->Signal(SIGTERM);
    w->Wait();
  }
  auto finisher = testing::RunProcess(Worker(true), Env(), dir_.path());
  ASSERT_EQ(finisher.exit_code, 0) << finisher.err;
  EXPECT_TRUE(frozen) << "the run ended before a worker could be frozen";
  EXPECT_GE(kills, 3);
  ExpectRightOutcome(60, kills);
}

}  // namespace
}  // namespace waystone
