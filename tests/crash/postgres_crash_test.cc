// Many worker processes on one PostgreSQL: random SIGKILLs, a zombie worker
// (SIGSTOP past its lease), and the database itself crashing and recovering.

#include <signal.h>

#include <random>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sim/simulator.h"
#include "store/store.h"
#include "support/postgres_cluster.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

class PostgresCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start({});
    ASSERT_TRUE(sim.ok());
    sim_ = std::move(*sim);
  }

  void UseDatabase(const std::string& url) {
    db_ = url;
    auto store = OpenStore({db_});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  std::map<std::string, std::string> Env(std::map<std::string, std::string> extra = {}) {
    extra.emplace("WAYSTONE_DB", db_);
    return testing::SimulatorEnv(sim_->base_url(), extra);
  }

  std::vector<std::string> Worker(const std::string& lease, bool exit_when_idle) {
    std::vector<std::string> argv = {
        testing::WaystoneBinary(), "worker", "--workers", "8", "--lease", lease};
    if (exit_when_idle) argv.push_back("--exit-when-idle");
    return argv;
  }

  // The example saga with every call's 2 s timeout raised to 8 s, for the chaos run.
  // Its faults are explicit (dropped answers, 503, 429, errors, kills); a slow answer is
  // not one of them. Under ASan (-O0) on two cores shared by four workers of eight
  // threads and the in-process simulator, answers took over 2 s even with this test
  // alone, and instances failed on timeouts that had nothing to do with the kills
  // (issue 44). A longer timeout also delays each lookup after a dropped answer (it
  // waits out the timeout), so it is no longer than the margin needs.
  // Every retry budget is raised to 30 attempts too: a kill makes each call its worker
  // had out `unknown`, which costs an attempt, and on a loaded machine (a build beside
  // the tests) calls last longer, so one step was hit by six kills in a row and
  // exhausted its budget of six (a cold CI run, issue 44). The kills are the test's,
  // not the targets' faults; the budget is not what this test is about.
  std::string PatientExample() {
    std::string text = testing::ReadFile(Example());
    size_t replaced = 0;
    for (size_t at = text.find("timeout: 2s"); at != std::string::npos;
         at = text.find("timeout: 2s", at)) {
      text.replace(at, 11, "timeout: 8s");
      ++replaced;
    }
    EXPECT_GT(replaced, 5u) << "the example's timeouts changed; update this test";
    size_t budgets = 0;
    for (size_t at = text.find("max_attempts: "); at != std::string::npos;
         at = text.find("max_attempts: ", at + 1)) {
      const size_t digits = at + 14;
      const size_t end = text.find_first_not_of("0123456789", digits);
      text.replace(digits, end - digits, "30");
      ++budgets;
    }
    EXPECT_GT(budgets, 5u) << "the example's retry budgets changed; update this test";
    const std::string path = dir_.File("order-to-erp-patient.yaml");
    testing::WriteFile(path, text);
    return path;
  }

  static std::string Example() { return testing::SourceDir() + "/examples/order-to-erp.yaml"; }

  void StartOrders(int count, const std::string& prefix,
                   const std::string& definition = Example()) {
    std::string lines;
    for (int i = 0; i < count; ++i) {
      lines += Json{{"source", "crm"},
                    {"order_id", prefix + std::to_string(i)},
                    {"customer_id", (i % 10 == 9 ? "C-BLOCKED-" : "C-") + std::to_string(i)},
                    {"amount", 1 + i}}
                   .dump() +
               "\n";
    }
    testing::WriteFile(dir_.File(prefix + ".jsonl"), lines);
    auto started = testing::RunProcess(
        {testing::WaystoneBinary(), "start", definition, "--inputs", dir_.File(prefix + ".jsonl")},
        Env(), dir_.path());
    ASSERT_EQ(started.exit_code, 0) << started.err;
  }

  std::map<InstanceState, int64_t> ByState() {
    auto summary = store_->Summary();
    if (!summary.ok()) return {};
    return {summary->instances_by_state.begin(), summary->instances_by_state.end()};
  }

  bool AllAtRest() {
    auto by_state = ByState();
    return !by_state.empty() && by_state[InstanceState::kRunning] == 0 &&
           by_state[InstanceState::kCompensating] == 0;
  }

  Json Stats() { return Json::parse(sim_->StatsJson()); }

  // Says how many instances are in each state and, for the first few that neither
  // completed nor were compensated, where each stopped and why: a failure names its cause.
  std::string Described() {
    std::string out;
    for (const auto& [state, n] : ByState()) {
      out += std::string(ToString(state)) + ": " + std::to_string(n) + "; ";
    }
    auto instances = store_->ListInstances({std::nullopt, std::nullopt, std::nullopt, 100000});
    if (!instances.ok()) return out + instances.status().ToString();
    int shown = 0;
    for (const auto& instance : *instances) {
      if (instance.state == InstanceState::kCompleted ||
          instance.state == InstanceState::kCompensated || shown == 5) {
        continue;
      }
      ++shown;
      out += "\n  " + instance.key + " " + std::string(ToString(instance.state)) + ":";
      auto steps = store_->GetSteps(instance.id);
      if (!steps.ok()) continue;
      for (const auto& step : *steps) {
        if (step.state == StepState::kCompleted || step.state == StepState::kPending) continue;
        out += " " + step.name + "=" + std::string(ToString(step.state)) + " after " +
               std::to_string(step.attempts) + " attempts (" +
               std::string(ToString(step.error_class)) + ": " + step.error_message + ")";
      }
    }
    return out;
  }

  void ExpectNoDuplicatesAndEachStepOnce(int orders, int blocked) {
    Json stats = Stats();
    EXPECT_EQ(stats["orders"], orders) << stats.dump();
    EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
    EXPECT_EQ(stats["orders_cancelled"], blocked) << stats.dump();
    EXPECT_EQ(stats["line_messages"], orders - blocked) << stats.dump();
    EXPECT_EQ(stats["duplicate_line_messages"], 0) << stats.dump();
    EXPECT_EQ(stats["emails"], orders - blocked) << stats.dump();
    EXPECT_EQ(stats["duplicate_emails"], 0) << stats.dump();
    EXPECT_EQ(stats["duplicate_shipments"], 0) << stats.dump();
    auto instances = store_->ListInstances({std::nullopt, std::nullopt, std::nullopt, 100000});
    ASSERT_TRUE(instances.ok());
    for (const auto& instance : *instances) {
      auto events = store_->ListEvents(instance.id);
      ASSERT_TRUE(events.ok());
      std::map<std::string, int> completed;
      for (const auto& e : *events) {
        if (e.type == "waystone.step.completed") {
          completed[Json::parse(e.payload_json)["step"].get<std::string>()] += 1;
        }
      }
      for (const auto& [step, n] : completed) EXPECT_EQ(n, 1) << instance.key << " " << step;
    }
  }

  testing::TempDir dir_;
  std::string db_;
  std::unique_ptr<Simulator> sim_;
  std::unique_ptr<Store> store_;
};

