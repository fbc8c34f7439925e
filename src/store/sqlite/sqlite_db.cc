#include "store/sqlite/sqlite_db.h"

#include <chrono>
#include <string>
#include <thread>

#include "base/status_macros.h"

namespace waystone {

absl::Status SqliteStatus(int rc, sqlite3* db, std::string_view what) {
  if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return absl::OkStatus();
  std::string message(what);
  message += ": ";
  message += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
      return absl::UnavailableError(message);
    case SQLITE_CONSTRAINT:
      return absl::AlreadyExistsError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    default:
      return absl::InternalError(message);
  }
}

SqliteStatement& SqliteStatement::Bind(int index, int64_t value) {
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}

SqliteStatement& SqliteStatement::Bind(int index, std::string_view value) {
  sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  return *this;
}

SqliteStatement& SqliteStatement::BindNull(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}

absl::StatusOr<bool> SqliteStatement::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqliteStatus(rc, sqlite3_db_handle(stmt_), "sqlite step");
}

absl::Status SqliteStatement::Run() {
  while (true) {
    auto row = Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::OkStatus();
  }
}

std::string SqliteStatement::Text(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  if (text == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
}

void SqliteStatement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

absl::StatusOr<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::string& path,
                                                         int busy_timeout_ms, const char* vfs) {
  sqlite3* db = nullptr;
  const int flags =
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags, vfs);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteStatus(rc, db, "open " + path);
    sqlite3_close(db);
    return status;
  }
  sqlite3_busy_timeout(db, busy_timeout_ms);
  sqlite3_extended_result_codes(db, 1);
  return std::unique_ptr<SqliteDb>(new SqliteDb(db));
}

SqliteDb::~SqliteDb() {
  cache_.clear();
  sqlite3_close(db_);
}

absl::Status SqliteDb::Exec(std::string_view sql) {
  char* error = nullptr;
  const std::string text(sql);
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &error);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteStatus(rc, db_, error != nullptr ? error : "exec");
    sqlite3_free(error);
    return status;
  }
  return absl::OkStatus();
}

absl::Status SqliteDb::EnterWal(int patience_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(patience_ms);
  // The pragma answers the journal mode the database is in after it.
  auto answer = [](void* mode, int columns, char** values, char**) {
    if (columns > 0 && values[0] != nullptr) *static_cast<std::string*>(mode) = values[0];
    return 0;
  };
  while (true) {
    std::string mode;
    const int rc = sqlite3_exec(db_, "PRAGMA journal_mode=WAL", answer, &mode, nullptr);
    if ((rc & 0xff) == SQLITE_BUSY && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    if (rc != SQLITE_OK) return SqliteStatus(rc, db_, "PRAGMA journal_mode=WAL");
    // SQLite keeps its rollback journal where it has no locks or shared memory (a
    // "?nolock=1" URI, some network file systems): the store's connections would then
    // read and write without the locks that keep them apart.
    if (mode != "wal" && mode != "memory") {
      return absl::FailedPreconditionError(
          "the database stays in journal mode '" + mode +
          "': Waystone needs WAL, which SQLite refuses without file locks and shared memory "
          "(a '?nolock=1' URI, some network file systems)");
    }
    return absl::OkStatus();
  }
}

absl::Status SqliteDb::Run(const std::string& sql) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * statement, Prepare(sql));
  return statement->Run();
}

absl::StatusOr<SqliteStatement*> SqliteDb::Prepare(const std::string& sql) {
  auto it = cache_.find(sql);
  if (it != cache_.end()) {
    it->second->Reset();
    return it->second.get();
  }
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v3(db_, sql.c_str(), static_cast<int>(sql.size()),
                                    SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) return SqliteStatus(rc, db_, "prepare");
  auto [inserted, _] = cache_.emplace(sql, std::make_unique<SqliteStatement>(stmt));
  return inserted->second.get();
}

}  // namespace waystone
