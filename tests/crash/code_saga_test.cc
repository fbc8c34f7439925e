// A workflow written as a C++ function, in real processes: the order saga of
// examples/embedded/order_saga.cc (through libwaystone.so alone) reads the CRM,
// creates an order at tests/targets/erp_target.py (written apart from our code, it
// counts what it received), records it in the program's own `orders` table with
// ctx.Transaction, and sends a message. The program is SIGKILLed at every boundary
// and run again; then its function is changed under a recorded instance. Rows and
// checkpoints are read by clients that share no code with ours: Python's sqlite3
// module and psql.

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "connectors/http/http_client.h"
#include "support/backends.h"
#include "support/database_client.h"
#include "support/erp_target.h"
#include "support/postgres_cluster.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace waystone {
namespace {

using Json = nlohmann::json;
using testing::Backend;

class CodeSagaTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    target_ = std::make_unique<testing::ErpTarget>(dir_.path());
    ASSERT_TRUE(target_->ok());
    if (GetParam() == Backend::kSqlite) {
      db_ = dir_.File("waystone.db");
    } else {
      db_ = testing::FreshPostgresDatabase();
      ASSERT_FALSE(db_.empty());
    }
    Query(testing::OrdersTableSql(GetParam()));
  }

  // Runs `sql` with the database's own client (no code of ours); its rows as "a|b" lines.
  std::string Query(const std::string& sql) {
    return testing::ClientQuery(GetParam(), db_, sql, dir_.path());
  }

  // The state of step `step` of order `id`'s instance, as its checkpoint says.
  std::string StepState(const std::string& id, const std::string& step) {
    return Query(
        "SELECT s.state FROM steps s JOIN instances i ON i.id = s.instance_id WHERE "
        "i.business_key = '" +
        id + "' AND s.name = '" + step + "'");
  }

  testing::ProcessResult Saga(const std::string& id, int amount, const std::string& to,
                              std::map<std::string, std::string> env = {}) {
    std::vector<std::string> args = {testing::OrderSagaBinary(), db_, target_->base_url(), id,
                                     std::to_string(amount)};
    if (!to.empty()) args.push_back(to);
    return testing::RunProcess(args, env, dir_.path());
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  // A token of `role` made with the CLI on the same database.
  std::string Token(const std::string& name, const std::string& role) {
    auto created = testing::RunProcess({testing::WaystoneBinary(), "token", "create", "--tenant",
                                        "default", "--role", role, "--name", name},
                                       {{"WAYSTONE_DB", db_}}, dir_.path());
    EXPECT_EQ(created.exit_code, 0) << created.err;
    return created.out.substr(0, created.out.find('\n'));
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::ErpTarget> target_;
  std::string db_;
};

bool Says(const testing::ProcessResult& run, const std::string& line) {
  return run.out.find(line) != std::string::npos;
}

TEST_P(CodeSagaTest, TheFunctionRunsEachStepOnceAndReturnsItsOutput) {
  // The ERP commits the order and its answer is lost after the headers: the
  // lookup finds the order; it is not made twice.
  ASSERT_TRUE(target_->Faults(R"({"create_order": {"next": ["partial_body"]}})"));
  auto run = Saga("o-1", 50, "U-1");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  ASSERT_TRUE(Says(run, "state completed")) << run.out;
  EXPECT_TRUE(Says(run, "erp ORD-1 row 1")) << run.out;
  EXPECT_EQ(Query("SELECT id, order_key, erp_id, amount, state FROM orders"),
            "1|o-1|ORD-1|50|open");
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  ASSERT_EQ(stats["messages_by_content"].size(), 1u) << stats.dump();
  EXPECT_EQ(stats["messages_by_content"][0]["text"], "order ORD-1 is local row 1");
  // The transaction's own outbox event committed with it.
  EXPECT_EQ(Query("SELECT COUNT(*) FROM outbox WHERE type = 'shop.order.recorded'"), "1");
  // Every step is a row an operator sees, in order.
  EXPECT_EQ(Query("SELECT s.name FROM steps s JOIN instances i ON i.id = s.instance_id WHERE "
                  "i.business_key = 'o-1' ORDER BY s.step_index"),
            "read-customer\ncreate-order\nrecord-order\nnotify\n$return");
  EXPECT_EQ(StepState("o-1", "create-order"), "3");  // completed

  // Started again, the same business action is the first one: nothing runs.
  auto again = Saga("o-1", 50, "U-1");
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_TRUE(Says(again, "erp ORD-1 row 1")) << again.out;
  EXPECT_EQ(Stats()["orders"], 1);
}

struct Boundary {
  const char* point;
  const char* step;
};

// SIGKILL before and after every call and every transaction; run again: one ERP
// order, one local row naming it, one message. Right after each kill the row
// exists exactly when its step's checkpoint does: they are one transaction, and
// there is no point between them to kill at.
TEST_P(CodeSagaTest, KilledAtEveryBoundaryOneOrderOneRowOneMessage) {
  const Boundary boundaries[] = {
      {"before-call", "read-customer"},
      {"after-call", "read-customer"},
      {"before-call", "create-order"},
      {"after-call", "create-order"},
      {"after-checkpoint", "create-order"},
      {"before-step", "record-order"},
      {"after-checkpoint", "record-order"},
      {"before-call", "notify"},
      {"after-call", "notify"},
      {"after-checkpoint", "notify"},
  };
  int n = 0;
  for (const Boundary& b : boundaries) {
    const std::string id = "k-" + std::to_string(++n);
    SCOPED_TRACE(std::string(b.point) + ":" + b.step);
    auto killed =
        Saga(id, 10 + n, "U-1", {{"WAYSTONE_CRASH_AT", std::string(b.point) + ":" + b.step}});
    ASSERT_EQ(killed.signal, SIGKILL) << killed.out << killed.err;

    const std::string rows = Query("SELECT COUNT(*) FROM orders WHERE order_key = '" + id + "'");
    EXPECT_EQ(rows, StepState(id, "record-order") == "3" ? "1" : "0");

    auto resumed = Saga(id, 10 + n, "U-1");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
    EXPECT_TRUE(Says(resumed, "state completed")) << resumed.out;
    EXPECT_EQ(Query("SELECT COUNT(*) FROM orders WHERE order_key = '" + id + "'"), "1");
  }
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], n) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["messages"], n) << stats.dump();
  EXPECT_EQ(stats["duplicate_messages"], 0) << stats.dump();
  for (const Json& message : stats["messages_by_content"]) {
    const std::string text = message["text"];
    EXPECT_EQ(testing::RowsNamedByMessage(GetParam(), db_, text, dir_.path()), "1") << text;
  }
}

