#pragma once

// A `sql` step's statement: SQL text whose values come only through named
// parameters (`:order_id`), never spliced into the text. Parsed once when the
// definition loads; each store runs it in its own placeholder syntax. No I/O.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace waystone {

// One token of a statement, outside comments: what the tenant check reads.
struct SqlToken {
  enum class Kind : uint8_t {
    kWord = 1,    // a keyword or a bare name, lower case
    kQuoted = 2,  // a quoted name ("x", `x`, [x]), lower case, unquoted
    kString = 3,  // a '...' string, as written
    kParam = 4,   // a :name parameter, its name
    kSymbol = 5,  // one character of anything else ('(', ',', '=', a digit), or "::"
  };
  Kind kind = Kind::kSymbol;
  std::string text;
};

// One statement, its named parameters numbered in order of first use.
struct SqlStatement {
  std::string text;                // as written
  std::vector<std::string> names;  // distinct parameter names; `names[i]` is number i + 1
  std::string sqlite;              // `:name` replaced by `?N`
  std::string postgres;            // `:name` replaced by `$N`
  // Every word and quoted identifier outside strings and comments, lower case and
  // unquoted (a table, a column, a keyword, a function): what may name a table.
  std::vector<std::string> identifiers;
  std::vector<SqlToken> tokens;
  // Empty when the statement touches only the rows of the tenant bound to :tenant
  // (model/sql_tenant_scope.h); else why not, for the definition's author.
  std::string unscoped;
};

// The parameter Waystone binds to the instance's tenant (a sql step's params may not).
inline constexpr std::string_view kTenantParam = "tenant";

// Parses `text`: one INSERT, UPDATE, DELETE, SELECT or WITH statement (a trailing
// `;` allowed); `:name` outside quotes and comments is a parameter (`::` is
// PostgreSQL's cast, not one). Refuses, naming what it found: another statement
// after the first, a template (`{{`), a positional placeholder (`?`, `$1`), a
// statement of another kind (DDL, transaction control, PRAGMA, ATTACH: they would
// end or change the transaction the checkpoint commits in), OR ROLLBACK, functions
// that act beyond the statement (set_config, pg_sleep, load_extension, ...), and
// what SQLite and PostgreSQL would read differently or this lexer could misread:
// dollar quotes, E'' and U&'' strings, nested comments, a backslash outside a
// string, an unterminated quote or comment. A lexer is a first line, not the
// boundary: each store also enforces the rules where the database can
// (SqliteChangeSql's authorizer).
absl::StatusOr<SqlStatement> ParseSqlStatement(std::string_view text);

// Waystone's own tables (both stores' migrations create exactly these; a store test
// checks): a sql step may not name them, since its statement commits with the
// checkpoint and would change what the engine relies on.
inline constexpr std::string_view kWaystoneTables[] = {
    "alerts",        "api_requests", "api_tokens",        "attempts",
    "audit_log",     "batch_items",  "batches",           "counters",
    "definitions",   "deliveries",   "idempotency_keys",  "inbox",
    "inbox_v",       "instances",    "kept_events",       "outbox",
    "relay_cursors", "relay_sinks",  "schema_migrations", "server_keys",
    "steps",         "target_calls", "target_controls",   "tombstones"};

// Whether `name` (in lower case) is one of kWaystoneTables.
inline bool IsWaystoneTable(std::string_view name) {
  for (std::string_view table : kWaystoneTables) {
    if (table == name) return true;
  }
  return false;
}

// A value bound to a parameter, as a template rendered it.
struct SqlParam {
  enum class Kind : uint8_t { kNull = 0, kInteger = 1, kReal = 2, kText = 3, kBoolean = 4 };
  Kind kind = Kind::kNull;
  std::string text;  // the value as text ("42", "1.5", "abc", "true"); "" for null
};

}  // namespace waystone
