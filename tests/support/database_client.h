#pragma once

#include <string>

#include "support/backends.h"

namespace waystone::testing {

// The integration's own `orders` table, in each dialect: what a program keeps beside
// Waystone's tables (the sql step's and ctx.Transaction's tests write it).
const char* OrdersTableSql(Backend backend);

// Runs `sql` on `database` with the database's own client, sharing no code with
// Waystone: Python's sqlite3 module for a SQLite file, psql for a PostgreSQL URI.
// Returns its rows as "a|b" lines (no trailing newline); fails the test when the
// client does. `dir` holds the client's output.
std::string ClientQuery(Backend backend, const std::string& database, const std::string& sql,
                        const std::string& dir);

// How many rows of `orders` the order message `text` names: its text is
// "order <erp id> is local row <id>", and the row with that id must hold that erp id
// ("1" when the message and the row agree).
std::string RowsNamedByMessage(Backend backend, const std::string& database,
                               const std::string& text, const std::string& dir);

}  // namespace waystone::testing
