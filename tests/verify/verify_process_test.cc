// `waystone verify` as its users run it: the real binary, its worker processes
// killed (SIGKILL) and restarted at every boundary, against its simulated targets.
// It must pass the example saga, and catch each mutant — a lookup on the wrong
// field, a compensation that is not idempotent, an engine that calls without its
// `running` checkpoint — with a replay line that reproduces the failure.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/erp_target.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone::testing {
namespace {

using Json = nlohmann::json;

struct Verified {
  ProcessResult process;
  Json report;
};

Verified Verify(const std::string& definition, std::vector<std::string> extra,
                std::map<std::string, std::string> env = {}) {
  TempDir dir;
  std::vector<std::string> argv{WaystoneBinary(), "verify",     definition,
                                "--json",         "--work-dir", dir.File("work")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Verified verified;
  verified.process = RunProcess(argv, env, dir.path(), std::chrono::seconds(600));
  verified.report = Json::parse(verified.process.out, nullptr, false);
  return verified;
}

std::string Example(const std::string& name) { return SourceDir() + "/examples/" + name; }
std::string Mutant(const std::string& name) {
  return SourceDir() + "/tests/verify/mutants/" + name;
}

// The rows that failed or were not reached, for a failure's message.
std::string Troubles(const Json& report) {
  std::string troubles;
  if (!report.is_object() || !report.contains("rows")) return "(no report)";
  for (const Json& row : report["rows"]) {
    if (!row["pass"].get<bool>() || !row["reached"].get<bool>()) troubles += row.dump(1) + "\n";
  }
  return troubles;
}

// The first failing row whose broken invariants mention `what`.
const Json* FailingRow(const Json& report, const std::string& what) {
  for (const Json& row : report["rows"]) {
    if (row["pass"].get<bool>()) continue;
    for (const Json& line : row["broken"]) {
      if (line.get<std::string>().find(what) != std::string::npos) return &row;
    }
  }
  return nullptr;
}

TEST(VerifyProcessTest, TheExampleSagaRecoversAtEveryBoundaryFromEveryOutcome) {
  Verified verified = Verify(Example("order-to-erp.yaml"), {});
  ASSERT_EQ(verified.process.exit_code, 0) << verified.process.err << verified.process.out;
  const Json& report = verified.report;
  ASSERT_TRUE(report.is_object()) << verified.process.out;
  EXPECT_EQ(report["failures"], 0);
  EXPECT_TRUE(report["uncovered"].empty()) << report["uncovered"].dump();
  EXPECT_GE(report["schedules"].get<int>(), 100);
  int kill_rows = 0, frozen_rows = 0;
  std::set<std::string> states;
  for (const Json& row : report["rows"]) {
    EXPECT_TRUE(row["pass"].get<bool>()) << row.dump();
    const std::string spec = row["spec"].get<std::string>();
    if (spec.find("=kill") != std::string::npos || spec.find("crash:") != std::string::npos) {
      ++kill_rows;  // its worker really died there, and another took over
      EXPECT_GE(row["kills"].get<int>(), 1) << spec;
    }
    if (spec.find("=freeze") != std::string::npos) {
      ++frozen_rows;  // stopped with its answer unread; a second worker took over
      EXPECT_EQ(row["takeovers"].get<int>(), 1) << spec;
    }
    states.insert(row["state"].get<std::string>());
    EXPECT_GE(row["events_delivered"].get<int>(), 2) << spec;  // the relay ran every time
  }
  EXPECT_GE(kill_rows, 30);
  EXPECT_EQ(frozen_rows, 5);  // every side-effecting step
  // Not one happy path: rejections compensate, contradictions wait for people.
  EXPECT_TRUE(states.contains("completed"));
  EXPECT_TRUE(states.contains("compensated"));
  EXPECT_TRUE(states.contains("needs_attention"));
  for (const char* branch :
       {"create-order lookup found", "create-order lookup not found", "create-order compensated",
        "create-order compensate failed, then recovered", "notify-line call key replayed",
        "create-order call retried after 429"}) {
    EXPECT_NE(std::find(report["covered"].begin(), report["covered"].end(), branch),
              report["covered"].end())
        << branch;
  }
}

// The approval example and the one waiting for an event: the worker answers what
// the instance waits for (twice: the second must change nothing), and is killed
// during the wait and after the answer.
TEST(VerifyProcessTest, TheApprovalAndWaitExamplesRecoverToo) {
  for (const char* file :
       {"server/definitions/order-approval.yaml", "server/definitions/approved-order.yaml"}) {
    Verified verified = Verify(Example(file), {});
    ASSERT_EQ(verified.process.exit_code, 0)
        << file << verified.process.err << verified.process.out.substr(0, 4000);
    EXPECT_EQ(verified.report["failures"], 0) << file;
    EXPECT_TRUE(verified.report["uncovered"].empty())
        << file << verified.report["uncovered"].dump();
    int wait_kills = 0;
    for (const Json& row : verified.report["rows"]) {
      const std::string spec = row["spec"].get<std::string>();
      if (spec.starts_with("crash:during-wait") || spec.starts_with("crash:after-signal")) {
        EXPECT_EQ(row["kills"], 1) << spec;
        EXPECT_EQ(row["state"], "completed") << spec;
        ++wait_kills;
      }
    }
    EXPECT_EQ(wait_kills, 2) << file;
  }
}

// Two hundred keep the suite inside CI's time on a slow machine; the thousand of
// docs/verify.md are a run of the same command (`--schedules 1000`).
TEST(VerifyProcessTest, RandomSchedulesFromASeedAllHold) {
  Verified verified =
      Verify(Example("order-to-erp.yaml"), {"--schedules", "200", "--seed", "20261203"});
  ASSERT_EQ(verified.process.exit_code, 0)
      << verified.process.err << verified.process.out.substr(0, 4000);
  EXPECT_EQ(verified.report["schedules"], 200);
  EXPECT_EQ(verified.report["failures"], 0);
}

TEST(VerifyProcessTest, ThePagedExampleHoldsAndAnOperatorRunsItsLastCompensation) {
  // Its one side-effecting step is the last: no later step can fail, so the
  // compensation runs when an operator compensates the completed instance.
  Verified verified = Verify(Example("order-to-paged-erp.yaml"), {});
  ASSERT_EQ(verified.process.exit_code, 0) << verified.process.err << verified.process.out;
  EXPECT_EQ(verified.report["failures"], 0);
  EXPECT_EQ(verified.report["unreached"], 0);
  EXPECT_TRUE(verified.report["uncovered"].empty()) << verified.report["uncovered"].dump();
  const Json& covered = verified.report["covered"];
  EXPECT_NE(std::find(covered.begin(), covered.end(), "create-order compensated"), covered.end());
}

// LINE and email side by side, over SMTP too: the email stand-in counts messages by
// Message-ID and loses the reply to the end of DATA; the corrections run when an
// operator undoes the order; a frozen worker is taken over after a lease that must
// outlast the email's two-minute timeout (the slowest test here: about 2 minutes).
TEST(VerifyProcessTest, TheNotificationExampleRecoversOverLineAndEmail) {
  Verified verified = Verify(Example("order-notify.yaml"), {});
  ASSERT_EQ(verified.process.exit_code, 0) << verified.process.err << Troubles(verified.report);
  EXPECT_EQ(verified.report["failures"], 0);
  EXPECT_EQ(verified.report["unreached"], 0);
  EXPECT_TRUE(verified.report["uncovered"].empty()) << verified.report["uncovered"].dump();
  const Json& covered = verified.report["covered"];
  for (const char* branch :
       {"receipt-email compensated", "confirm-line compensated", "confirm-line call key replayed",
        "receipt-email call retried after 429"}) {
    EXPECT_NE(std::find(covered.begin(), covered.end(), branch), covered.end()) << branch;
  }
  int takeovers = 0;
  for (const Json& row : verified.report["rows"]) takeovers += row["takeovers"].get<int>();
  EXPECT_EQ(takeovers, 4);  // every side-effecting step's worker frozen once
}

// Each mutant fails a row, and that row's replay line fails the same way alone.
struct MutantCase {
  const char* file;
  const char* broken;
  std::map<std::string, std::string> env;
  const char* definition_dir;  // "examples" or the mutants' folder
  const char* contract = "";   // a contract file in the mutants' folder
};

class VerifyMutantTest : public ::testing::TestWithParam<MutantCase> {};

TEST_P(VerifyMutantTest, IsCaughtWithAReplayThatReproducesIt) {
  const MutantCase& c = GetParam();
  const std::string definition =
      std::string(c.definition_dir) == "examples" ? Example(c.file) : Mutant(c.file);
  std::vector<std::string> flags;
  if (*c.contract != '\0') flags = {"--contract", Mutant(c.contract)};
  Verified verified = Verify(definition, flags, c.env);
  ASSERT_EQ(verified.process.exit_code, 1)
      << verified.process.err << verified.process.out.substr(0, 4000);
  const Json* row = FailingRow(verified.report, c.broken);
  ASSERT_NE(row, nullptr) << verified.process.out.substr(0, 6000);
  const std::string replay = (*row)["replay"].get<std::string>();
  EXPECT_NE(replay.find("--replay"), std::string::npos) << replay;
  EXPECT_FALSE((*row)["target_log"].empty());

  flags.insert(flags.end(), {"--replay", (*row)["spec"].get<std::string>()});
  Verified again = Verify(definition, flags, c.env);
  EXPECT_EQ(again.process.exit_code, 1) << again.process.out;
  EXPECT_EQ(again.report["schedules"], 1);
  EXPECT_NE(FailingRow(again.report, c.broken), nullptr) << again.process.out;
}

INSTANTIATE_TEST_SUITE_P(
    Mutants, VerifyMutantTest,
    ::testing::Values(MutantCase{"wrong-lookup-field.yaml", "took effect 2 times", {}, "mutants"},
                      MutantCase{"compensation-not-idempotent.yaml",
                                 "compensation of 'create-order' took effect 2 times",
                                 {},
                                 "mutants"},
                      MutantCase{"order-to-erp.yaml",
                                 "took effect 2 times",
                                 {{"WAYSTONE_TEST_SWITCH", "skip-running-checkpoint"}},
                                 "examples"},
                      MutantCase{"key-not-honoured.yaml",
                                 "step 'send-message' took effect 2 times",
                                 {},
                                 "mutants",
                                 "key-not-honoured.contract.yaml"}));

TEST(VerifyProcessTest, WithoutItsContractFileTheKeyMutantLooksFine) {
  // The definition alone says the key is honoured: what the contract file adds is
  // what makes the difference, and a bad contract file is refused at its line.
  Verified verified = Verify(Mutant("key-not-honoured.yaml"), {});
  EXPECT_EQ(verified.process.exit_code, 0) << verified.process.out.substr(0, 2000);
  TempDir dir;
  WriteFile(dir.File("bad.yaml"), "targets:\n  CHAT_URL: { honors_keys: maybe }\n");
  ProcessResult bad = RunProcess({WaystoneBinary(), "verify", Mutant("key-not-honoured.yaml"),
                                  "--contract", dir.File("bad.yaml")},
                                 {}, dir.path());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("bad.yaml:2: target 'CHAT_URL': honors_keys is true or false"),
            std::string::npos)
      << bad.err;
}

// Against a sandbox verify did not write (tests/targets/erp_target.py, plain
// Python): the proxy sends each committing request on and then loses, delays or
// resets the sandbox's answer. What the sandbox itself counts is the judge here.
TEST(VerifyProcessTest, AgainstAnIndependentSandboxItCountsNoSecondOrderAndCatchesABadLookup) {
  TempDir dir;
  ErpTarget sandbox(dir.path());
  ASSERT_TRUE(sandbox.ok());
  const std::string url = sandbox.base_url();
  auto stats = [&] { return Json::parse(sandbox.StatsJson(), nullptr, false); };

  Verified verified = Verify(SourceDir() + "/tests/verify/against/order-and-message.yaml",
                             {"--against", "ERP_URL=" + url});
  ASSERT_EQ(verified.process.exit_code, 0)
      << verified.process.err << verified.process.out.substr(0, 4000);
  Json counted = stats();
  ASSERT_TRUE(counted.is_object());
  EXPECT_GE(counted["orders"].get<int>(), 50) << counted["by_route"].dump();
  EXPECT_EQ(counted["duplicate_orders"], 0) << counted["orders_by_ref"].dump();
  EXPECT_EQ(counted["duplicate_messages"], 0);
  EXPECT_GT(counted["by_route"]["cancel_order"].get<int>(), 0);  // compensations reached it
  EXPECT_GT(counted["by_route"]["find_orders"].get<int>(), 0);

  sandbox.Call("POST", "/_target/reset", "");
  Verified mutant = Verify(SourceDir() + "/tests/verify/mutants/wrong-lookup-field.yaml",
                           {"--against", "ERP_URL=" + url});
  EXPECT_EQ(mutant.process.exit_code, 1) << mutant.process.out.substr(0, 4000);
  EXPECT_NE(FailingRow(mutant.report, "but its lookup finds nothing"), nullptr);
  counted = stats();
  EXPECT_GT(counted["duplicate_orders"].get<int>(), 0);  // what verify said, the sandbox shows
}

TEST(VerifyProcessTest, TheBrokenEngineSwitchIsOffByDefault) {
  Verified verified =
      Verify(Example("order-to-erp.yaml"), {"--replay", "call:create-order#1=kill"});
  EXPECT_EQ(verified.process.exit_code, 0) << verified.process.out;
  EXPECT_EQ(verified.report["rows"][0]["kills"], 1);
}

TEST(VerifyProcessTest, ADefinitionLintRefusesIsNeverRun) {
  TempDir dir;
  ProcessResult result =
      RunProcess({WaystoneBinary(), "verify", Mutant("ignored-key.yaml")}, {}, dir.path());
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("ignored-key.yaml:7: step 'send-message'"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("nothing was run"), std::string::npos) << result.err;
}

TEST(VerifyProcessTest, ABadReplayIsRefusedNamingTheItem) {
  TempDir dir;
  ProcessResult result = RunProcess({WaystoneBinary(), "verify", Example("order-to-erp.yaml"),
                                     "--replay", "call:create-order#1=explode"},
                                    {}, dir.path());
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("call:create-order#1=explode"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace waystone::testing
