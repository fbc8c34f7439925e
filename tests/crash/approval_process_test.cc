// Approvals on a real `waystone serve` (examples/server/definitions/order-approval.yaml):
// approvers are independent HTTP clients (tests/integration/approvers.py, Python's urllib, all
// going at once), the order goes to tests/targets/erp_target.py, which makes a new
// order for every create it receives and counts them. Two approvers at once: one
// decision, one order; the requester and a non-member refused; the server
// SIGKILLed just before and just after a decision commits, restarted, the approver
// sending again: one decision, one order.

#include <signal.h>

#include <algorithm>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "support/erp_target.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kKey[] = "crm:o-1";

class ApprovalProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    erp_ = std::make_unique<testing::TargetProcess>(dir_.path(), "erp_target.py",
                                                    std::vector<std::string>{});
    ASSERT_TRUE(erp_->ok());
    std::filesystem::create_directories(dir_.File("defs"));
    std::filesystem::copy_file(
        testing::SourceDir() + "/examples/server/definitions/order-approval.yaml",
        dir_.File("defs/order-approval.yaml"));
    std::ofstream(dir_.File("server.yaml")) << "definitions: defs\n"
                                               "workers: 2\n"
                                               "groups:\n"
                                               "  - tenant: default\n"
                                               "    name: finance\n"
                                               "    tokens: [alice, dave, bob]\n";
    env_ = {{"WAYSTONE_DB", dir_.File("w.db")},
            {"ERP_URL", erp_->base_url()},
            {"WAYSTONE_SECRET_ERP_TOKEN", "erp-secret"}};
    for (const char* name : {"alice", "dave", "bob", "erin"}) tokens_[name] = Token(name, "viewer");
    tokens_["ops"] = Token("ops", "operator");
    port_ = testing::FreeLoopbackPort();
    http_ = NewCurlHttpClient({});
  }

  std::string Token(const std::string& name, const std::string& role) {
    auto created = testing::RunProcess({testing::WaystoneBinary(), "token", "create", "--tenant",
                                        "default", "--role", role, "--name", name},
                                       env_, dir_.path());
    EXPECT_EQ(created.exit_code, 0) << created.err;
    return created.out.substr(0, created.out.find('\n'));
  }

  std::unique_ptr<testing::Process> Serve(std::map<std::string, std::string> extra = {}) {
    auto env = env_;
    for (auto& [k, v] : extra) env[k] = v;
    auto server = std::make_unique<testing::Process>(
        std::vector<std::string>{testing::WaystoneBinary(), "serve", "--config",
                                 dir_.File("server.yaml"), "--listen",
                                 "127.0.0.1:" + std::to_string(port_)},
        env, dir_.path());
    EXPECT_TRUE(
        testing::WaitFor([&] { return Send("GET", "/readyz", "", "").outcome.status == 200; },
                         std::chrono::seconds(30)))
        << server->Errors();
    return server;
  }

  HttpResponse Send(const std::string& method, const std::string& path, const std::string& who,
                    const std::string& body) {
    HttpRequest request{method, Url() + path, {}, body, 10'000};
    if (!who.empty()) request.headers.emplace_back("Authorization", "Bearer " + tokens_[who]);
    if (!body.empty()) request.headers.emplace_back("Content-Type", "application/json");
    return http_->Send(request);
  }

  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  void StartOrder() {
    const Json input = {{"source", "crm"},
                        {"order_id", "o-1"},
                        {"customer_id", "C-1"},
                        {"amount", 4200},
                        {"lines", Json::array({{{"sku", "A-1"}, {"qty", 3}}})},
                        {"submitted_by", "bob"}};
    const HttpResponse started =
        Send("POST", "/v1/instances", "ops",
             Json{{"workflow", "order-approval"}, {"input", input}}.dump());
    ASSERT_TRUE(started.outcome.status == 201 || started.outcome.status == 200) << started.body;
  }

  Json View() {
    const HttpResponse view = Send("GET", std::string("/v1/instances/") + kKey, "ops", "");
    if (view.outcome.status != 200) return Json::object();
    return Json::parse(view.body, nullptr, false);
  }

  // The open approval request of `approve`, once it waits.
  Json OpenRequest() {
    Json approval;
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          const Json view = View();
          if (!view.contains("approvals")) return false;
          approval = view["approvals"][0];
          return approval["state"] == "waiting";
        },
        std::chrono::seconds(20)))
        << View().dump();
    return approval;
  }

  std::string WaitForRest() {
    std::string state;
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          state = View().value("state", "");
          return state == "completed" || state == "closed" || state == "needs_attention";
        },
        std::chrono::seconds(30)));
    return state;
  }

  static std::string Body(const Json& approval, const std::string& decision,
                          const std::string& comment) {
    return Json{{"step", "approve"},
                {"request", approval["request"]},
                {"data_version", approval["data_version"]},
                {"decision", decision},
                {"comment", comment}}
        .dump();
  }

  // Runs the independent approvers: each (who, body) at once. One result each.
  Json Approvers(const std::vector<std::pair<std::string, std::string>>& decisions) {
    std::vector<std::string> argv = {"/usr/bin/env", "python3",
                                     testing::SourceDir() + "/tests/integration/approvers.py",
                                     Url(), std::string("/v1/instances/") + kKey + "/decide"};
    for (const auto& [who, body] : decisions) argv.push_back(tokens_[who] + "=" + body);
    const auto ran = testing::RunProcess(argv, {}, dir_.path());
    EXPECT_EQ(ran.exit_code, 0) << ran.err;
    return Json::parse(ran.out, nullptr, false);
  }

  int Orders() { return Json::parse(erp_->StatsJson())["orders"].get<int>(); }

  int Audited(const std::string& action) {
    const Json view = View();
    return static_cast<int>(std::count_if(view["audit"].begin(), view["audit"].end(),
                                          [&](const Json& a) { return a["action"] == action; }));
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TargetProcess> erp_;
  std::map<std::string, std::string> env_;
  std::map<std::string, std::string> tokens_;
  int port_ = 0;
  std::unique_ptr<HttpClient> http_;
};

