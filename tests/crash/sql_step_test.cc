// A sql step against the real databases, in real processes: tests/fixtures/sql-order.yaml
// creates an order at tests/targets/erp_target.py (written apart from our code, it
// counts what it received), puts a row for it into the integration's own `orders`
// table in the transaction of the step's checkpoint, and sends a message naming both.
// `waystone run` is SIGKILLed at every boundary and run again. The rows are counted
// by clients that share no code with ours: Python's sqlite3 module and psql.

#include <signal.h>

#include <algorithm>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

class SqlStepTest : public ::testing::TestWithParam<Backend> {
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
    // The integration's table, made beside Waystone's before Waystone ever opens it.
    Query(testing::OrdersTableSql(GetParam()));
  }

  // Runs `sql` with the database's own client (no code of ours); its rows as "a|b" lines.
  std::string Query(const std::string& sql) {
    return testing::ClientQuery(GetParam(), db_, sql, dir_.path());
  }

  std::map<std::string, std::string> Env(std::map<std::string, std::string> extra = {}) {
    extra.emplace("WAYSTONE_DB", db_);
    extra.emplace("TARGET_URL", target_->base_url());
    return extra;
  }

  static std::string Definition() {
    return testing::SourceDir() + "/tests/fixtures/sql-order.yaml";
  }

  testing::ProcessResult Run(const std::string& input,
                             std::map<std::string, std::string> extra = {}) {
    return testing::RunProcess({testing::WaystoneBinary(), "run", Definition(), "--input", input},
                               Env(std::move(extra)), dir_.path());
  }

  // What `waystone status` says of the instance, as JSON.
  Json Show(const std::string& id) {
    auto shown = testing::RunProcess({testing::WaystoneBinary(), "status", "order:" + id, "--json"},
                                     Env(), dir_.path());
    EXPECT_EQ(shown.exit_code, 0) << shown.err;
    return Json::parse(shown.out, nullptr, false);
  }

  static const Json* StepOf(const Json& shown, const std::string& name) {
    for (const Json& step : shown["steps"]) {
      if (step["name"] == name) return &step;
    }
    return nullptr;
  }

  Json Stats() { return Json::parse(target_->StatsJson()); }

  testing::TempDir dir_;
  std::unique_ptr<testing::ErpTarget> target_;
  std::string db_;
};

std::string Input(const std::string& id, int amount, const std::string& to = "U-1") {
  Json input = {{"id", id}, {"amount", amount}};
  if (!to.empty()) input["to"] = to;
  return input.dump();
}

TEST_P(SqlStepTest, TheRowCommitsWithTheCheckpointAndLaterStepsReadItsResult) {
  auto run = Run(Input("o-1", 50));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("state     completed"), std::string::npos) << run.out;
  const std::string row = Query("SELECT id, order_key, erp_id, amount, state FROM orders");
  const Json stats = Stats();
  ASSERT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(row, "1|o-1|ORD-1|50|open");
  ASSERT_EQ(stats["messages_by_content"].size(), 1u) << stats.dump();
  EXPECT_EQ(stats["messages_by_content"][0]["text"], "order ORD-1 is local row 1");
  const Json shown = Show("o-1");
  const Json* record = StepOf(shown, "record-order");
  ASSERT_NE(record, nullptr) << shown.dump();
  EXPECT_EQ((*record)["state"], "completed");
}

struct Boundary {
  const char* point;
  const char* step;
};