// The message is refused (no recipient): the function cancels its row in a
// transaction and fails; the ERP order is cancelled by its compensation, once,
// even when killed around it.
TEST_P(CodeSagaTest, AFailureCompensatesTheOrderOnceAndTheRowSaysSo) {
  const Boundary boundaries[] = {{"before-compensate", "create-order"},
                                 {"after-compensate", "create-order"},
                                 {"after-compensate-checkpoint", "create-order"}};
  int n = 0;
  for (const Boundary& b : boundaries) {
    const std::string id = "c-" + std::to_string(++n);
    SCOPED_TRACE(std::string(b.point) + ":" + b.step);
    auto killed = Saga(id, 5, "", {{"WAYSTONE_CRASH_AT", std::string(b.point) + ":" + b.step}});
    ASSERT_EQ(killed.signal, SIGKILL) << killed.out << killed.err;
    auto resumed = Saga(id, 5, "");
    EXPECT_TRUE(Says(resumed, "state compensated")) << resumed.out << resumed.err;
    EXPECT_TRUE(Says(resumed, "reason step 'notify' failed (rejected)")) << resumed.out;
    EXPECT_EQ(Query("SELECT state FROM orders WHERE order_key = '" + id + "'"), "cancelled");
    EXPECT_EQ(StepState(id, "create-order"), "7");  // compensated
  }
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], n) << stats.dump();
  EXPECT_EQ(stats["cancels"].size(), static_cast<size_t>(n)) << stats.dump();
  EXPECT_EQ(stats["messages"], 0) << stats.dump();
}

// The database refuses the row (CHECK amount > 0): nothing of the transaction is
// written, the step fails with the database's reason, the order is cancelled.
TEST_P(CodeSagaTest, ARefusedStatementWritesNothingAndTheOrderIsCancelled) {
  auto run = Saga("bad", -3, "U-1");
  EXPECT_TRUE(Says(run, "state compensated")) << run.out << run.err;
  EXPECT_EQ(Query("SELECT COUNT(*) FROM orders"), "0");
  EXPECT_EQ(StepState("bad", "record-order"), "4");  // failed
  EXPECT_EQ(Query("SELECT COUNT(*) FROM outbox WHERE type = 'shop.order.recorded'"), "0");
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["cancels"].size(), 1u) << stats.dump();
}

