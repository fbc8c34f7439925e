// Crash and takeover tests with real processes: the `waystone` binary is killed
// with SIGKILL at exact points (WAYSTONE_CRASH_AT), restarted, and the simulator's
// business objects are counted.

#include <signal.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sim/simulator.h"
#include "store/store.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start({});
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = std::move(*sim);
    db_ = dir_.File("crash.db");
  }

  std::map<std::string, std::string> Env(std::map<std::string, std::string> extra = {}) {
    extra.emplace("WAYSTONE_DB", db_);
    return testing::SimulatorEnv(sim_->base_url(), extra);
  }

  static std::string Example() { return testing::SourceDir() + "/examples/order-to-erp.yaml"; }

  static std::string Order(const std::string& id, const std::string& customer) {
    return Json{{"source", "crm"}, {"order_id", id}, {"customer_id", customer}, {"amount", 50}}
        .dump();
  }

  testing::ProcessResult RunWaystone(const std::vector<std::string>& args,
                                     const std::map<std::string, std::string>& env) {
    std::vector<std::string> argv = {testing::WaystoneBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunProcess(argv, env, dir_.path());
  }

  Json Stats() { return Json::parse(sim_->StatsJson()); }

  std::unique_ptr<Store> OpenDb() {
    auto store = OpenStore({db_});
    EXPECT_TRUE(store.ok()) << store.status();
    return std::move(*store);
  }

  // Asserts that every (instance, step) has at most one step.completed event:
  // no step was committed twice.
  void ExpectEachStepCompletedOnce(Store& store) {
    auto instances = store.ListInstances({std::nullopt, std::nullopt, std::nullopt, 100000});
    ASSERT_TRUE(instances.ok());
    for (const auto& instance : *instances) {
      auto events = store.ListEvents(instance.id);
      ASSERT_TRUE(events.ok());
      std::map<std::string, int> completed;
      for (const auto& event : *events) {
        if (event.type != "waystone.step.completed") continue;
        completed[Json::parse(event.payload_json)["step"].get<std::string>()] += 1;
      }
      for (const auto& [step, count] : completed) {
        EXPECT_EQ(count, 1) << instance.key << " step " << step;
      }
    }
  }

  testing::TempDir dir_;
  std::string db_;
  std::unique_ptr<Simulator> sim_;
};

struct CrashCase {
  std::string point;
  std::string step;
};

void PrintTo(const CrashCase& c, std::ostream* os) { *os << c.point << ":" << c.step; }

std::string CaseName(const ::testing::TestParamInfo<CrashCase>& info) {
  std::string name = info.param.point + "_" + info.param.step;
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

class CrashPointTest : public CrashTest, public ::testing::WithParamInterface<CrashCase> {};

TEST_P(CrashPointTest, KilledAtThePointRestartedOneOfEverything) {
  const CrashCase& c = GetParam();
  const std::string input = Order("c1", "C-1");
  auto crashed = RunWaystone({"run", Example(), "--input", input},
                             Env({{"WAYSTONE_CRASH_AT", c.point + ":" + c.step}}));
  ASSERT_EQ(crashed.signal, SIGKILL) << "exit " << crashed.exit_code << "\n" << crashed.err;

  auto resumed = RunWaystone({"run", Example(), "--input", input}, Env());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("state     completed"), std::string::npos) << resumed.out;

  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["shipments"], 1) << stats.dump();
  EXPECT_EQ(stats["line_messages"], 1) << stats.dump();
  EXPECT_EQ(stats["emails"], 1) << stats.dump();
  EXPECT_EQ(stats["crm_writebacks"], 1) << stats.dump();
  for (const char* route : {"erp.create_order", "erp.create_shipment", "line.push", "email.send"}) {
    if (stats["distinct_idempotency_keys"].contains(route)) {
      EXPECT_EQ(stats["distinct_idempotency_keys"][route], 1) << route;
    }
  }
  auto store = OpenDb();
  auto instance = store->FindInstance("default", "crm:c1");
  ASSERT_TRUE(instance.ok());
  EXPECT_EQ(instance->state, InstanceState::kCompleted);
  auto steps = store->GetSteps(instance->id);
  ASSERT_TRUE(steps.ok());
  for (const auto& step : *steps) {
    EXPECT_EQ(step.state, StepState::kCompleted) << step.name;
    if (step.name == c.step) {
      EXPECT_EQ(step.unknowns, 1) << "the crash left it running";
    }
  }
  ExpectEachStepCompletedOnce(*store);
}

INSTANTIATE_TEST_SUITE_P(
    EveryStep, CrashPointTest,
    ::testing::Values(
        CrashCase{"before-call", "fetch-customer"}, CrashCase{"after-call", "fetch-customer"},
        CrashCase{"before-call", "create-order"}, CrashCase{"after-call", "create-order"},
        CrashCase{"before-call", "reserve-shipment"}, CrashCase{"after-call", "reserve-shipment"},
        CrashCase{"before-call", "notify-line"}, CrashCase{"after-call", "notify-line"},
        CrashCase{"before-call", "send-email"}, CrashCase{"after-call", "send-email"},
        CrashCase{"before-call", "link-in-crm"}, CrashCase{"after-call", "link-in-crm"}),
    CaseName);

