// A parallel group across SIGKILLs: the `waystone` binary is killed right after one
// branch's call (WAYSTONE_CRASH_AT) and run again. Counted at the independent webhook
// receiver (tests/targets/webhook_receiver.py): the killed branch is resubmitted under
// its own Webhook-Id, the branch that had completed is not sent again.

#include <signal.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/erp_target.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

class ParallelCrashTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    hook_ = std::make_unique<testing::TargetProcess>(dir_.path(), "webhook_receiver.py",
                                                     std::vector<std::string>{});
    ASSERT_TRUE(hook_->ok());
  }

  testing::ProcessResult Run(std::map<std::string, std::string> env = {}) {
    env.emplace("WAYSTONE_DB", dir_.File("parallel.db"));
    env.emplace("HOOK_URL", hook_->base_url());
    return testing::RunProcess({testing::WaystoneBinary(), "run",
                                testing::SourceDir() + "/tests/fixtures/parallel-hooks.yaml",
                                "--input", R"({"id":"o-1"})"},
                               env, dir_.path());
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TargetProcess> hook_;
};

TEST_P(ParallelCrashTest, OnlyTheKilledBranchIsSentAgain) {
  const std::string killed = GetParam();
  auto crashed = Run({{"WAYSTONE_CRASH_AT", "after-call:" + killed}});
  ASSERT_EQ(crashed.signal, SIGKILL) << "exit " << crashed.exit_code << "\n" << crashed.err;
  auto resumed = Run();
  EXPECT_NE(resumed.out.find("state     completed"), std::string::npos) << resumed.out
                                                                        << resumed.err;
  const Json stats = Json::parse(hook_->StatsJson());
  std::map<std::string, int> delivered;  // path -> deliveries
  std::map<std::string, std::string> id_of;
  for (const Json& d : stats["deliveries"]) {
    delivered[d["path"].get<std::string>()] += 1;
    id_of[d["path"].get<std::string>()] = d["id"].get<std::string>();
  }
  EXPECT_EQ(delivered, (std::map<std::string, int>{{"/crm", 1}, {"/wms", 1}, {"/done", 1}}))
      << stats.dump();
  EXPECT_EQ(stats["requests_total"], 4) << "three steps, one of them sent twice";
  EXPECT_EQ(stats["duplicates_seen"], 1);
  const std::string killed_path = killed == "to-crm" ? "/crm" : "/wms";
  const std::string other_path = killed == "to-crm" ? "/wms" : "/crm";
  EXPECT_EQ(stats["by_id"][id_of[killed_path]], 2) << "resubmitted under its own id";
  EXPECT_EQ(stats["by_id"][id_of[other_path]], 1) << "the other branch is not sent again";
}

INSTANTIATE_TEST_SUITE_P(EachBranch, ParallelCrashTest, ::testing::Values("to-crm", "to-wms"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace waystone
