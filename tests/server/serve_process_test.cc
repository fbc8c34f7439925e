// `waystone serve` as a real process: a duplicate request under the same
// Idempotency-Key while the first is in flight, the server SIGKILLed while
// requests and workers are in flight (no accepted request lost, no event applied
// twice), and an operator working from the command line over the API.

#include <sqlite3.h>

#include <csignal>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "sim/simulator.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

class ServeProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = Simulator::Start({});
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = std::move(*sim);
    env_ = testing::SimulatorEnv(sim_->base_url(), {{"WAYSTONE_DB", dir_.File("w.db")}});
    operator_ = Token("operator");
    viewer_ = Token("viewer");
    port_ = testing::FreeLoopbackPort();
    http_ = NewCurlHttpClient({});
  }

  std::string Token(const std::string& role) {
    auto created = testing::RunProcess({testing::WaystoneBinary(), "token", "create", "--tenant",
                                        "default", "--role", role, "--name", role + "-1"},
                                       env_, dir_.path());
    EXPECT_EQ(created.exit_code, 0) << created.err;
    return created.out.substr(0, created.out.find('\n'));
  }

  std::unique_ptr<testing::Process> Serve(std::vector<std::string> extra = {},
                                          std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {testing::WaystoneBinary(),
                                     "serve",
                                     "--config",
                                     testing::SourceDir() + "/examples/server/waystone.yaml",
                                     "--listen",
                                     "127.0.0.1:" + std::to_string(port_),
                                     "--workers",
                                     "4"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto merged = env_;
    for (auto& [k, v] : env) merged[k] = v;
    auto server = std::make_unique<testing::Process>(argv, merged, dir_.path());
    EXPECT_TRUE(
        testing::WaitFor([&] { return Send("GET", "/readyz", "", "").outcome.status == 200; },
                         std::chrono::seconds(30)))
        << server->Errors();
    return server;
  }

  HttpResponse Send(const std::string& method, const std::string& path, const std::string& token,
                    const std::string& body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
    HttpRequest request{method, Url() + path, std::move(headers), body, 10'000};
    if (!token.empty()) request.headers.emplace_back("Authorization", "Bearer " + token);
    return http_->Send(request);
  }

  // Whether an Idempotency-Key is claimed and its request not finished (read behind
  // the server's back from its SQLite file).
  bool KeyInFlight(const std::string& key) {
    sqlite3* db = nullptr;
    bool in_flight = false;
    const std::string path = dir_.File("w.db");
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      sqlite3_stmt* stmt = nullptr;
      if (sqlite3_prepare_v2(db, "SELECT count(*) FROM api_requests WHERE key = ? AND done = 0", -1,
                             &stmt, nullptr) == SQLITE_OK) {
        sqlite3_bind_text(stmt, 1, key.c_str(), -1, SQLITE_TRANSIENT);
        in_flight = sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_int(stmt, 0) > 0;
      }
      sqlite3_finalize(stmt);
    }
    sqlite3_close(db);
    return in_flight;
  }

  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  testing::ProcessResult Cli(const std::vector<std::string>& args, const std::string& token) {
    std::vector<std::string> argv = {testing::WaystoneBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--server", Url()});
    auto env = env_;
    env["WAYSTONE_TOKEN"] = token;
    return testing::RunProcess(argv, env, dir_.path());
  }

  std::string State(const std::string& key) {
    auto view = Send("GET", "/v1/instances/" + key, viewer_, "");
    if (view.outcome.status != 200) return "";
    return Json::parse(view.body)["state"];
  }

  static std::string Order(const std::string& source, int i, const std::string& customer) {
    return Json{{"source", source},
                {"order_id", std::to_string(i)},
                {"customer_id", customer},
                {"amount", 10}}
        .dump();
  }

  testing::TempDir dir_;
  std::unique_ptr<Simulator> sim_;
  std::map<std::string, std::string> env_;
  std::string operator_, viewer_;
  int port_ = 0;
  std::unique_ptr<HttpClient> http_;
};

TEST_F(ServeProcessTest, ADuplicateWhileTheFirstIsInFlightGets409) {
  // The first request pauses inside the server after claiming its key.
  auto server = Serve({"--api-only"}, {{"WAYSTONE_PAUSE_AT", "api-start:order-to-erp=2000"}});
  const std::string body =
      Json{{"workflow", "order-to-erp"}, {"input", Json::parse(Order("api", 1, "C-1"))}}.dump();
  const std::vector<std::pair<std::string, std::string>> headers = {
      {"Idempotency-Key", "dup-1"}, {"Content-Type", "application/json"}};
  HttpResponse first;
  std::thread slow([&] { first = Send("POST", "/v1/instances", operator_, body, headers); });
  // The second is sent once the first has claimed the key (and is paused for 2 s).
  ASSERT_TRUE(testing::WaitFor([&] { return KeyInFlight("dup-1"); }, std::chrono::seconds(10)));
  auto second = Send("POST", "/v1/instances", operator_, body, headers);
  slow.join();
  EXPECT_EQ(second.outcome.status, 409) << second.body;
  EXPECT_EQ(Json::parse(second.body)["type"], "urn:waystone:problem:idempotency-key-in-flight");
  EXPECT_EQ(first.outcome.status, 201) << first.body;
  auto third = Send("POST", "/v1/instances", operator_, body, headers);
  EXPECT_EQ(third.outcome.status, 201);
  EXPECT_EQ(third.body, first.body);
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(std::chrono::seconds(30)).exit_code, 0);
}

