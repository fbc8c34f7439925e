#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace waystone {

// Maps an SQLite result code to a status whose code carries the retry meaning.
absl::Status SqliteStatus(int rc, sqlite3* db, std::string_view what);

// A prepared statement owned by SqliteDb's cache; reset before each use (Prepare)
// and after (FirstRow, CollectRows), so no read transaction stays open.
// Not thread-safe: used under the mutex of its SqliteStore connection.
class SqliteStatement {
 public:
  explicit SqliteStatement(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~SqliteStatement() { sqlite3_finalize(stmt_); }
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;

  SqliteStatement& Bind(int index, int64_t value);
  SqliteStatement& Bind(int index, std::string_view value);
  SqliteStatement& BindNull(int index);

  // Binds the arguments to parameters 1..N.
  template <typename... Args>
  SqliteStatement& BindAll(const Args&... args) {
    int index = 1;
    (BindOne(index++, args), ...);
    return *this;
  }

  // Steps once: true when a row is available, false when done.
  absl::StatusOr<bool> Step();
  // Steps to completion, discarding rows.
  absl::Status Run();

  int64_t Int(int column) const { return sqlite3_column_int64(stmt_, column); }
  std::string Text(int column) const;
  bool IsNull(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }

  void Reset();

 private:
  void BindOne(int index, int64_t value) { Bind(index, value); }
  void BindOne(int index, int value) { Bind(index, static_cast<int64_t>(value)); }
  void BindOne(int index, std::string_view value) { Bind(index, value); }
  void BindOne(int index, const std::string& value) { Bind(index, std::string_view(value)); }
  void BindOne(int index, const char* value) { Bind(index, std::string_view(value)); }

  sqlite3_stmt* stmt_;
};

// One SQLite connection with a statement cache. Not thread-safe.
class SqliteDb {
 public:
  // Opens `path` through the VFS named `vfs` (nullptr: the default one).
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path,
                                                        int busy_timeout_ms,
                                                        const char* vfs = nullptr);
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // Runs one or more statements without results.
  absl::Status Exec(std::string_view sql);
  // Puts the file in WAL mode. The switch needs an exclusive lock that SQLite does
  // not wait for (the busy handler is not asked), so two processes opening a new
  // file at once would see "database is locked": this waits up to `patience_ms`.
  absl::Status EnterWal(int patience_ms);
  // Returns the cached prepared statement for `sql`, reset and unbound.
  absl::StatusOr<SqliteStatement*> Prepare(const std::string& sql);
  // Runs one statement without results or parameters through the cache: for the
  // ones run per change (savepoints), which Exec would parse each time.
  absl::Status Run(const std::string& sql);

  // Whether the database lives in memory only (no file another connection could open).
  bool InMemory() const {
    const char* file = sqlite3_db_filename(db_, "main");
    return file == nullptr || *file == '\0';
  }
  int64_t Changes() const { return sqlite3_changes64(db_); }
  int64_t LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
  sqlite3* raw() const { return db_; }

 private:
  explicit SqliteDb(sqlite3* db) : db_(db) {}
  sqlite3* db_;
  std::map<std::string, std::unique_ptr<SqliteStatement>, std::less<>> cache_;
};

}  // namespace waystone