class CompensationCrashTest : public CrashTest,
                              public ::testing::WithParamInterface<std::string> {};

TEST_P(CompensationCrashTest, KilledDuringCompensationCancelsOnce) {
  const std::string input = Order("c2", "C-BLOCKED-2");
  auto crashed = RunWaystone({"run", Example(), "--input", input},
                             Env({{"WAYSTONE_CRASH_AT", GetParam() + ":create-order"}}));
  ASSERT_EQ(crashed.signal, SIGKILL) << crashed.err;
  auto resumed = RunWaystone({"run", Example(), "--input", input}, Env());
  EXPECT_EQ(resumed.exit_code, 3) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("state     compensated"), std::string::npos) << resumed.out;
  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1);
  EXPECT_EQ(stats["orders_cancelled"], 1);
  EXPECT_EQ(stats["distinct_idempotency_keys"]["erp.cancel_order"], 1);
  EXPECT_EQ(stats["line_messages"], 0);
}

INSTANTIATE_TEST_SUITE_P(BothSides, CompensationCrashTest,
                         ::testing::Values("before-compensate", "after-compensate"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST_F(CrashTest, LostResponseThroughTheCliIsAdoptedByLookup) {
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.create_order": {"next": ["drop_response"]}})").ok());
  auto result = RunWaystone({"run", Example(), "--input", Order("lost", "C-3")}, Env());
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("lookup_found"), std::string::npos) << result.out;
  EXPECT_EQ(Stats()["orders"], 1);
  EXPECT_EQ(Stats()["requests"]["erp.create_order"], 1);
}

// Writes `count` order inputs, one JSON object per line.
std::string WriteInputs(const testing::TempDir& dir, int count, const std::string& prefix) {
  std::string lines;
  for (int i = 0; i < count; ++i) {
    lines += Json{{"source", "crm"},
                  {"order_id", prefix + std::to_string(i)},
                  {"customer_id", (i % 10 == 9 ? "C-BLOCKED-" : "C-") + std::to_string(i)},
                  {"amount", 10 + i}}
                 .dump() +
             "\n";
  }
  const std::string path = dir.File(prefix + "inputs.jsonl");
  testing::WriteFile(path, lines);
  return path;
}

TEST_F(CrashTest, TwoWorkerProcessesOnOneFileRunEachInstanceOnce) {
  ASSERT_TRUE(
      sim_->SetFaults(
              R"({"erp.create_order": {"drop_response": 0.15, "unavailable": 0.1, "retry_after_s": 0},
                                  "line.push": {"delay": 0.1, "delay_ms": 2200},
                                  "email.send": {"rate_limit": 0.1, "retry_after_s": 0}})")
          .ok());
  const std::string inputs = WriteInputs(dir_, 40, "two-");
  auto started = RunWaystone({"start", Example(), "--inputs", inputs}, Env());
  ASSERT_EQ(started.exit_code, 0) << started.err;
  std::vector<std::string> worker = {testing::WaystoneBinary(), "worker", "--workers", "8",
                                     "--exit-when-idle"};
  testing::Process a(worker, Env(), dir_.path());
  testing::Process b(worker, Env(), dir_.path());
  auto ra = a.Wait(std::chrono::seconds(180));
  auto rb = b.Wait(std::chrono::seconds(180));
  ASSERT_EQ(ra.exit_code, 0) << ra.err;
  ASSERT_EQ(rb.exit_code, 0) << rb.err;
  auto store = OpenDb();
  auto summary = store->Summary();
  ASSERT_TRUE(summary.ok());
  std::map<InstanceState, int64_t> by_state(summary->instances_by_state.begin(),
                                            summary->instances_by_state.end());
  EXPECT_EQ(by_state[InstanceState::kCompleted], 36);
  EXPECT_EQ(by_state[InstanceState::kCompensated], 4);
  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 40) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0);
  EXPECT_EQ(stats["orders_cancelled"], 4);
  EXPECT_EQ(stats["line_messages"], 36);
  EXPECT_EQ(stats["duplicate_line_messages"], 0);
  EXPECT_EQ(stats["emails"], 36);
  EXPECT_EQ(stats["duplicate_emails"], 0);
  ExpectEachStepCompletedOnce(*store);
}