TEST_F(ServeProcessTest, PreferWaitAnswersWithTheOutcomeOrWith202AndHowFarItGot) {
  auto server = Serve();
  const std::vector<std::pair<std::string, std::string>> prefer = {
      {"Prefer", "respond-async, WAIT = \"20\""}, {"Content-Type", "application/json"}};
  const std::string order =
      Json{{"workflow", "order-to-erp"}, {"input", Json::parse(Order("api", 7, "C-1"))}}.dump();
  auto done = Send("POST", "/v1/instances", operator_, order, prefer);
  ASSERT_EQ(done.outcome.status, 201) << done.body;
  Json view = Json::parse(done.body);
  EXPECT_EQ(view["state"], "completed");
  EXPECT_EQ(view["created"], true);
  // The caller has the ERP's order number now, and it is the simulator's.
  std::string order_number;
  for (const Json& step : view["steps"]) {
    if (step["name"] == "create-order") order_number = step.value("external_id", "");
  }
  EXPECT_FALSE(order_number.empty()) << done.body;
  EXPECT_EQ(Json::parse(sim_->StatsJson())["orders"], 1);
  // The same start again is answered as existing, with the same outcome.
  auto again = Send("POST", "/v1/instances", operator_, order, prefer);
  EXPECT_EQ(again.outcome.status, 200) << again.body;
  EXPECT_EQ(Json::parse(again.body)["state"], "completed");

  // One that waits for an approval does not rest within a second: 202, still running.
  const std::string approval =
      Json{{"workflow", "approved-order"}, {"input", Json::parse(Order("api", 8, "C-1"))}}.dump();
  const std::vector<std::pair<std::string, std::string>> wait_briefly = {
      {"Prefer", "wait=1"}, {"Idempotency-Key", "appr-8"}, {"Content-Type", "application/json"}};
  auto pending = Send("POST", "/v1/instances", operator_, approval, wait_briefly);
  ASSERT_EQ(pending.outcome.status, 202) << pending.body;
  EXPECT_EQ(Json::parse(pending.body)["state"], "running");
  EXPECT_EQ(Json::parse(pending.body)["created"], true);
  // A 202 is not the answer to keep under the key: asking again asks the instance again.
  auto asked_again = Send("POST", "/v1/instances", operator_, approval, wait_briefly);
  ASSERT_EQ(asked_again.outcome.status, 202) << asked_again.body;
  EXPECT_EQ(Json::parse(asked_again.body)["created"], false) << "a stored 202 was replayed";
  // `wait` as a parameter of another preference is not a preference: answered at once.
  auto not_waited =
      Send("POST", "/v1/instances", operator_, approval,
           {{"Prefer", "return=minimal; wait=5"}, {"Content-Type", "application/json"}});
  EXPECT_EQ(not_waited.outcome.status, 200) << not_waited.body;
  EXPECT_FALSE(Json::parse(not_waited.body).contains("steps"));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(std::chrono::seconds(30)).exit_code, 0);
}