TEST_F(PostgresCrashTest, FourWorkersFiveHundredInstancesRandomKills) {
  UseDatabase(testing::FreshPostgresDatabase());
  ASSERT_TRUE(
      sim_->SetFaults(
              R"({"erp.create_order": {"drop_response": 0.1, "unavailable": 0.05, "retry_after_s": 0},
                                  "line.push": {"drop_response": 0.05, "rate_limit": 0.05, "retry_after_s": 0},
                                  "email.send": {"error": 0.05}})")
          .ok());
  StartOrders(500, "p", PatientExample());
  std::vector<std::unique_ptr<testing::Process>> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(std::make_unique<testing::Process>(Worker("3s", false), Env(), dir_.path()));
  }
  std::mt19937 random(2026);
  int kills = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (!AllAtRest() && std::chrono::steady_clock::now() < deadline) {
    // The first kills come quickly: on a fast machine 500 instances finish in a few
    // seconds, and the run must have been broken a few times to prove anything.
    const int pause =
        kills < 3 ? 200 + static_cast<int>(random() % 200) : 700 + static_cast<int>(random() % 800);
    // Deliberate: the chaos is paced in time (let the workers get somewhere, then kill).
    std::this_thread::sleep_for(std::chrono::milliseconds(pause));
    const size_t victim = random() % workers.size();
    workers[victim]->Signal(SIGKILL);
    workers[victim]->Wait();
    workers[victim] = std::make_unique<testing::Process>(Worker("3s", false), Env(), dir_.path());
    ++kills;
  }
  for (auto& w : workers) {
    w->Signal(SIGTERM);
    w->Wait();
  }
  auto finisher = testing::RunProcess(Worker("3s", true), Env(), dir_.path());
  ASSERT_EQ(finisher.exit_code, 0) << finisher.err;
  EXPECT_GE(kills, 3) << "the run ended before the workers were killed a few times";
  auto by_state = ByState();
  EXPECT_EQ(by_state[InstanceState::kCompleted], 450) << Described();
  EXPECT_EQ(by_state[InstanceState::kCompensated], 50) << Described();
  ExpectNoDuplicatesAndEachStepOnce(500, 50);
}

