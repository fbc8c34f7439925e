// A parallel group across SIGKILLs: the `waystone` binary is killed right after one
// branch's call (WAYSTONE_CRASH_AT) and run again. The branches call at once: CRM a
// slow endpoint (tests/targets/slow_target.py, answering after 0.5 s, counting
// Idempotency-Keys), WMS the webhook receiver (tests/targets/webhook_receiver.py,
// deduplicating on Webhook-Id). Counted there: a branch whose outcome was checkpointed
// before the kill is never sent again; one still under way is resubmitted under its
// own key; each business effect happens once.

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
    slow_ = std::make_unique<testing::TargetProcess>(dir_.path(), "slow_target.py",
                                                     std::vector<std::string>{"--delay", "0.5"});
    ASSERT_TRUE(hook_->ok() && slow_->ok());
  }

  testing::ProcessResult Run(std::map<std::string, std::string> env = {}) {
    env.emplace("WAYSTONE_DB", dir_.File("parallel.db"));
    env.emplace("HOOK_URL", hook_->base_url());
    env.emplace("SLOW_URL", slow_->base_url());
    return testing::RunProcess({testing::WaystoneBinary(), "run",
                                testing::SourceDir() + "/tests/fixtures/parallel-hooks.yaml",
                                "--input", R"({"id":"o-1"})"},
                               env, dir_.path());
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TargetProcess> hook_;
  std::unique_ptr<testing::TargetProcess> slow_;
};

TEST_P(ParallelCrashTest, ABranchCheckpointedBeforeTheKillIsNotSentAgain) {
  const std::string killed = GetParam();
  auto crashed = Run({{"WAYSTONE_CRASH_AT", "after-call:" + killed}});
  ASSERT_EQ(crashed.signal, SIGKILL) << "exit " << crashed.exit_code << "\n" << crashed.err;
  auto resumed = Run();
  EXPECT_NE(resumed.out.find("state     completed"), std::string::npos)
      << resumed.out << resumed.err;
  const Json hook = Json::parse(hook_->StatsJson());
  std::map<std::string, int> delivered;  // path -> deliveries
  std::map<std::string, std::string> id_of;
  for (const Json& d : hook["deliveries"]) {
    delivered[d["path"].get<std::string>()] += 1;
    id_of[d["path"].get<std::string>()] = d["id"].get<std::string>();
  }
  EXPECT_EQ(delivered, (std::map<std::string, int>{{"/wms", 1}, {"/done", 1}})) << hook.dump();
  const Json slow = Json::parse(slow_->Call("GET", "/_stats", ""));
  EXPECT_EQ(slow["keys"], 1) << "one key for the CRM branch, whatever was resent: " << slow.dump();
  if (killed == "to-crm") {
    // WMS answered in milliseconds and was checkpointed while CRM's answer was on its way.
    EXPECT_EQ(hook["by_id"][id_of["/wms"]], 1) << "the WMS branch is not sent again";
    EXPECT_EQ(slow["received"], 2) << "CRM resubmitted under its own key: " << slow.dump();
    EXPECT_EQ(slow["duplicate_keys"], 1);
  } else {
    // Killed on WMS's answer while CRM's call was still under way: both are resubmitted,
    // each under its own key.
    EXPECT_EQ(hook["by_id"][id_of["/wms"]], 2) << hook.dump();
    EXPECT_GE(slow["received"], 1) << slow.dump();
    EXPECT_LE(slow["received"], 2) << slow.dump();
  }
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
