// The `waystone` binary end to end: clear one-line errors, exit codes, and bad
// input that changes nothing.

#include <signal.h>

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sim/simulator.h"
#include "store/store.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start({});
    ASSERT_TRUE(sim.ok());
    sim_ = std::move(*sim);
    db_ = dir_.File("cli.db");
  }

  std::map<std::string, std::string> Env() {
    return {{"CRM_URL", sim_->base_url()},
            {"ERP_URL", sim_->base_url()},
            {"LINE_URL", sim_->base_url()},
            {"EMAIL_URL", sim_->base_url()},
            {"WAYSTONE_SECRET_ERP_TOKEN", "t"},
            {"WAYSTONE_SECRET_LINE_TOKEN", "t"},
            {"WAYSTONE_DB", db_}};
  }

  testing::ProcessResult Waystone(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {testing::WaystoneBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunProcess(argv, Env(), dir_.path());
  }

  std::string Write(const std::string& name, const std::string& text) {
    testing::WriteFile(dir_.File(name), text);
    return dir_.File(name);
  }

  size_t InstanceCount() {
    auto store = OpenStore({db_});
    EXPECT_TRUE(store.ok()) << store.status();
    return (*store)->ListInstances({})->size();
  }

  static std::string Example() { return testing::SourceDir() + "/examples/order-to-erp.yaml"; }

  testing::TempDir dir_;
  std::string db_;
  std::unique_ptr<Simulator> sim_;
};

// One clear line: no stack dump, names what is wrong.
void ExpectOneLineError(const testing::ProcessResult& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Aborted"), std::string::npos) << r.err;
}

TEST_F(CliTest, LintAcceptsTheExamples) {
  auto r = Waystone({"lint", Example()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("1 definition(s) ok"), std::string::npos);
}

TEST_F(CliTest, LintNamesFileLineAndStep) {
  const std::string file = Write("bad.yaml", R"(workflow: bad
key: "{{input.id}}"
steps:
  - name: notify
    request: { method: POST, url: "http://x/{{steps.later.response.id}}" }
    colour: blue
  - name: later
    request: { method: GET, url: "http://x" }
)");
  auto r = Waystone({"lint", file});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(file + ":6: step 'notify': unknown field 'colour'"), std::string::npos)
      << r.err;
}

TEST_F(CliTest, MalformedYamlIsOneClearLineAndWritesNothing) {
  const std::string file = Write("broken.yaml", "workflow: x\nsteps: [\n  - name: a\n");
  auto r = Waystone({"run", file, "--input", R"({"id": 1})"});
  ExpectOneLineError(r, file + ":");
  EXPECT_NE(r.err.find("malformed YAML"), std::string::npos);
  EXPECT_EQ(InstanceCount(), 0u);
}

TEST_F(CliTest, BadTemplateIsRefusedBeforeAnythingRuns) {
  const std::string file = Write("tpl.yaml", R"(workflow: tpl
key: "{{input.id}}"
steps:
  - name: read
    request: { method: GET, url: "{{env.CRM_URL}}/crm/customers/{{input.id" }
)");
  auto r = Waystone({"run", file, "--input", R"({"id": "1"})"});
  ExpectOneLineError(r, "unclosed");
  EXPECT_EQ(InstanceCount(), 0u);
  EXPECT_EQ(Json::parse(sim_->StatsJson())["requests"].size(), 0u);
}

TEST_F(CliTest, OversizedOrMalformedInputIsRefusedAndWritesNothing) {
  const std::string big = Write(
      "big.json",
      Json{{"source", "crm"}, {"order_id", "1"}, {"pad", std::string(300 * 1024, 'x')}}.dump());
  ExpectOneLineError(Waystone({"run", Example(), "--input", "@" + big}), "the limit is 262144");
  ExpectOneLineError(Waystone({"run", Example(), "--input", "{not json"}), "not valid JSON");
  ExpectOneLineError(Waystone({"run", Example(), "--input", R"({"source": "crm"})"}),
                     "input.order_id");
  EXPECT_EQ(InstanceCount(), 0u);
}

TEST_F(CliTest, SameKeyWithAnotherInputIsAConflictNamingBothHashes) {
  const std::string a = R"({"source":"crm","order_id":"9","customer_id":"C-1","amount":1})";
  const std::string b = R"({"source":"crm","order_id":"9","customer_id":"C-1","amount":2})";
  auto first = Waystone({"start", Example(), "--input", a});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.out.find("started\tcrm:9"), std::string::npos);
  auto again = Waystone({"start", Example(), "--input", a});
  EXPECT_NE(again.out.find("exists\tcrm:9"), std::string::npos);
  auto conflict = Waystone({"start", Example(), "--input", b});
  ExpectOneLineError(conflict, "input hash");
  EXPECT_EQ(InstanceCount(), 1u);
}

TEST_F(CliTest, SameEventTwiceStartsOnce) {
  const std::string a = R"({"source":"crm","order_id":"10","customer_id":"C-1","amount":1})";
  auto first =
      Waystone({"start", Example(), "--input", a, "--event-source", "crm", "--event-id", "e1"});
  auto second =
      Waystone({"start", Example(), "--input", a, "--event-source", "crm", "--event-id", "e1"});
  EXPECT_NE(first.out.find("started"), std::string::npos);
  EXPECT_NE(second.out.find("duplicate event"), std::string::npos) << second.out;
  EXPECT_EQ(InstanceCount(), 1u);
}

