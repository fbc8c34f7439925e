// PgConnection::Pipeline against a real PostgreSQL: what the server holds after a
// pipeline, not what we sent.

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "store/postgres/pg_connection.h"
#include "support/postgres_cluster.h"

namespace waystone {
namespace {

class PgPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = PgConnection::Connect(testing::FreshPostgresDatabase());
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
    ASSERT_TRUE(c_->Exec("CREATE TABLE t (n INTEGER PRIMARY KEY, v TEXT)").ok());
  }
  int64_t Rows() { return c_->Query("SELECT count(*) FROM t")->Int(0, 0); }

  std::unique_ptr<PgConnection> c_;
};

const std::string kInsert = "INSERT INTO t VALUES ($1::integer, $2)";
const std::string kUpdate = "UPDATE t SET v = $2 WHERE n = $1::integer";
const std::string kBegin = "BEGIN";

TEST_F(PgPipelineTest, ResultsComeBackInOrderAcrossRounds) {
  // More statements than one round holds, so the rounds follow one another.
  const int n = static_cast<int>(PgConnection::kPipelineRound) * 2 + 3;
  std::vector<PgStatement> statements;
  for (int i = 0; i < n; ++i) statements.push_back({&kInsert, Params(i, "x")});
  for (int i = 0; i < n; i += 2) statements.push_back({&kUpdate, Params(i, "even")});
  statements.push_back({&kUpdate, Params(n + 100, "none")});  // matches no row
  auto results = c_->Pipeline(statements);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), statements.size());
  EXPECT_EQ(results->front().affected(), 1);
  EXPECT_EQ(results->back().affected(), 0);
  EXPECT_EQ(Rows(), n);
  EXPECT_EQ(c_->Query("SELECT count(*) FROM t WHERE v = 'even'")->Int(0, 0), (n + 1) / 2);
}

TEST_F(PgPipelineTest, AFailedStatementStopsTheRestAndTheTransactionRollsBack) {
  std::vector<PgStatement> statements = {{&kBegin, {}},
                                         {&kInsert, Params(1, "a")},
                                         {&kInsert, Params(1, "duplicate")},
                                         {&kInsert, Params(2, "after")}};
  auto results = c_->Pipeline(statements);
  EXPECT_EQ(results.status().code(), absl::StatusCode::kAlreadyExists) << results.status();
  EXPECT_FALSE(c_->broken());
  // The transaction is failed, not committed: rolled back, nothing was written.
  ASSERT_TRUE(c_->Exec("ROLLBACK").ok());
  EXPECT_EQ(Rows(), 0);
  // The connection serves the next statement as usual.
  ASSERT_TRUE(c_->Query(kInsert, Params(3, "later")).ok());
  EXPECT_EQ(Rows(), 1);
}

// A transaction a statement failed in cannot commit: PostgreSQL answers its COMMIT
// with "ROLLBACK" and no error, which Commit reports; a sound one commits.
TEST_F(PgPipelineTest, ACommitOfAFailedTransactionIsAnError) {
  ASSERT_TRUE(c_->Exec("BEGIN").ok());
  ASSERT_TRUE(c_->Query(kInsert, Params(1, "a")).ok());
  EXPECT_FALSE(c_->Query(kInsert, Params(1, "duplicate")).ok());
  const absl::Status committed = c_->Commit();
  EXPECT_EQ(committed.code(), absl::StatusCode::kInternal) << committed;
  EXPECT_EQ(Rows(), 0);
  ASSERT_TRUE(c_->Exec("BEGIN").ok());
  ASSERT_TRUE(c_->Query(kInsert, Params(2, "b")).ok());
  EXPECT_TRUE(c_->Commit().ok());
  EXPECT_EQ(Rows(), 1);
}

// A statement joining arrays of rows to a table, prepared while the table was small,
// keeps its plan for a small table: it scans the whole table each time as the table
// grows. Planned each time, it reads the grown table through its primary key. Scans
// are counted by the server, in the transaction's own statistics.
TEST_F(PgPipelineTest, AStatementPlannedEachTimeFollowsItsTableAsItGrows) {
  static const std::string kJoined =
      "UPDATE t SET v = u.v FROM unnest($1::integer[], $2::text[]) AS u(n, v) WHERE t.n = u.n";
  const PgParams rows = Params("{1,2,3}", "{a,b,c}");
  // The server's count of scans not yet published, before and after, in one
  // transaction (it publishes them only between transactions).
  auto whole_table_scans = [&](bool planned_each_time) -> int64_t {
    static const std::string kScans =
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 't'";
    EXPECT_TRUE(c_->Exec("BEGIN").ok());
    auto before = c_->Query(kScans);
    auto results = c_->Pipeline({{&kJoined, rows, planned_each_time}});
    EXPECT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(results.ok() ? results->front().affected() : -1, 3);
    auto after = c_->Query(kScans);
    EXPECT_TRUE(before.ok() && after.ok()) << before.status() << after.status();
    EXPECT_TRUE(c_->Exec("ROLLBACK").ok());
    return before.ok() && after.ok() ? after->Int(0, 0) - before->Int(0, 0) : -1;
  };
  // No analyze meanwhile: a fresh one would make the server plan the kept statement anew.
  ASSERT_TRUE(c_->Exec("ALTER TABLE t SET (autovacuum_enabled = false)").ok());
  ASSERT_TRUE(c_->Exec("INSERT INTO t SELECT n, 'x' FROM generate_series(0, 9) n").ok());
  // After five runs PostgreSQL settles on a plan it keeps for the prepared statement.
  for (int i = 0; i < 8; ++i) whole_table_scans(false);
  ASSERT_TRUE(c_->Exec("INSERT INTO t SELECT n, 'x' FROM generate_series(10, 49999) n").ok());

  EXPECT_GT(whole_table_scans(false), 0) << "the kept plan no longer scans: the hazard is gone";
  EXPECT_EQ(whole_table_scans(true), 0);
  EXPECT_EQ(Rows(), 50000);
}

}  // namespace
}  // namespace waystone
