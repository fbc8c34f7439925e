#include "model/sql_tenant_scope.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/sql_statement.h"

namespace waystone {
namespace {

using ::testing::HasSubstr;

std::string ProblemOf(const char* text) {
  auto parsed = ParseSqlStatement(text);
  EXPECT_TRUE(parsed.ok()) << text << ": " << parsed.status();
  return parsed.ok() ? parsed->unscoped : "unparsed";
}

TEST(SqlTenantScopeTest, StatementsOnOneTableThatBeginTheirWhereWithTheTenantAreScoped) {
  const char* scoped[] = {
      "INSERT INTO orders (tenant, k, amount) VALUES (:tenant, :k, :amount) RETURNING id",
      "insert into orders (k, tenant) values (:k, :tenant), (:k2, :tenant)",
      "INSERT OR IGNORE INTO orders (tenant, k) VALUES (:tenant, :k)",
      "INSERT INTO orders (tenant, k) VALUES (:tenant, :k) ON CONFLICT (tenant, k) DO NOTHING",
      ("INSERT INTO orders AS o (tenant, k, v) VALUES (:tenant, :k, :v) ON CONFLICT (tenant, k) "
       "DO UPDATE SET v = excluded.v WHERE o.tenant = :tenant RETURNING o.id"),
      "UPDATE orders SET state = 'cancelled' WHERE tenant = :tenant AND id = :id",
      "UPDATE orders o SET amount = amount + 1 WHERE o.tenant = :tenant AND (k = :a OR k = :b)",
      "UPDATE orders SET state = 'x' WHERE :tenant = tenant",
      "UPDATE orders SET v = :v WHERE tenant = :tenant RETURNING id",
      "DELETE FROM orders WHERE tenant = :tenant AND k = :k",
      "DELETE FROM public.orders AS o WHERE orders.tenant = :tenant",
      "SELECT id, amount FROM orders WHERE tenant = :tenant AND k = :k ORDER BY id LIMIT 5",
      "SELECT count(*) AS n FROM orders o WHERE o.tenant = :tenant GROUP BY state",
      "SELECT 1 AS one",
      "SELECT :v AS echoed",
  };
  for (const char* text : scoped) EXPECT_EQ(ProblemOf(text), "") << text;
}

TEST(SqlTenantScopeTest, AStatementThatCouldTouchAnotherTenantsRowsIsNot) {
  const std::pair<const char*, const char*> unscoped[] = {
      // The issue's own: globex's UPDATE changed acme's row.
      {"UPDATE accounts SET v = :v WHERE k = :k", "does not use :tenant"},
      {"UPDATE accounts SET v = :v WHERE k = :k AND tenant = :tenant",
       "WHERE must begin with tenant = :tenant"},
      {"UPDATE accounts SET v = :v WHERE tenant = :tenant AND k = :k OR 1 = 1",
       "OR outside parentheses"},
      {"UPDATE accounts SET v = :v WHERE tenant = :tenant OR k = :k", "OR outside parentheses"},
      {"UPDATE accounts SET v = :v WHERE tenant = :tenant || 'x'", "followed by AND"},
      {"UPDATE accounts SET v = :v WHERE tenant = :tenant::text", "followed by AND"},
      {"UPDATE accounts SET v = :v WHERE tenant == :tenant", "begin with tenant = :tenant"},
      {"UPDATE accounts SET v = :v WHERE NOT tenant = :tenant", "begin with tenant = :tenant"},
      {"UPDATE accounts SET v = :v WHERE \"tenant\" = :tenant", "begin with tenant = :tenant"},
      {"UPDATE accounts SET v = :v WHERE other.tenant = :tenant", "begin with tenant = :tenant"},
      {"UPDATE accounts SET v = :v, tenant = :t WHERE tenant = :tenant", "SET names tenant"},
      {"UPDATE accounts SET v = :tenant", "needs WHERE"},
      {"UPDATE accounts SET v = a.v FROM accounts a WHERE tenant = :tenant", "FROM"},
      {"UPDATE OR REPLACE accounts SET k = :k WHERE tenant = :tenant", "OR REPLACE"},
      {"UPDATE accounts SET v = (SELECT v FROM accounts WHERE k = :k) WHERE tenant = :tenant",
       "subquery"},
      {"DELETE FROM accounts WHERE k = :k", "does not use :tenant"},
      {"DELETE FROM accounts USING other WHERE tenant = :tenant", "USING"},
      {"DELETE FROM accounts WHERE tenant = :tenant OR true", "OR outside parentheses"},
      {"SELECT v FROM accounts WHERE k = :k AND :tenant = :tenant", "begin with tenant"},
      {"SELECT v FROM accounts, other WHERE tenant = :tenant", "second table"},
      {"SELECT v FROM accounts JOIN other ON true WHERE tenant = :tenant", "joins"},
      {"SELECT v FROM accounts WHERE tenant = :tenant UNION SELECT v FROM accounts",
       "combines statements"},
      {"SELECT v FROM accounts WHERE tenant = :tenant AND k IN (SELECT k FROM accounts)",
       "subquery"},
      {"SELECT v FROM accounts", "does not use :tenant"},
      {"SELECT :tenant AS t, v FROM accounts", "needs WHERE tenant = :tenant"},
      {"WITH x AS (SELECT 1) SELECT v FROM accounts WHERE tenant = :tenant", "WITH"},
      {"INSERT INTO accounts (k, v) VALUES (:k, :tenant)", "column list must name tenant"},
      {"INSERT INTO accounts (tenant, k) VALUES (:t, :k), (:tenant, :k)", "in every row"},
      {"INSERT INTO accounts (tenant, k) VALUES (:tenant || 'x', :k)", "in every row"},
      {"INSERT INTO accounts (tenant, k) SELECT :tenant, k FROM accounts", "subquery"},
      {"INSERT INTO accounts DEFAULT VALUES", "does not use :tenant"},
      {"INSERT OR REPLACE INTO accounts (tenant, k) VALUES (:tenant, :k)", "OR REPLACE"},
      {"INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v) ON CONFLICT (k) DO UPDATE "
       "SET v = excluded.v",
       "DO UPDATE needs WHERE"},
      {"INSERT INTO accounts (tenant, k, v) VALUES (:tenant, :k, :v) ON CONFLICT (k) DO UPDATE "
       "SET v = excluded.v WHERE excluded.tenant = :tenant",
       "begin with tenant = :tenant"},
      {"INSERT INTO accounts (tenant, k) VALUES (:tenant, :k) ON CONFLICT (k) DO UPDATE SET "
       "tenant = excluded.tenant WHERE tenant = :tenant",
       "SET names tenant"},
  };
  for (const auto& [text, message] : unscoped) {
    EXPECT_THAT(ProblemOf(text), HasSubstr(message)) << text;
  }
}

}  // namespace
}  // namespace waystone