// The function changes under an instance recorded by the old one. A renamed step
// parks it (definition_diverged, both names said) and nothing more is sent; a
// patched change lets the old instance finish on the old path and new ones take
// the new path.
TEST_P(CodeSagaTest, AChangedFunctionDivergesUnlessPatched) {
  auto killed = Saga("d-1", 7, "U-1", {{"WAYSTONE_CRASH_AT", "before-call:notify"}});
  ASSERT_EQ(killed.signal, SIGKILL) << killed.out << killed.err;
  auto renamed = Saga("d-1", 7, "U-1", {{"SAGA_VERSION", "3"}});
  ASSERT_EQ(renamed.exit_code, 0) << renamed.out << renamed.err;
  EXPECT_TRUE(Says(renamed, "state needs_attention")) << renamed.out;
  EXPECT_TRUE(Says(renamed,
                   "reason definition_diverged: recorded 'notify' at step 4, this run "
                   "asks for 'notify-customer'"))
      << renamed.out;
  EXPECT_EQ(Stats()["messages"], 0);

  auto old = Saga("p-1", 8, "U-1", {{"WAYSTONE_CRASH_AT", "before-call:notify"}});
  ASSERT_EQ(old.signal, SIGKILL) << old.out << old.err;
  auto finished = Saga("p-1", 8, "U-1", {{"SAGA_VERSION", "2"}});
  EXPECT_TRUE(Says(finished, "state completed")) << finished.out << finished.err;
  auto fresh = Saga("p-2", 9, "U-1", {{"SAGA_VERSION", "2"}});
  EXPECT_TRUE(Says(fresh, "state completed")) << fresh.out << fresh.err;
  const Json stats = Stats();
  ASSERT_EQ(stats["messages_by_content"].size(), 2u) << stats.dump();
  std::vector<std::string> texts;
  for (const Json& message : stats["messages_by_content"]) texts.push_back(message["text"]);
  std::sort(texts.begin(), texts.end());
  // d-1 made ORD-1; p-1 ORD-2 (row 2); p-2 ORD-3 (row 3).
  EXPECT_EQ(texts[0], "order ORD-2 is local row 2");        // the old path, finished
  EXPECT_EQ(texts[1], "order ORD-3 is local row 3 for 9");  // the patched path
}