TEST_F(ApprovalProcessTest, TheRequesterAndANonMemberAreRefusedAndTwoApproversAtOnceMakeOneOrder) {
  auto server = Serve();
  StartOrder();
  const Json approval = OpenRequest();
  EXPECT_EQ(approval["request"], 1);
  EXPECT_EQ(approval["snapshot"]["fields"]["/amount"], 4200);
  EXPECT_EQ(approval["snapshot"]["summary"], "Order o-1 for C-1: 4200 EUR");
  EXPECT_EQ(approval["snapshot"]["requester"], "bob");
  EXPECT_EQ(approval["approvers"]["group"], "finance");

  // The requester (in the group, too), a token outside the group, and a decision on
  // other data.
  Json stale = Json::parse(Body(approval, "approve", "ok"));
  stale["data_version"] = std::string(64, '0');
  const Json refused = Approvers(
      {{"bob", Body(approval, "approve", "mine")}, {"erin", Body(approval, "approve", "sure")}});
  ASSERT_TRUE(refused.is_array()) << refused;
  for (const Json& r : refused) {
    EXPECT_EQ(r["status"], 403) << r;
    EXPECT_EQ(r["content_type"], "application/problem+json") << r;
  }
  EXPECT_NE(refused[0]["body"]["detail"].get<std::string>().find("requested the approval"),
            std::string::npos)
      << refused[0];
  EXPECT_NE(refused[1]["body"]["detail"].get<std::string>().find("group 'finance'"),
            std::string::npos)
      << refused[1];
  const Json other = Approvers({{"alice", stale.dump()}});
  EXPECT_EQ(other[0]["status"], 409) << other;
  EXPECT_EQ(OpenRequest()["state"], "waiting");  // nothing changed
  EXPECT_EQ(Orders(), 0);

  // Two approvers at the same moment, one approving, one rejecting.
  const Json both = Approvers({{"alice", Body(approval, "approve", "within budget")},
                               {"dave", Body(approval, "reject", "too much")}});
  ASSERT_TRUE(both.is_array()) << both;
  std::vector<int> statuses = {both[0]["status"].get<int>(), both[1]["status"].get<int>()};
  std::sort(statuses.begin(), statuses.end());
  EXPECT_EQ(statuses, (std::vector<int>{200, 409})) << both;
  const bool approved = both[0]["status"] == 200;
  const Json& lost = both[approved ? 1 : 0];
  EXPECT_NE(lost["body"]["detail"].get<std::string>().find("decided already"), std::string::npos)
      << lost;

  EXPECT_EQ(WaitForRest(), approved ? "completed" : "closed");
  EXPECT_EQ(Orders(), approved ? 1 : 0) << erp_->StatsJson();
  EXPECT_EQ(Audited("decide"), 1);
  EXPECT_EQ(Audited("decision_refused"), 4);  // bob, erin, the stale one, the loser
  const Json view = View();
  EXPECT_EQ(view["approvals"][0]["decision"]["by"], approved ? "alice" : "dave");
  bool contradiction = false;
  for (const Json& alert : view["alerts"]) {
    contradiction = contradiction || alert["kind"] == "contradicting_decision";
  }
  EXPECT_TRUE(contradiction) << view["alerts"].dump();
}