TEST_F(ServeProcessTest, AKeyInFlightOnAServerThatDiedIsTakenOverAtOnce) {
  // The server dies after starting the instance, before it stored the response.
  auto server = Serve({"--api-only"}, {{"WAYSTONE_CRASH_AT", "api-started:order-to-erp"}});
  const std::string body =
      Json{{"workflow", "order-to-erp"}, {"input", Json::parse(Order("api", 9, "C-9"))}}.dump();
  const std::vector<std::pair<std::string, std::string>> headers = {
      {"Idempotency-Key", "crash-9"}, {"Content-Type", "application/json"}};
  auto lost = Send("POST", "/v1/instances", operator_, body, headers);
  EXPECT_NE(lost.outcome.kind, CallOutcome::Kind::kResponse);
  EXPECT_EQ(server->Wait().signal, SIGKILL);

  server = Serve({"--api-only"});
  auto retried = Send("POST", "/v1/instances", operator_, body, headers);
  EXPECT_EQ(retried.outcome.status, 200) << retried.body;  // the instance it had started
  EXPECT_EQ(Json::parse(retried.body)["created"], false);
  auto replayed = Send("POST", "/v1/instances", operator_, body, headers);
  EXPECT_EQ(replayed.body, retried.body);
  auto all = Json::parse(Send("GET", "/v1/instances", viewer_, "").body);
  EXPECT_EQ(all["items"].size(), 1u);
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(std::chrono::seconds(30)).exit_code, 0);
}

TEST_F(ServeProcessTest, AKilledServerLosesNoAcceptedRequestAndAppliesNoEventTwice) {
  constexpr int kRequests = 60;
  auto request = [&](int i) {
    if (i % 2 == 0) {
      const std::string body =
          Json{{"workflow", "order-to-erp"},
               {"input", Json::parse(Order("api", i, "C-" + std::to_string(i)))}}
              .dump();
      return Send(
          "POST", "/v1/instances", operator_, body,
          {{"Idempotency-Key", "req-" + std::to_string(i)}, {"Content-Type", "application/json"}});
    }
    const Json event = {{"specversion", "1.0"},
                        {"id", "ev-" + std::to_string(i)},
                        {"source", "/shop"},
                        {"type", "com.acme.order.received"},
                        {"data", Json::parse(Order("ev", i, "C-" + std::to_string(i)))}};
    return Send("POST", "/v1/events", operator_, event.dump(),
                {{"Content-Type", "application/cloudevents+json"}});
  };
  auto key = [](int i) { return (i % 2 == 0 ? "api:" : "ev:") + std::to_string(i); };

  auto server = Serve();
  std::mutex mu;
  std::vector<bool> accepted(kRequests, false);
  int answered = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = c; i < kRequests; i += 4) {
        HttpResponse response = request(i);
        std::lock_guard<std::mutex> lock(mu);
        if (response.outcome.kind == CallOutcome::Kind::kResponse &&
            response.outcome.status / 100 == 2) {
          accepted[i] = true;
          ++answered;
        }
      }
    });
  }
  // Kill the server mid-stream: requests are arriving and workers are calling out.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return answered >= 20;
      },
      std::chrono::seconds(60)));
  server->Signal(SIGKILL);
  server->Wait();
  for (auto& t : clients) t.join();
  const int accepted_before_kill =
      static_cast<int>(std::count(accepted.begin(), accepted.end(), true));
  ASSERT_GE(accepted_before_kill, 20);
  ASSERT_LT(accepted_before_kill, kRequests) << "the kill came too late to test anything";

  server = Serve();
  // No accepted request was lost: each has its instance after the restart.
  for (int i = 0; i < kRequests; ++i) {
    if (accepted[i]) {
      EXPECT_NE(State(key(i)), "") << key(i) << " was accepted but is gone";
    }
  }
  // Clients retry every request; accepted ones are replays or duplicates.
  for (int i = 0; i < kRequests; ++i) {
    HttpResponse response = request(i);
    ASSERT_EQ(response.outcome.status / 100, 2) << key(i) << ": " << response.body;
    if (accepted[i] && i % 2 == 1) {
      EXPECT_EQ(Json::parse(response.body)["results"][0]["outcome"], "duplicate") << key(i);
    }
  }
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto listed = Send("GET", "/v1/instances?state=completed&limit=1000", viewer_, "");
        return listed.outcome.status == 200 &&
               Json::parse(listed.body)["items"].size() == static_cast<size_t>(kRequests);
      },
      std::chrono::seconds(90)))
      << server->Errors();
  Json stats = Json::parse(sim_->StatsJson());
  EXPECT_EQ(stats["orders"], kRequests);
  EXPECT_EQ(stats["duplicate_orders"], 0);
  EXPECT_EQ(stats["duplicate_shipments"], 0);
  EXPECT_EQ(stats["duplicate_line_messages"], 0);
  EXPECT_EQ(stats["duplicate_emails"], 0);
  auto all = Json::parse(Send("GET", "/v1/instances?limit=1000", viewer_, "").body);
  EXPECT_EQ(all["items"].size(), static_cast<size_t>(kRequests));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(std::chrono::seconds(30)).exit_code, 0);
}

