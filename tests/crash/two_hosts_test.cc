// Two worker "hosts" in network namespaces this test makes (ip netns + veth + a
// bridge), PostgreSQL and the simulator in a third. One worker's link is cut
// mid-run; the other takes over its instances once their leases expire.
// Skipped, saying why, where network namespaces cannot be created.

#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "store/store.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kDbAddress[] = "10.231.0.1";

std::string PgBinDir() {
  for (const char* dir : {"/usr/local/bin", "/usr/bin"}) {
    if (std::filesystem::exists(std::string(dir) + "/pg_ctl")) return dir;
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
    if (std::filesystem::exists(e.path() / "bin/pg_ctl")) return (e.path() / "bin").string();
  }
  return "";
}

class TwoHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(getpid() % 100000);
    ns_db_ = "wsdb" + id;
    ns_a_ = "wsa" + id;
    ns_b_ = "wsb" + id;
    if (geteuid() != 0 || !Ip({"netns", "add", ns_db_})) {
      GTEST_SKIP() << "network namespaces cannot be created here (needs root and ip netns); "
                      "the two-hosts test did not run";
    }
    made_ = true;
    ASSERT_TRUE(Ip({"netns", "add", ns_a_}));
    ASSERT_TRUE(Ip({"netns", "add", ns_b_}));
    // db: a bridge with both hosts' links; every host sees the database at one address.
    ASSERT_TRUE(Ip({"-n", ns_db_, "link", "add", "br0", "type", "bridge"}));
    int host = 2;
    for (const auto& [ns, link] : {std::pair{ns_a_, "a" + id}, std::pair{ns_b_, "b" + id}}) {
      const std::string peer = link + "d";
      ASSERT_TRUE(Ip({"link", "add", link, "type", "veth", "peer", "name", peer}));
      ASSERT_TRUE(Ip({"link", "set", link, "netns", ns}));
      ASSERT_TRUE(Ip({"link", "set", peer, "netns", ns_db_}));
      ASSERT_TRUE(Ip({"-n", ns_db_, "link", "set", peer, "master", "br0"}));
      ASSERT_TRUE(Ip({"-n", ns_db_, "link", "set", peer, "up"}));
      ASSERT_TRUE(
          Ip({"-n", ns, "addr", "add", "10.231.0." + std::to_string(host++) + "/24", "dev", link}));
      ASSERT_TRUE(Ip({"-n", ns, "link", "set", link, "up"}));
      ASSERT_TRUE(Ip({"-n", ns, "link", "set", "lo", "up"}));
    }
    link_a_ = "a" + id;
    ASSERT_TRUE(Ip({"-n", ns_db_, "addr", "add", std::string(kDbAddress) + "/24", "dev", "br0"}));
    ASSERT_TRUE(Ip({"-n", ns_db_, "link", "set", "br0", "up"}));
    ASSERT_TRUE(Ip({"-n", ns_db_, "link", "set", "lo", "up"}));
    StartPostgres();
  }

  void TearDown() override {
    processes_.clear();  // SIGKILLs whatever still runs
    if (!pg_data_.empty()) {
      testing::RunProcess({"/usr/sbin/runuser", "-u", "postgres", "--", PgBinDir() + "/pg_ctl",
                           "-D", pg_data_, "-m", "immediate", "-w", "stop"},
                          {}, dir_.path());
    }
    if (made_) {
      for (const auto& ns : {ns_a_, ns_b_, ns_db_}) Ip({"netns", "del", ns});
    }
  }

  bool Ip(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/sbin/ip"};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunProcess(argv, {}, dir_.path()).exit_code == 0;
  }

  // Runs argv inside namespace `ns`.
  std::vector<std::string> In(const std::string& ns, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", ns});
    return argv;
  }

  void StartPostgres() {
    const std::string bin = PgBinDir();
    ASSERT_FALSE(bin.empty());
    pg_dir_ = dir_.File("pg");
    std::filesystem::create_directories(pg_dir_);
    const passwd* pw = getpwnam("postgres");
    ASSERT_NE(pw, nullptr);
    ASSERT_EQ(chown(dir_.path().c_str(), pw->pw_uid, pw->pw_gid), 0);
    ASSERT_EQ(chown(pg_dir_.c_str(), pw->pw_uid, pw->pw_gid), 0);
    pg_data_ = pg_dir_ + "/data";
    auto init = testing::RunProcess({"/usr/sbin/runuser", "-u", "postgres", "--", bin + "/initdb",
                                     "-D", pg_data_, "-U", "waystone", "--auth=trust", "--no-sync"},
                                    {}, dir_.path());
    ASSERT_EQ(init.exit_code, 0) << init.err;
    std::ofstream(pg_data_ + "/pg_hba.conf", std::ios::app) << "host all all 10.231.0.0/24 trust\n";
    auto start = testing::RunProcess(
        In(ns_db_, {"/usr/sbin/runuser", "-u", "postgres", "--", bin + "/pg_ctl", "-D", pg_data_,
                    "-w", "-l", pg_dir_ + "/log", "-o",
                    "-p 5432 -k " + pg_dir_ + " -c listen_addresses=" + kDbAddress + " -c fsync=on",
                    "start"}),
        {}, dir_.path());
    ASSERT_EQ(start.exit_code, 0) << start.err << start.out;
    // The test itself reaches the server through its Unix socket (a file, visible
    // from every namespace); the workers through their links.
    auto created = testing::RunProcess({"/usr/bin/psql", "-h", pg_dir_, "-p", "5432", "-U",
                                        "waystone", "-d", "postgres", "-c", "CREATE DATABASE two"},
                                       {}, dir_.path());
    ASSERT_EQ(created.exit_code, 0) << created.err;
    local_db_ = "postgresql://waystone@/two?host=" + pg_dir_ + "&port=5432";
  }

  std::map<std::string, std::string> WorkerEnv() {
    const std::string sim = std::string("http://") + kDbAddress + ":8900";
    return {{"CRM_URL", sim},
            {"ERP_URL", sim},
            {"LINE_URL", sim},
            {"EMAIL_URL", sim},
            {"WAYSTONE_SECRET_ERP_TOKEN", "t"},
            {"WAYSTONE_SECRET_LINE_TOKEN", "t"},
            {"WAYSTONE_DB", std::string("postgresql://waystone@") + kDbAddress + ":5432/two"}};
  }

  Json SimStats() {
    auto r = testing::RunProcess(
        In(ns_db_, {"/usr/bin/curl", "-s", "http://127.0.0.1:8900/_sim/stats"}), {}, dir_.path());
    return Json::parse(r.out, nullptr, false);
  }

  testing::TempDir dir_;
  std::string ns_db_, ns_a_, ns_b_, link_a_;
  bool made_ = false;
  std::string pg_dir_, pg_data_, local_db_;
  std::vector<std::unique_ptr<testing::Process>> processes_;
};

