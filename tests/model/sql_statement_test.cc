#include "model/sql_statement.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace waystone {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SqlStatementTest, NamedParametersAreNumberedInOrderOfFirstUse) {
  auto parsed = ParseSqlStatement(
      "INSERT INTO orders (order_key, erp_id, amount) VALUES (:key, :erp_id, :amount)\n"
      "ON CONFLICT (order_key) DO UPDATE SET erp_id = :erp_id");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->names, ElementsAre("key", "erp_id", "amount"));
  EXPECT_EQ(parsed->sqlite,
            "INSERT INTO orders (order_key, erp_id, amount) VALUES (?1, ?2, ?3)\n"
            "ON CONFLICT (order_key) DO UPDATE SET erp_id = ?2");
  EXPECT_EQ(parsed->postgres,
            "INSERT INTO orders (order_key, erp_id, amount) VALUES ($1, $2, $3)\n"
            "ON CONFLICT (order_key) DO UPDATE SET erp_id = $2");
  EXPECT_THAT(parsed->identifiers,
              ElementsAre("insert", "into", "orders", "order_key", "erp_id", "amount", "values",
                          "on", "conflict", "do", "update", "set"));
}

TEST(SqlStatementTest, ColonsInsideQuotesCommentsAndCastsAreNotParameters) {
  auto parsed = ParseSqlStatement(
      "UPDATE orders SET note = 'at 10:30 ok', \"x:y\" = :v::text -- :not_one\n"
      "/* :nor_this */ WHERE id = :id::bigint AND body = ' :neither ';  ");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->names, ElementsAre("v", "id"));
  EXPECT_THAT(parsed->postgres, HasSubstr("'at 10:30 ok', \"x:y\" = $1::text -- :not_one"));
  EXPECT_THAT(parsed->postgres, HasSubstr("id = $2::bigint AND body = ' :neither '"));
  EXPECT_THAT(parsed->sqlite, HasSubstr("id = ?2::bigint"));
}

TEST(SqlStatementTest, DoubledQuotesStayInsideTheirString) {
  auto parsed = ParseSqlStatement("SELECT 'it''s :not' AS a, :yes AS b");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->names, ElementsAre("yes"));
}

TEST(SqlStatementTest, EveryNameIsSeenQualifiedQuotedBracketedOrInAList) {
  auto parsed = ParseSqlStatement(
      "WITH x AS (SELECT * FROM public.Orders o JOIN \"Lines\" l ON l.o = o.id) "
      "DELETE FROM archive, [Steps], `Outbox` WHERE id IN (SELECT id FROM x)");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const char* name : {"public", "orders", "lines", "archive", "steps", "outbox", "x"}) {
    EXPECT_NE(std::find(parsed->identifiers.begin(), parsed->identifiers.end(), name),
              parsed->identifiers.end())
        << name;
  }
}

TEST(SqlStatementTest, RefusesWhatWouldNotBeOneParameterisedStatement) {
  const std::pair<const char*, const char*> cases[] = {
      {"INSERT INTO t VALUES ('{{input.name}}')", "template"},
      {"INSERT INTO t VALUES (?)", "positional placeholder ('?')"},
      {"INSERT INTO t VALUES ($1)", "no positional placeholders"},
      {"SELECT $t$ x $t$", "no dollar quoting"},
      {"WITH c AS (SELECT $t$ x) UPDATE o SET a = 0 WHERE $t$ IS NULL", "'$' is not allowed"},
      {"SELECT E'\\'' , token_hash FROM t --'", "escape strings"},
      {"SELECT U&\"\\0073teps\" FROM t", "escape strings"},
      {"SELECT 1 -- x\r; DELETE FROM t", "goes on after its ';'"},
      {"SELECT 1 /* a /* b */ c */", "comment inside a comment"},
      {"INSERT OR ROLLBACK INTO t VALUES (:a)", "OR ROLLBACK"},
      {"SELECT set_config('search_path', 'x', false)", "'set_config' is not allowed"},
      {"SELECT pg_sleep(10)", "'pg_sleep' is not allowed"},
      {"SELECT load_extension('x')", "'load_extension' is not allowed"},
      {"SELECT a FROM t WHERE b = \\x", "backslash"},
      {"INSERT INTO t VALUES (:a); DELETE FROM t", "goes on after its ';'"},
      {"COMMIT", "not 'commit'"},
      {"  begin; ", "not 'begin'"},
      {"CREATE TABLE t (a int)", "not 'create'"},
      {"DROP TABLE orders", "not 'drop'"},
      {"PRAGMA journal_mode=DELETE", "not 'pragma'"},
      {"ATTACH DATABASE 'x' AS y", "not 'attach'"},
      {"SELECT 'open", "quote is not closed"},
      {"SELECT 1 /* open", "comment is not closed"},
      {"  -- nothing\n", "empty"},
  };
  for (const auto& [text, message] : cases) {
    auto parsed = ParseSqlStatement(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr(message)) << text;
  }
}

TEST(SqlStatementTest, WaystoneTablesListIsSortedAndHasTheCoreTables) {
  const auto begin = std::begin(kWaystoneTables);
  const auto end = std::end(kWaystoneTables);
  EXPECT_TRUE(std::is_sorted(begin, end));
  for (std::string_view table : {"instances", "steps", "outbox", "inbox", "idempotency_keys"}) {
    EXPECT_NE(std::find(begin, end, table), end) << table;
  }
}

}  // namespace
}  // namespace waystone
