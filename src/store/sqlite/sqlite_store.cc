#include "store/sqlite/sqlite_store.h"

#include <set>

#include "base/mutex.h"
#include "store/migration.h"
#include "store/sqlite/sqlite_rows.h"

namespace waystone {

SqliteStore::SqliteStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
SqliteStore::~SqliteStore() = default;

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const StoreOptions& options) {
  WS_ASSIGN_OR_RETURN(auto db,
                      SqliteDb::Open(options.path, static_cast<int>(options.busy_timeout)));
  if (options.synchronous != "FULL" && options.synchronous != "NORMAL" &&
      options.synchronous != "OFF" && options.synchronous != "EXTRA") {
    return absl::InvalidArgumentError("synchronous must be OFF, NORMAL, FULL or EXTRA");
  }
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=" + options.synchronous));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  auto store = std::unique_ptr<SqliteStore>(new SqliteStore(std::move(db)));
  WS_RETURN_IF_ERROR(store->Migrate());
  return store;
}

absl::Status SqliteStore::Migrate() {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_RETURN_IF_ERROR(
        db.Exec("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                  "name TEXT NOT NULL, applied_at INTEGER NOT NULL)"));
    WS_ASSIGN_OR_RETURN(SqliteStatement * applied,
                        db.Prepare("SELECT version FROM schema_migrations"));
    WS_ASSIGN_OR_RETURN(std::vector<int64_t> versions,
                        CollectRows(applied, [](const SqliteStatement& r) { return r.Int(0); }));
    const std::set<int64_t> done(versions.begin(), versions.end());
    const int current = done.empty() ? 0 : static_cast<int>(*done.rbegin());
    const auto& migrations = sqlite_migrations();
    const int newest = migrations.empty() ? 0 : migrations.back().version;
    if (current > newest) {
      return absl::FailedPreconditionError("database schema is version " + std::to_string(current) +
                                           " but this build knows only " + "up to " +
                                           std::to_string(newest) + "; use a newer waystone");
    }
    for (const auto& migration : migrations) {
      // Every one not applied yet, below the newest applied too: a migration merged
      // after a higher-numbered one (branches own their numbers) still runs.
      if (done.contains(migration.version)) continue;
      WS_RETURN_IF_ERROR(db.Exec(migration.sql));
      WS_ASSIGN_OR_RETURN(SqliteStatement * insert,
                          db.Prepare("INSERT INTO schema_migrations VALUES (?, ?, "
                                       "CAST(strftime('%s','now') AS INTEGER) * 1000)"));
      WS_RETURN_IF_ERROR(insert->BindAll(migration.version, migration.name).Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<int> SqliteStore::SchemaVersion() {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT MAX(version) FROM schema_migrations"));
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  const int version = row ? static_cast<int>(s->Int(0)) : 0;
  s->Reset();
  return version;
}

}  // namespace waystone
