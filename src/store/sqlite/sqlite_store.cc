#include "store/sqlite/sqlite_store.h"

#include "base/mutex.h"
#include "store/migration.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/wal_gather_vfs.h"

namespace waystone {

SqliteStore::SqliteStore(std::unique_ptr<SqliteDb> db, int attempts_per_step)
    : attempts_per_step_(attempts_per_step), db_(std::move(db)) {}
SqliteStore::~SqliteStore() = default;

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const StoreOptions& options) {
  if (options.synchronous != "FULL" && options.synchronous != "NORMAL" &&
      options.synchronous != "OFF" && options.synchronous != "EXTRA") {
    return absl::InvalidArgumentError("synchronous must be OFF, NORMAL, FULL or EXTRA");
  }
  // Where every commit syncs the WAL, the writes of a commit's frames are gathered
  // into one (wal_gather_vfs.h).
  const bool syncs_each_commit = options.synchronous == "FULL" || options.synchronous == "EXTRA";
  const char* vfs = syncs_each_commit && RegisterWalGatherVfs() ? kWalGatherVfs : nullptr;
  WS_ASSIGN_OR_RETURN(auto db,
                      SqliteDb::Open(options.path, static_cast<int>(options.busy_timeout), vfs));
  WS_RETURN_IF_ERROR(db->EnterWal(static_cast<int>(options.busy_timeout)));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=" + options.synchronous));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  auto store =
      std::unique_ptr<SqliteStore>(new SqliteStore(std::move(db), options.attempts_per_step));
  WS_RETURN_IF_ERROR(store->Migrate());
  bool in_memory = false;
  {
    MutexLock lock(store->mu_);
    in_memory = store->db_->InMemory();
  }
  if (!in_memory) {
    for (ReadConnection* connection : {&store->reader_, &store->reporter_}) {
      WS_ASSIGN_OR_RETURN(auto reader,
                          SqliteDb::Open(options.path, static_cast<int>(options.busy_timeout)));
      WS_RETURN_IF_ERROR(reader->Exec("PRAGMA query_only=ON"));
      MutexLock lock(connection->mu);
      connection->db = std::move(reader);
    }
  }
  return store;
}

absl::Status SqliteStore::Migrate() {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_RETURN_IF_ERROR(
        db.Exec("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at INTEGER NOT NULL)"));
    WS_ASSIGN_OR_RETURN(SqliteStatement * versions,
                        db.Prepare("SELECT version FROM schema_migrations"));
    WS_ASSIGN_OR_RETURN(
        std::vector<int> applied,
        CollectRows(versions, [](const SqliteStatement& r) { return static_cast<int>(r.Int(0)); }));
    WS_ASSIGN_OR_RETURN(std::vector<const Migration*> pending,
                        PendingMigrations(sqlite_migrations(), applied));
    for (const Migration* migration : pending) {
      WS_RETURN_IF_ERROR(db.Exec(migration->sql));
      WS_ASSIGN_OR_RETURN(SqliteStatement * insert,
                          db.Prepare("INSERT INTO schema_migrations VALUES (?, ?, "
                                     "CAST(strftime('%s','now') AS INTEGER) * 1000)"));
      WS_RETURN_IF_ERROR(insert->BindAll(migration->version, migration->name).Run());
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