TEST_F(ApprovalProcessTest, ARevisionDuringApprovalSupersedesTheRequestAndTheOrderHasTheNewData) {
  auto server = Serve();
  StartOrder();
  const Json first = OpenRequest();
  ASSERT_EQ(first["request"], 1);

  Json input = View()["input"];
  input["amount"] = 3900;
  input["lines"][0]["qty"] = 2;
  const HttpResponse revised =
      Send("POST", std::string("/v1/instances/") + kKey + "/revise", "ops",
           Json{{"input", input}, {"reason", "the customer ordered one less"}}.dump());
  ASSERT_EQ(revised.outcome.status, 200) << revised.body;
  EXPECT_EQ(Json::parse(revised.body)["cancelled"], Json::array({"approve"})) << revised.body;

  Json second;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        second = OpenRequest();
        return second["request"] == 2;
      },
      std::chrono::seconds(20)))
      << View().dump();
  EXPECT_NE(second["data_version"], first["data_version"]);
  EXPECT_EQ(second["snapshot"]["fields"]["/amount"], 3900);

  // The approver who still looks at request 1: refused, told which request stands.
  const Json late = Approvers({{"alice", Body(first, "approve", "ok")}});
  ASSERT_EQ(late[0]["status"], 409) << late;
  EXPECT_NE(late[0]["body"]["detail"].get<std::string>().find(
                "the current request is 2, on data version " +
                second["data_version"].get<std::string>().substr(0, 16)),
            std::string::npos)
      << late;

  // A change beside the material fields: request 2 stands.
  input["delivery_note"] = "ring twice";
  const HttpResponse noted = Send("POST", std::string("/v1/instances/") + kKey + "/revise", "ops",
                                  Json{{"input", input}, {"reason", "delivery note"}}.dump());
  ASSERT_EQ(noted.outcome.status, 200) << noted.body;
  EXPECT_EQ(Json::parse(noted.body)["material"], Json::array()) << noted.body;
  EXPECT_EQ(OpenRequest()["request"], 2);

  const Json approved = Approvers({{"dave", Body(second, "approve", "fine")}});
  ASSERT_EQ(approved[0]["status"], 200) << approved;
  EXPECT_EQ(WaitForRest(), "completed");
  const Json stats = Json::parse(erp_->StatsJson());
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  const Json order = Json::parse(erp_->Call("GET", "/erp/orders/ORD-1", ""));
  EXPECT_EQ(order["request"]["amount"].dump().find("3900") != std::string::npos, true)
      << order.dump();
  EXPECT_EQ(order["request"]["approved_by"], "dave") << order.dump();
  EXPECT_EQ(Audited("approval_cancelled"), 1);
  EXPECT_EQ(Audited("revise"), 2);
  EXPECT_EQ(Audited("decision_refused"), 1);
  const Json view = View();
  for (const Json& a : view["audit"]) {
    if (a["action"] != "approval_cancelled") continue;
    EXPECT_EQ(a["actor"], "ops");
    EXPECT_EQ(a["reason"], "the customer ordered one less");
    EXPECT_EQ(a["detail"]["superseded_by"], 2) << a.dump();
  }
}