// SIGKILL before and after every call and every transaction of the saga; run again:
// one ERP order, one local row naming it, one message, and the row never out of step
// with the checkpoint (looked at right after the kill, before anything repairs it).
TEST_P(SqlStepTest, KilledAtEveryBoundaryOneOrderOneRowOneMessage) {
  const Boundary boundaries[] = {
      {"before-call", "create-order"},
      {"after-call", "create-order"},
      {"after-checkpoint", "create-order"},
      {"before-step", "record-order"},
      {"after-checkpoint", "record-order"},
      {"before-call", "notify"},
      {"after-call", "notify"},
  };
  int n = 0;
  for (const Boundary& b : boundaries) {
    const std::string id = "k-" + std::to_string(++n);
    SCOPED_TRACE(std::string(b.point) + ":" + b.step);
    auto killed =
        Run(Input(id, 10 + n), {{"WAYSTONE_CRASH_AT", std::string(b.point) + ":" + b.step}});
    ASSERT_EQ(killed.signal, SIGKILL) << killed.out << killed.err;

    // Right after the kill: the row exists exactly when the step's checkpoint does.
    const std::string rows = Query("SELECT COUNT(*) FROM orders WHERE order_key = '" + id + "'");
    const Json before = Show(id);
    const Json* record = StepOf(before, "record-order");
    ASSERT_NE(record, nullptr) << before.dump();
    EXPECT_EQ(rows, (*record)["state"] == "completed" ? "1" : "0") << before.dump();

    auto resumed = Run(Input(id, 10 + n));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
    EXPECT_NE(resumed.out.find("state     completed"), std::string::npos) << resumed.out;
    EXPECT_EQ(Query("SELECT COUNT(*) FROM orders WHERE order_key = '" + id + "'"), "1");
  }
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], n) << stats.dump();
  EXPECT_EQ(stats["duplicate_orders"], 0) << stats.dump();
  EXPECT_EQ(stats["messages"], n) << stats.dump();
  EXPECT_EQ(stats["duplicate_messages"], 0) << stats.dump();
  // Each row names the order the target made for it, and each message names both.
  const std::string rows = Query("SELECT COUNT(*) FROM orders o WHERE erp_id LIKE 'ORD-%'");
  EXPECT_EQ(rows, std::to_string(n));
  for (const Json& message : stats["messages_by_content"]) {
    const std::string text = message["text"];
    EXPECT_EQ(testing::RowsNamedByMessage(GetParam(), db_, text, dir_.path()), "1") << text;
  }
}

// A later step is rejected: the row is compensated by its own statement, in the
// transaction of the compensation's checkpoint, then the ERP order is cancelled;
// killed before and after the row's compensation, it still ends with one of each.
TEST_P(SqlStepTest, ALaterFailureCompensatesTheRowAndTheOrderOnce) {
  const Boundary boundaries[] = {{"before-compensate", "record-order"},
                                 {"after-compensate-checkpoint", "record-order"},
                                 {"before-compensate", "create-order"}};
  int n = 0;
  for (const Boundary& b : boundaries) {
    const std::string id = "c-" + std::to_string(++n);
    SCOPED_TRACE(std::string(b.point) + ":" + b.step);
    // No `to`: the target refuses the message (422), so the saga is undone.
    auto killed =
        Run(Input(id, 5, ""), {{"WAYSTONE_CRASH_AT", std::string(b.point) + ":" + b.step}});
    ASSERT_EQ(killed.signal, SIGKILL) << killed.out << killed.err;
    auto resumed = Run(Input(id, 5, ""));
    EXPECT_NE(resumed.out.find("state     compensated"), std::string::npos)
        << resumed.out << resumed.err;
    EXPECT_EQ(Query("SELECT state FROM orders WHERE order_key = '" + id + "'"), "cancelled");
  }
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], n) << stats.dump();
  EXPECT_EQ(stats["cancels"].size(), static_cast<size_t>(n)) << stats.dump();
  EXPECT_EQ(stats["duplicate_cancels"], 0) << stats.dump();
  EXPECT_EQ(stats["messages"], 0) << stats.dump();
}

// The database refuses the row (CHECK amount > 0): the step fails with the
// database's reason, nothing of it is written, and the order before it is cancelled.
TEST_P(SqlStepTest, ARefusedStatementFailsTheStepAndWritesNothing) {
  auto run = Run(Input("bad", -3));
  EXPECT_NE(run.out.find("state     compensated"), std::string::npos) << run.out << run.err;
  EXPECT_EQ(Query("SELECT COUNT(*) FROM orders"), "0");
  const Json shown = Show("bad");
  const Json* record = StepOf(shown, "record-order");
  ASSERT_NE(record, nullptr) << shown.dump();
  EXPECT_EQ((*record)["state"], "failed");
  std::string error = (*record).value("error_message", "");
  std::transform(error.begin(), error.end(), error.begin(), ::tolower);
  EXPECT_NE(error.find("check"), std::string::npos) << shown.dump();
  const Json stats = Stats();
  EXPECT_EQ(stats["orders"], 1) << stats.dump();
  EXPECT_EQ(stats["cancels"].size(), 1u) << stats.dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, SqlStepTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const auto& info) {
                           return std::string(info.param == Backend::kSqlite ? "sqlite"
                                                                             : "postgres");
                         });

}  // namespace
}  // namespace waystone
