#include "support/database_client.h"

#include "support/process.h"

namespace waystone::testing {

const char* OrdersTableSql(Backend backend) {
  return backend == Backend::kSqlite
             ? "CREATE TABLE orders (id INTEGER PRIMARY KEY, order_key TEXT UNIQUE NOT NULL, "
               "erp_id TEXT NOT NULL, amount NUMERIC CHECK (amount > 0), "
               "state TEXT NOT NULL DEFAULT 'open')"
             : "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, order_key TEXT UNIQUE NOT NULL, "
               "erp_id TEXT NOT NULL, amount NUMERIC CHECK (amount > 0), "
               "state TEXT NOT NULL DEFAULT 'open')";
}

std::string ClientQuery(Backend backend, const std::string& database, const std::string& sql,
                        const std::string& dir) {
  ProcessResult result;
  if (backend == Backend::kSqlite) {
    result = RunProcess(
        {"/usr/bin/env", "python3", "-c",
         "import sqlite3, sys\n"
         "db = sqlite3.connect(sys.argv[1], timeout=10)\n"
         "rows = db.execute(sys.argv[2]).fetchall()\n"
         "db.commit()\n"
         "print('\\n'.join('|'.join('' if v is None else str(v) for v in r) for r in rows))\n",
         database, sql},
        {}, dir);
  } else {
    result = RunProcess({"/usr/bin/env", "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                         "-d", database, "-c", sql},
                        {}, dir);
  }
  EXPECT_EQ(result.exit_code, 0) << sql << "\n" << result.err;
  std::string out = result.out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string RowsNamedByMessage(Backend backend, const std::string& database,
                               const std::string& text, const std::string& dir) {
  const std::string erp = text.substr(6, text.find(' ', 6) - 6);
  const std::string local = text.substr(text.rfind(' ') + 1);
  return ClientQuery(
      backend, database,
      "SELECT COUNT(*) FROM orders WHERE id = " + local + " AND erp_id = '" + erp + "'", dir);
}

}  // namespace waystone::testing