TEST_F(ServeProcessTest, AServerKilledMidBatchFinishesItAfterTheRestartApplyingEachItemOnce) {
  constexpr int kOrders = 8;
  // The fourth order's retry commits, then the server dies before it records the item.
  auto server = Serve({}, {{"WAYSTONE_CRASH_AT", "batch-applied:bt:4"}});
  ASSERT_TRUE(sim_->SetFaults(R"({"erp.create_order": {"fail": 1}})").ok());
  for (int i = 1; i <= kOrders; ++i) {
    const Json body = {{"workflow", "order-to-erp"},
                       {"input", Json::parse(Order("bt", i, "C-" + std::to_string(i)))}};
    ASSERT_EQ(Send("POST", "/v1/instances", operator_, body.dump(),
                   {{"Content-Type", "application/json"}})
                  .outcome.status,
              201);
  }
  for (int i = 1; i <= kOrders; ++i) {
    // Retries exhausted: stopped at create-order (failed, nothing to compensate).
    ASSERT_TRUE(testing::WaitFor([&] { return State("bt:" + std::to_string(i)) == "failed"; },
                                 std::chrono::seconds(90)))
        << "bt:" << i << " is " << State("bt:" + std::to_string(i));
  }
  ASSERT_TRUE(sim_->SetFaults("").ok());  // the ERP came back
  const Json batch = {{"action", "retry"},
                      {"step", "create-order"},
                      {"reason", "ERP back, INC-9"},
                      {"filter", {{"workflow", "order-to-erp"}, {"stopped_at", "create-order"}}}};
  auto created =
      Send("POST", "/v1/batches", operator_, batch.dump(), {{"Content-Type", "application/json"}});
  ASSERT_EQ(created.outcome.status, 201) << created.body;
  const std::string id = Json::parse(created.body)["id"];
  EXPECT_EQ(Json::parse(created.body)["total"], kOrders);
  ASSERT_EQ(server->Wait(std::chrono::seconds(60)).signal, SIGKILL)
      << "the crash point did not fire";

  server = Serve();
  Json done;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto shown = Send("GET", "/v1/batches/" + id, viewer_, "");
        if (shown.outcome.status != 200) return false;
        done = Json::parse(shown.body);
        return done["state"] == "finished";
      },
      std::chrono::seconds(120)))
      << done.dump() << server->Errors();
  // The kill may also cut off a worker's call for an item applied before (the retry
  // of bt:1 to bt:3 is running meanwhile): that step is then found running, the ERP's
  // lookup says nothing was made, and the retry's one attempt is spent — the item is
  // stopped again (needs_attention), with no order. Every other item succeeded.
  std::map<std::string, bool> completed;
  for (const Json& item : done["items"]) {
    const std::string key = item["key"];
    completed[key] = item["result_state"] == "completed";
    if (!completed[key]) {
      EXPECT_EQ(item["state"], "stopped") << item.dump();
      EXPECT_EQ(item["result_state"], "needs_attention") << item.dump();
      EXPECT_NE(item.value("message", "").find("unknown"), std::string::npos) << item.dump();
    }
    // One retry per instance, naming the batch, whoever applied it.
    Json view = Json::parse(Send("GET", "/v1/instances/" + key, viewer_, "").body);
    int retries = 0;
    for (const Json& audit : view["audit"]) {
      if (audit["action"] == "retry") {
        ++retries;
        EXPECT_EQ(audit["detail"]["batch"], id);
        EXPECT_EQ(audit["reason"], "ERP back, INC-9");
      }
    }
    EXPECT_EQ(retries, 1) << key;
  }
  ASSERT_EQ(completed.size(), static_cast<size_t>(kOrders)) << done.dump();
  const int succeeded = done["counts"]["succeeded"];
  EXPECT_GE(succeeded, kOrders - 3) << done.dump();  // only calls under way at the kill
  EXPECT_EQ(done["counts"]["succeeded"].get<int>() + done["counts"]["stopped"].get<int>(), kOrders)
      << done.dump();
  // What the ERP received: one order per completed instance, none twice.
  Json stats = Json::parse(sim_->StatsJson());
  EXPECT_EQ(stats["orders"], succeeded);
  EXPECT_EQ(stats["duplicate_orders"], 0);
  for (int i = 1; i <= kOrders; ++i) {
    const std::string key = "bt:" + std::to_string(i);
    HttpRequest find{"GET", sim_->base_url() + "/erp/orders?ref=default:" + key, {}, "", 5000};
    auto found = http_->Send(find);
    ASSERT_EQ(found.outcome.status, 200) << found.body;
    EXPECT_EQ(Json::parse(found.body)["items"].size(), completed[key] ? 1u : 0u) << key;
  }
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(std::chrono::seconds(30)).exit_code, 0);
}