TEST_F(ApprovalProcessTest, AnApproverReadsAndDecidesFromTheCommandLine) {
  auto server = Serve();
  StartOrder();
  const Json approval = OpenRequest();
  auto cli = [&](const std::string& who, std::vector<std::string> args) {
    std::vector<std::string> argv = {testing::WaystoneBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--server", Url()});
    auto env = env_;
    env["WAYSTONE_TOKEN"] = tokens_[who];
    return testing::RunProcess(argv, env, dir_.path());
  };
  const std::string shown = approval["data_version"].get<std::string>().substr(0, 16);
  const auto show = cli("alice", {"show", kKey});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_NE(show.out.find("approval approve: waiting, request 1 on data version " + shown),
            std::string::npos)
      << show.out;
  EXPECT_NE(show.out.find("Order o-1 for C-1: 4200 EUR"), std::string::npos) << show.out;
  // A version that is not the one shown: refused by the server, nothing decided.
  const auto wrong = cli("alice", {"decide", kKey, "--step", "approve", "--approve",
                                   "--data-version", "0123456789abcdef"});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("the data changed"), std::string::npos) << wrong.err;
  const auto decided = cli("alice", {"decide", kKey, "--step", "approve", "--approve",
                                     "--data-version", shown, "--comment", "checked the lines"});
  ASSERT_EQ(decided.exit_code, 0) << decided.err;
  EXPECT_NE(decided.out.find("DECIDED approve crm:o-1"), std::string::npos) << decided.out;
  EXPECT_EQ(WaitForRest(), "completed");
  EXPECT_EQ(Orders(), 1);
  EXPECT_EQ(View()["approvals"][0]["decision"]["comment"], "checked the lines");
}

class ApprovalCrashTest : public ApprovalProcessTest,
                          public ::testing::WithParamInterface<const char*> {};

TEST_P(ApprovalCrashTest, KilledAroundTheDecisionsCommitOneDecisionOneOrder) {
  auto server = Serve({{"WAYSTONE_CRASH_AT", std::string(GetParam()) + ":approve"}});
  StartOrder();
  const Json approval = OpenRequest();
  const std::string body = Body(approval, "approve", "fine");
  const Json lost = Approvers({{"alice", body}});
  EXPECT_EQ(lost[0]["status"], 0) << lost;  // no answer: the server died
  const testing::ProcessResult died = server->Wait(std::chrono::seconds(20));
  ASSERT_EQ(died.signal, SIGKILL) << died.err;

  server = Serve();
  // The approver, having had no answer, sends the same decision again.
  const Json again = Approvers({{"alice", body}});
  ASSERT_EQ(again[0]["status"], 200) << again;
  const bool committed_before = std::string(GetParam()) == "after-decide";
  EXPECT_EQ(again[0]["body"]["replayed"], committed_before) << again;
  EXPECT_EQ(WaitForRest(), "completed");
  EXPECT_EQ(Orders(), 1) << erp_->StatsJson();
  EXPECT_EQ(Audited("decide"), 1);
  EXPECT_EQ(View()["approvals"][0]["decision"]["by"], "alice");
}

INSTANTIATE_TEST_SUITE_P(AroundTheCommit, ApprovalCrashTest,
                         ::testing::Values("before-decide", "after-decide"), [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace waystone
