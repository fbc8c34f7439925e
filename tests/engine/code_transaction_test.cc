#include "engine/drive/code_transaction.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

// Keeps what it was asked to run: what the store would bind.
class RecordingRunner final : public StatementRunner {
 public:
  absl::StatusOr<std::string> Run(const BusinessStatement& statement) override {
    statements.push_back(statement);
    return std::string(R"({"rows":[],"count":0})");
  }
  std::vector<BusinessStatement> statements;
};

// The result of one Execute(text, params) inside a transaction of an instance of acme.
absl::StatusOr<BusinessWorkResult> RunOne(RecordingRunner& runner, bool tenant_scoped,
                                          const std::string& text,
                                          std::map<std::string, SqlParam> params) {
  InstanceRecord instance;
  instance.id = 7;
  instance.tenant = "acme";
  SeededRandom random(1);
  const TransactionWork work(
      0,
      [&](CodeTransaction& tx) -> absl::StatusOr<std::string> { return tx.Execute(text, params); },
      instance, random, 1'000, tenant_scoped);
  return work.Run(runner);
}

TEST(CodeTransactionTest, TenantIsBoundToTheInstancesTenantAndNoCallerMayChooseIt) {
  RecordingRunner runner;
  const SqlParam k{SqlParam::Kind::kText, "A1"};
  ASSERT_TRUE(
      RunOne(runner, true, "UPDATE a SET v = 1 WHERE tenant = :tenant AND k = :k", {{"k", k}})
          .ok());
  ASSERT_EQ(runner.statements.size(), 1u);
  ASSERT_EQ(runner.statements[0].values.size(), 2u);
  EXPECT_EQ(runner.statements[0].values[0].text, "acme");
  EXPECT_EQ(runner.statements[0].values[0].kind, SqlParam::Kind::kText);
  EXPECT_EQ(runner.statements[0].values[1].text, "A1");

  auto chosen = RunOne(runner, false, "DELETE FROM a WHERE tenant = :tenant",
                       {{"tenant", {SqlParam::Kind::kText, "globex"}}});
  EXPECT_FALSE(chosen.ok());
  EXPECT_NE(chosen.status().message().find("bound by Waystone"), std::string::npos)
      << chosen.status();

  // With tenants configured, a statement that could touch another tenant's rows is
  // refused before it reaches the database; without, it runs as written.
  auto unscoped = RunOne(runner, true, "UPDATE a SET v = 1 WHERE k = :k", {{"k", k}});
  EXPECT_FALSE(unscoped.ok());
  EXPECT_NE(unscoped.status().message().find("not scoped to its tenant"), std::string::npos)
      << unscoped.status();
  EXPECT_EQ(runner.statements.size(), 1u);
  EXPECT_TRUE(RunOne(runner, false, "UPDATE a SET v = 1 WHERE k = :k", {{"k", k}}).ok());
  EXPECT_EQ(runner.statements.size(), 2u);
}

}  // namespace
}  // namespace waystone