TEST_F(TwoHostsTest, CutLinkWorkersInstancesAreTakenOverAfterTheirLeasesExpire) {
  processes_.push_back(std::make_unique<testing::Process>(
      In(ns_db_, {testing::WaystoneBinary(), "sim", "--host", "0.0.0.0", "--port", "8900",
                  "--faults", R"({"erp.create_shipment": {"delay": 0.5, "delay_ms": 400}})"}),
      std::map<std::string, std::string>{}, dir_.path()));
  ASSERT_TRUE(testing::WaitFor([&] { return SimStats().is_object(); }, std::chrono::seconds(10)));

  std::string lines;
  for (int i = 0; i < 60; ++i) {
    lines += Json{{"source", "crm"},
                  {"order_id", "h" + std::to_string(i)},
                  {"customer_id", (i % 10 == 9 ? "C-BLOCKED-" : "C-") + std::to_string(i)},
                  {"amount", 5}}
                 .dump() +
             "\n";
  }
  testing::WriteFile(dir_.File("orders.jsonl"), lines);
  auto env = WorkerEnv();
  env["WAYSTONE_DB"] = local_db_;
  auto started = testing::RunProcess(
      {testing::WaystoneBinary(), "start", testing::SourceDir() + "/examples/order-to-erp.yaml",
       "--inputs", dir_.File("orders.jsonl")},
      env, dir_.path());
  ASSERT_EQ(started.exit_code, 0) << started.err;

  std::vector<std::string> worker = {
      testing::WaystoneBinary(), "worker", "--workers", "4", "--lease", "3s"};
  processes_.push_back(
      std::make_unique<testing::Process>(In(ns_a_, worker), WorkerEnv(), dir_.path()));
  testing::Process* a = processes_.back().get();
  processes_.push_back(
      std::make_unique<testing::Process>(In(ns_b_, worker), WorkerEnv(), dir_.path()));

  auto store = OpenStore({local_db_});
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string a_owner = "/" + std::to_string(a->pid()) + "/";
  std::set<int64_t> held_by_a;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto instances = (*store)->ListInstances({std::nullopt, std::nullopt, std::nullopt, 1000});
        held_by_a.clear();
        for (const auto& i : instances.ok() ? *instances : std::vector<InstanceRecord>{}) {
          if (i.lease_owner.find(a_owner) != std::string::npos && !IsTerminal(i.state)) {
            held_by_a.insert(i.id);
          }
        }
        return held_by_a.size() >= 2;
      },
      std::chrono::seconds(30)))
      << "worker A never held instances";
  ASSERT_TRUE(Ip({"-n", ns_a_, "link", "set", link_a_, "down"}));  // A is cut off

  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto summary = (*store)->Summary();
        if (!summary.ok()) return false;
        int64_t resting = 0;
        for (const auto& [state, n] : summary->instances_by_state) {
          if (IsTerminal(state)) resting += n;
        }
        return resting == 60;
      },
      std::chrono::seconds(120)));
  for (int64_t id : held_by_a) {
    auto instance = (*store)->GetInstance(id);
    ASSERT_TRUE(instance.ok());
    EXPECT_TRUE(instance->state == InstanceState::kCompleted ||
                instance->state == InstanceState::kCompensated)
        << instance->key << " " << ToString(instance->state);
    EXPECT_EQ(instance->lease_owner.find(a_owner), std::string::npos);
  }
  Json stats = SimStats();
  EXPECT_EQ(stats["orders"], 60) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["line_messages"], 54) << stats.dump();
  EXPECT_EQ(stats["duplicate_line_messages"], 0) << stats.dump();
  EXPECT_EQ(stats["duplicate_emails"], 0) << stats.dump();
  EXPECT_EQ(stats["orders_cancelled"], 6) << stats.dump();
}

}  // namespace
}  // namespace waystone
