#include "store/sqlite/raw_commit_probe.h"

#include <chrono>

#include "base/status_macros.h"
#include "store/sqlite/sqlite_db.h"

namespace waystone {

absl::StatusOr<double> MeasureSqliteRawCommitRate(const std::string& path,
                                                  const std::string& synchronous, Millis duration) {
  WS_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(path, 10'000));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=" + synchronous));
  WS_RETURN_IF_ERROR(db->Exec("CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, v TEXT)"));
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::milliseconds(duration);
  int64_t commits = 0;
  while (std::chrono::steady_clock::now() < end) {
    WS_RETURN_IF_ERROR(db->Exec("BEGIN IMMEDIATE"));
    WS_ASSIGN_OR_RETURN(SqliteStatement * insert, db->Prepare("INSERT INTO probe (v) VALUES (?)"));
    WS_RETURN_IF_ERROR(insert->BindAll("row").Run());
    WS_RETURN_IF_ERROR(db->Exec("COMMIT"));
    ++commits;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(commits) / seconds;
}

}  // namespace waystone