TEST_F(CliTest, RunStatusListAndExitCodes) {
  auto ok = Waystone({"run", Example(), "--input",
                      R"({"source":"crm","order_id":"1","customer_id":"C-1","amount":5})"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  auto compensated =
      Waystone({"run", Example(), "--input",
                R"({"source":"crm","order_id":"2","customer_id":"C-BLOCKED","amount":5})"});
  EXPECT_EQ(compensated.exit_code, 3) << compensated.err;
  auto status = Waystone({"status", "crm:2", "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  Json doc = Json::parse(status.out);
  EXPECT_EQ(doc["state"], "compensated");
  EXPECT_EQ(doc["steps"][1]["state"], "compensated");
  EXPECT_EQ(doc["steps"][2]["error_class"], "rejected");
  auto summary = Waystone({"status", "--json", "--sim", sim_->base_url()});
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  Json s = Json::parse(summary.out);
  EXPECT_EQ(s["instances"]["completed"], 1);
  EXPECT_EQ(s["instances"]["compensated"], 1);
  EXPECT_EQ(s["simulator"]["orders"], 2);
  auto list = Waystone({"list", "--state", "completed"});
  EXPECT_NE(list.out.find("crm:1"), std::string::npos);
  EXPECT_EQ(list.out.find("crm:2"), std::string::npos);
  ExpectOneLineError(Waystone({"list", "--state", "sleeping"}), "--state 'sleeping'");
  auto dry = Waystone({"gc", "--older-than", "0s", "--dry-run"});
  EXPECT_NE(dry.out.find("would remove 2 instances"), std::string::npos) << dry.out << dry.err;
  EXPECT_EQ(InstanceCount(), 2u);
  auto gc = Waystone({"gc", "--older-than", "0s"});
  EXPECT_NE(gc.out.find("removed 2 instances"), std::string::npos) << gc.out << gc.err;
  EXPECT_EQ(InstanceCount(), 0u);
  ExpectOneLineError(Waystone({"gc", "--older-than", "soon"}), "--older-than 'soon'");
  ExpectOneLineError(Waystone({"status", "crm:404"}), "no instance 'crm:404'");
  EXPECT_EQ(Waystone({"frobnicate"}).exit_code, 2);
}

TEST_F(CliTest, PlanPrintsEveryStep) {
  auto r = Waystone({"plan", Example()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* step : {"fetch-customer", "create-order", "reserve-shipment", "notify-line",
                           "send-email", "link-in-crm"}) {
    EXPECT_NE(r.out.find(step), std::string::npos) << step;
  }
}

TEST_F(CliTest, WorkerAndSimulatorStopOnSigterm) {
  testing::Process worker({testing::WaystoneBinary(), "worker"}, Env(), dir_.path());
  testing::Process sim({testing::WaystoneBinary(), "sim", "--port", "0"}, Env(), dir_.path());
  // Wait until both say they run (their signal handlers are in place by then).
  ASSERT_TRUE(
      testing::WaitFor([&] { return worker.Errors().find("running with") != std::string::npos; },
                       std::chrono::seconds(30)));
  ASSERT_TRUE(
      testing::WaitFor([&] { return sim.Output().find("listening on") != std::string::npos; },
                       std::chrono::seconds(30)));
  worker.Signal(SIGTERM);
  sim.Signal(SIGTERM);
  auto w = worker.Wait(std::chrono::seconds(20));
  auto s = sim.Wait(std::chrono::seconds(20));
  EXPECT_EQ(w.exit_code, 0) << w.err;
  EXPECT_NE(w.err.find("worker stopped"), std::string::npos) << w.err;
  EXPECT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("listening on http://127.0.0.1:"), std::string::npos) << s.out;
}

TEST_F(CliTest, ServeAnswersWithATokenCreatedOnTheCommandLine) {
  ASSERT_EQ(Waystone({"start", Example(), "--input",
                      R"({"source":"crm","order_id":"s1","customer_id":"C-1","amount":1})"})
                .exit_code,
            0);
  auto created = Waystone(
      {"token", "create", "--tenant", "default", "--role", "viewer", "--name", "cli-viewer"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  const std::string token = created.out.substr(0, created.out.find('\n'));
  ASSERT_TRUE(token.starts_with("wst_")) << created.out;
  EXPECT_EQ(Waystone({"token", "create", "--tenant", "default", "--role", "god", "--name", "x"})
                .exit_code,
            1);

  testing::Process serve(
      {testing::WaystoneBinary(), "serve", "--api-only", "--listen", "127.0.0.1:0"}, Env(),
      dir_.path());
  std::string url;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const std::string out = serve.Output();
        const size_t at = out.find("api on ");
        if (at == std::string::npos) return false;
        url = out.substr(at + 7, out.find('\n', at) - at - 7);
        return true;
      },
      std::chrono::seconds(30)));
  auto listed = testing::RunProcess(
      {"/usr/bin/curl", "-s", "-H", "Authorization: Bearer " + token, url + "/v1/instances"}, {},
      dir_.path());
  Json items = Json::parse(listed.out, nullptr, false);
  ASSERT_TRUE(items.is_object()) << listed.out;
  EXPECT_EQ(items["items"].size(), 1u);
  EXPECT_EQ(items["items"][0]["key"], "crm:s1");
  auto refused = testing::RunProcess(
      {"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url + "/v1/instances"}, {},
      dir_.path());
  EXPECT_EQ(refused.out, "401");
  serve.Signal(SIGTERM);
  EXPECT_EQ(serve.Wait(std::chrono::seconds(30)).exit_code, 0);
}

}  // namespace
}  // namespace waystone