// An operator acts on a function's instances over the HTTP API of `waystone serve` (which
// does not have the function: the program's workers run what the actions release).
// An unknown outcome is confirmed, not retried; a parked instance is compensated; one is
// closed; a viewer may do none of it.
TEST_P(CodeSagaTest, AnOperatorConfirmsCompensatesAndClosesOverTheApi) {
  const std::pair<const char*, const char*> parked[] = {{"d-1", "before-call:notify"},
                                                        {"d-2", "after-checkpoint:notify"},
                                                        {"d-3", "before-call:notify"}};
  for (const auto& [id, at] : parked) {
    auto killed = Saga(id, 7, "U-1", {{"WAYSTONE_CRASH_AT", at}});
    ASSERT_EQ(killed.signal, SIGKILL) << killed.out << killed.err;
    auto renamed = Saga(id, 7, "U-1", {{"SAGA_VERSION", "3"}});
    ASSERT_TRUE(Says(renamed, "state needs_attention")) << renamed.out << renamed.err;
  }
  const int messages_before = Stats()["messages"];  // d-2's, sent before it was parked

  std::filesystem::create_directories(dir_.File("defs"));
  std::ofstream(dir_.File("server.yaml"))
      << "definitions: defs\nworkers: 1\n"
         "events:\n  - type: com.example.note\n    signal: { key: /order }\n";
  const std::string ops = Token("ops", "operator");
  const std::string viewer = Token("eve", "viewer");
  const int port = testing::FreeLoopbackPort();
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto http = NewCurlHttpClient({});
  auto send = [&](const std::string& method, const std::string& path, const std::string& token,
                  const std::string& body) {
    HttpRequest request{method, url + path, {{"Authorization", "Bearer " + token}}, body, 10'000};
    if (!body.empty()) request.headers.emplace_back("Content-Type", "application/json");
    return http->Send(request);
  };
  {
    testing::Process server(
        {testing::WaystoneBinary(), "serve", "--config", dir_.File("server.yaml"), "--listen",
         "127.0.0.1:" + std::to_string(port)},
        {{"WAYSTONE_DB", db_}}, dir_.path());
    ASSERT_TRUE(
        testing::WaitFor([&] { return send("GET", "/readyz", "", "").outcome.status == 200; },
                         std::chrono::seconds(30)))
        << server.Errors();

    const HttpResponse shown = send("GET", "/v1/instances/d-1", ops, "");
    ASSERT_EQ(shown.outcome.status, 200) << shown.body;
    const Json view = Json::parse(shown.body);
    EXPECT_EQ(view["state"], "needs_attention") << shown.body;
    EXPECT_NE(shown.body.find("definition_diverged"), std::string::npos) << shown.body;
    EXPECT_NE(shown.body.find("\"notify\""), std::string::npos) << shown.body;
    const HttpResponse listed = send("GET", "/v1/instances?state=needs_attention", ops, "");
    ASSERT_EQ(listed.outcome.status, 200) << listed.body;
    for (const char* id : {"d-1", "d-2", "d-3"}) {
      EXPECT_NE(listed.body.find(std::string("\"") + id + "\""), std::string::npos) << listed.body;
    }

    // An event its function does not wait for is kept (and listed), once.
    HttpRequest note{
        "POST",
        url + "/v1/events",
        {{"Authorization", "Bearer " + ops}, {"Content-Type", "application/cloudevents+json"}},
        R"({"specversion":"1.0","id":"n-1","source":"/desk","type":"com.example.note",)"
        R"("data":{"order":"d-1","text":"call back"}})",
        10'000};
    for (const char* outcome : {"kept", "duplicate"}) {
      const HttpResponse noted = http->Send(note);
      ASSERT_EQ(noted.outcome.status, 200) << noted.body;
      EXPECT_EQ(Json::parse(noted.body)["results"][0]["outcome"], outcome) << noted.body;
    }
    const Json with_note = Json::parse(send("GET", "/v1/instances/d-1", ops, "").body);
    ASSERT_EQ(with_note["kept_events"].size(), 1u) << with_note.dump();
    EXPECT_EQ(with_note["kept_events"][0]["data"]["text"], "call back");
    auto cli_shown =
        testing::RunProcess({testing::WaystoneBinary(), "show", "d-1", "--server", url},
                            {{"WAYSTONE_TOKEN", ops}}, dir_.path());
    EXPECT_NE(cli_shown.out.find("kept event com.example.note (/desk n-1"), std::string::npos)
        << cli_shown.out << cli_shown.err;

    // notify may have been sent: retrying it is refused, a confirmation is not.
    const HttpResponse retried = send("POST", "/v1/instances/d-1/retry", ops,
                                      R"({"step": "notify", "reason": "program fixed"})");
    EXPECT_EQ(retried.outcome.status, 409) << retried.body;
    EXPECT_NE(retried.body.find("confirm"), std::string::npos) << retried.body;
    const HttpResponse denied =
        send("POST", "/v1/instances/d-3/close", viewer, R"({"reason": "not mine to close"})");
    EXPECT_EQ(denied.outcome.status, 403) << denied.body;
    const HttpResponse confirmed =
        send("POST", "/v1/instances/d-1/confirm", ops,
             R"({"step": "notify", "happened": false, "reason": "LINE shows no message"})");
    EXPECT_EQ(confirmed.outcome.status, 200) << confirmed.body;
    const HttpResponse compensated = send("POST", "/v1/instances/d-2/compensate", ops,
                                          R"({"reason": "the customer cancelled"})");
    EXPECT_EQ(compensated.outcome.status, 200) << compensated.body;
    const HttpResponse closed =
        send("POST", "/v1/instances/d-3/close", ops, R"({"reason": "a duplicate ticket"})");
    EXPECT_EQ(closed.outcome.status, 200) << closed.body;
  }

  // The program (version 1 again) runs what the actions released.
  auto d1 = Saga("d-1", 7, "U-1");
  EXPECT_TRUE(Says(d1, "state completed")) << d1.out << d1.err;
  auto d2 = Saga("d-2", 7, "U-1");
  EXPECT_TRUE(Says(d2, "state compensated")) << d2.out << d2.err;
  auto d3 = Saga("d-3", 7, "U-1");
  EXPECT_TRUE(Says(d3, "state closed")) << d3.out << d3.err;
  EXPECT_TRUE(Says(d3, "a duplicate ticket")) << d3.out;
  const Json stats = Stats();
  EXPECT_EQ(stats["messages"], messages_before + 1) << stats.dump();  // d-1's, once
  EXPECT_EQ(stats["duplicate_messages"], 0) << stats.dump();
  EXPECT_EQ(stats["orders"], 3) << stats.dump();
  ASSERT_EQ(stats["cancels"].size(), 1u) << stats.dump();  // d-2's order
  EXPECT_EQ(Query("SELECT s.name FROM steps s JOIN instances i ON i.id = s.instance_id WHERE "
                  "i.business_key = 'd-2' AND s.state = 7"),
            "create-order");
}

INSTANTIATE_TEST_SUITE_P(Backends, CodeSagaTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const auto& info) {
                           return std::string(info.param == Backend::kSqlite ? "sqlite"
                                                                             : "postgres");
                         });

}  // namespace
}  // namespace waystone