TEST_F(CrashTest, WorkerKilledMidBatchAndRestartedFinishesEverything) {
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.create_order": {"drop_response": 0.2},
                                  "erp.create_shipment": {"delay": 0.1, "delay_ms": 300}})")
                  .ok());
  const std::string inputs = WriteInputs(dir_, 40, "kill-");
  ASSERT_EQ(RunWaystone({"start", Example(), "--inputs", inputs}, Env()).exit_code, 0);
  {
    testing::Process worker({testing::WaystoneBinary(), "worker", "--workers", "4"}, Env(),
                            dir_.path());
    ASSERT_TRUE(testing::WaitFor([&] { return Stats()["orders"].get<int>() >= 10; },
                                 std::chrono::seconds(60)));
    worker.Signal(SIGKILL);
    auto killed = worker.Wait();
    EXPECT_EQ(killed.signal, SIGKILL);
  }
  EXPECT_LT(Stats()["emails"].get<int>(), 36) << "the kill came too late to matter";
  auto restarted = RunWaystone({"worker", "--workers", "4", "--exit-when-idle"}, Env());
  ASSERT_EQ(restarted.exit_code, 0) << restarted.err;
  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 40) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0);
  EXPECT_EQ(stats["line_messages"], 36);
  EXPECT_EQ(stats["duplicate_line_messages"], 0);
  EXPECT_EQ(stats["emails"], 36);
  EXPECT_EQ(stats["duplicate_emails"], 0);
  EXPECT_EQ(stats["orders_cancelled"], 4);
  auto store = OpenDb();
  ExpectEachStepCompletedOnce(*store);
}

TEST_F(CrashTest, WorkerThatOutlivesItsLeaseCommitsNothing) {
  ASSERT_EQ(RunWaystone({"start", Example(), "--input", Order("z1", "C-1")}, Env()).exit_code, 0);
  // A pauses right after the ERP call, past its 3s lease.
  testing::Process a(
      {testing::WaystoneBinary(), "worker", "--lease", "3s", "--exit-when-idle"},
      Env({{"WAYSTONE_PAUSE_AT", "after-call:create-order=7000"}, {"WAYSTONE_LOG", "info"}}),
      dir_.path());
  ASSERT_TRUE(testing::WaitFor([&] { return Stats()["orders"].get<int>() == 1; },
                               std::chrono::seconds(30)));
  // B takes over once A's lease has expired and finishes the instance.
  auto b = RunWaystone({"worker", "--lease", "3s", "--exit-when-idle"}, Env());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  auto store = OpenDb();
  auto instance = store->FindInstance("default", "crm:z1");
  ASSERT_TRUE(instance.ok());
  EXPECT_EQ(instance->state, InstanceState::kCompleted);
  // Then A wakes up holding a stale lease: its commit is refused.
  auto ra = a.Wait(std::chrono::seconds(60));
  EXPECT_EQ(ra.exit_code, 0) << ra.err;
  EXPECT_NE(ra.err.find("lease lost"), std::string::npos) << ra.err;
  auto steps = store->GetSteps(instance->id);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ((*steps)[1].resolution, Resolution::kLookupFound) << "B adopted A's order";
  Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1);
  EXPECT_EQ(stats["line_messages"], 1);
  ExpectEachStepCompletedOnce(*store);
}

TEST_F(CrashTest, ALongCallKeepsItsLeaseSoNoOtherWorkerTakesOver) {
  testing::WriteFile(dir_.File("slow.yaml"), R"(workflow: slow-read
key: "{{input.id}}"
steps:
  - name: read
    request: { method: GET, url: "{{env.CRM_URL}}/crm/customers/{{input.id}}", timeout: 8s }
)");
  ASSERT_TRUE(
      sim_->SetFaults(R"({"crm.get_customer": {"next": ["delay"], "delay_ms": 4500}})").ok());
  ASSERT_EQ(RunWaystone({"start", dir_.File("slow.yaml"), "--input", R"({"id": "C-1"})"}, Env())
                .exit_code,
            0);
  std::vector<std::string> worker = {testing::WaystoneBinary(), "worker", "--lease", "2s",
                                     "--exit-when-idle"};
  testing::Process a(worker, Env({{"WAYSTONE_LOG", "info"}}), dir_.path());
  ASSERT_TRUE(
      testing::WaitFor([&] { return Stats()["requests"].value("crm.get_customer", 0) == 1; },
                       std::chrono::seconds(20)));
  // B polls throughout the 4.5 s call; the 2 s lease is renewed, so B finds nothing.
  testing::Process b(worker, Env(), dir_.path());
  auto ra = a.Wait();
  auto rb = b.Wait();
  EXPECT_EQ(ra.exit_code, 0) << ra.err;
  EXPECT_EQ(rb.exit_code, 0) << rb.err;
  EXPECT_EQ(ra.err.find("lease lost"), std::string::npos) << ra.err;
  auto store = OpenDb();
  auto instance = store->FindInstance("default", "C-1");
  ASSERT_TRUE(instance.ok());
  EXPECT_EQ(instance->state, InstanceState::kCompleted);
  auto steps = store->GetSteps(instance->id);
  EXPECT_EQ((*steps)[0].attempts, 1);
  EXPECT_EQ((*steps)[0].unknowns, 0);
  EXPECT_EQ(Stats()["requests"]["crm.get_customer"], 1);
}

}  // namespace
}  // namespace waystone