TEST_F(ServeProcessTest, AnOperatorWorksFromTheCommandLine) {
  auto server = Serve();
  // An order that waits for its approval, which arrives as an event.
  const Json requested = {{"specversion", "1.0"},
                          {"id", "req-a1"},
                          {"source", "/shop"},
                          {"type", "com.acme.order.approval-requested"},
                          {"data", Json::parse(Order("crm", 1, "C-1"))}};
  ASSERT_EQ(Send("POST", "/v1/events", operator_, requested.dump(),
                 {{"Content-Type", "application/cloudevents+json"}})
                .outcome.status,
            200);
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto shown = Cli({"show", "crm:1"}, viewer_);
        return shown.out.find("waiting") != std::string::npos;
      },
      std::chrono::seconds(30)));
  auto approved = Send("POST", "/v1/events", operator_,
                       Json{{"order_ref", "crm:1"}, {"approver", "mika"}}.dump(),
                       {{"ce-specversion", "1.0"},
                        {"ce-id", "appr-1"},
                        {"ce-source", "/approvals"},
                        {"ce-type", "com.acme.order.approved"},
                        {"Content-Type", "application/json"}});
  ASSERT_EQ(approved.outcome.status, 200) << approved.body;
  ASSERT_TRUE(
      testing::WaitFor([&] { return State("crm:1") == "completed"; }, std::chrono::seconds(30)));

  // An order whose shipment is refused and whose cancellation fails: an operator decides.
  const std::string start = Json{{"workflow", "order-to-erp"},
                                 {"input", Json::parse(Order("crm", 2, "C-BLOCKED-STUCK-2"))}}
                                .dump();
  ASSERT_EQ(Send("POST", "/v1/instances", operator_, start, {{"Content-Type", "application/json"}})
                .outcome.status,
            201);
  ASSERT_TRUE(testing::WaitFor([&] { return State("crm:2") == "needs_attention"; },
                               std::chrono::seconds(60)));
  auto listed = Cli({"instances", "--state", "needs_attention"}, viewer_);
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("crm:2"), std::string::npos) << listed.out;
  EXPECT_EQ(listed.out.find("crm:1"), std::string::npos) << listed.out;
  auto shown = Cli({"show", "crm:2"}, viewer_);
  EXPECT_NE(shown.out.find("compensation_failed"), std::string::npos) << shown.out;

  auto dry = Cli({"retry", "crm:2", "--step", "create-order", "--reason", "ERP back", "--dry-run"},
                 operator_);
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_NE(dry.out.find("DRY RUN retry crm:2: needs_attention -> compensating"), std::string::npos)
      << dry.out;
  EXPECT_NE(dry.out.find("crm:2:create-order:compensate"), std::string::npos) << dry.out;

  auto refused = Cli({"close", "crm:2", "--reason", "x"}, viewer_);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("HTTP 403"), std::string::npos) << refused.err;
  auto no_reason = Cli({"close", "crm:2"}, operator_);
  EXPECT_EQ(no_reason.exit_code, 2);

  auto closed = Cli({"close", "crm:2", "--reason", "cancelled by phone, ticket 7"}, operator_);
  EXPECT_EQ(closed.exit_code, 0) << closed.err;
  EXPECT_NE(closed.out.find("APPLIED close crm:2"), std::string::npos) << closed.out;
  shown = Cli({"show", "crm:2"}, viewer_);
  EXPECT_NE(shown.out.find("closed"), std::string::npos);
  EXPECT_NE(shown.out.find("cancelled by phone, ticket 7"), std::string::npos) << shown.out;
  auto open = Cli({"alerts", "--state", "open", "--json"}, viewer_);
  EXPECT_EQ(open.exit_code, 0);
  EXPECT_TRUE(Json::parse(open.out)["items"].empty()) << open.out;

  auto env = env_;
  env.erase("WAYSTONE_TOKEN");
  auto no_token = testing::RunProcess({testing::WaystoneBinary(), "instances", "--server", Url()},
                                      env, dir_.path());
  EXPECT_EQ(no_token.exit_code, 1);
  EXPECT_NE(no_token.err.find("WAYSTONE_TOKEN"), std::string::npos);
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(std::chrono::seconds(30)).exit_code, 0);
}

}  // namespace
}  // namespace waystone