TEST_F(PostgresCrashTest, ZombieWorkerStoppedPastItsLeaseWritesNothing) {
  UseDatabase(testing::FreshPostgresDatabase());
  ASSERT_TRUE(
      sim_->SetFaults(R"({"erp.create_order": {"next": ["delay"], "delay_ms": 1500}})").ok());
  StartOrders(1, "z");
  testing::Process a(Worker("3s", true), Env({{"WAYSTONE_LOG", "info"}}), dir_.path());
  ASSERT_TRUE(
      testing::WaitFor([&] { return Stats()["requests"].value("erp.create_order", 0) == 1; },
                       std::chrono::seconds(30)));
  a.Signal(SIGSTOP);  // mid-call, holding the lease
  auto b = testing::RunProcess(Worker("3s", true), Env(), dir_.path());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  auto instance = store_->FindInstance("default", "crm:z0");
  ASSERT_TRUE(instance.ok());
  EXPECT_EQ(instance->state, InstanceState::kCompleted);
  a.Signal(SIGCONT);
  auto ra = a.Wait(std::chrono::seconds(60));
  EXPECT_EQ(ra.exit_code, 0) << ra.err;
  EXPECT_NE(ra.err.find("lease lost"), std::string::npos) << ra.err;
  auto steps = store_->GetSteps(instance->id);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ((*steps)[1].resolution, Resolution::kLookupFound) << "B adopted A's order";
  ExpectNoDuplicatesAndEachStepOnce(1, 0);
}

TEST_F(PostgresCrashTest, DatabaseRestartedImmediatelySeveralTimes) {
  auto cluster = testing::PostgresCluster::Start();
  ASSERT_NE(cluster, nullptr);
  UseDatabase(cluster->NewDatabase());
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.create_shipment": {"delay": 0.2, "delay_ms": 200}})").ok());
  StartOrders(100, "r");
  std::vector<std::unique_ptr<testing::Process>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<testing::Process>(Worker("3s", true), Env(), dir_.path()));
  }
  // The restarts are to come while instances run, not while a worker opens its store
  // (slow under a sanitizer): each worker has said it runs first.
  for (auto& w : workers) {
    ASSERT_TRUE(
        testing::WaitFor([&] { return w->Errors().find("running with") != std::string::npos; },
                         std::chrono::seconds(60)))
        << w->Errors();
  }
  for (int restart = 0; restart < 3; ++restart) {
    // Deliberate: the workers run a while between restarts, mid-flight when it goes.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    ASSERT_TRUE(cluster->RestartImmediate());
  }
  for (auto& w : workers) {
    auto result = w->Wait(std::chrono::seconds(180));
    EXPECT_EQ(result.exit_code, 0) << result.err;
  }
  // The store of this test reconnects too.
  ASSERT_TRUE(testing::WaitFor([&] { return AllAtRest(); }, std::chrono::seconds(30)));
  auto by_state = ByState();
  EXPECT_EQ(by_state[InstanceState::kCompleted], 90);
  EXPECT_EQ(by_state[InstanceState::kCompensated], 10);
  ExpectNoDuplicatesAndEachStepOnce(100, 10);
}

}  // namespace
}  // namespace waystone
