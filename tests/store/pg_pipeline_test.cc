// PgConnection::Pipeline against a real PostgreSQL: what the server holds after a
// pipeline, not what we sent.

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

}  // namespace
}  // namespace waystone
