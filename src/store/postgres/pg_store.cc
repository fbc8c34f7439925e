#include "store/postgres/pg_store.h"

#include <algorithm>

#include "base/mutex.h"
#include "store/migration.h"
#include "store/postgres/pg_rows.h"

namespace waystone {
namespace {

// Any key shared by every Waystone process: serialises migrations.
constexpr int64_t kMigrationLock = 0x57415953544f4e45;  // "WAYSTONE"

}  // namespace

PostgresStore::PostgresStore(std::string conninfo, int max_connections, int attempts_per_step)
    : conninfo_(std::move(conninfo)),
      max_connections_(max_connections),
      attempts_per_step_(attempts_per_step) {}

PostgresStore::~PostgresStore() = default;

absl::StatusOr<PostgresStore::Lent> PostgresStore::Acquire() {
  {
    MutexLock lock(mu_);
    while (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      if (!c->broken()) return Lent(this, std::move(c));
    }
    if (std::chrono::steady_clock::now() < next_connect_) {
      return absl::UnavailableError("PostgreSQL unreachable; reconnecting with backoff (" +
                                    std::to_string(connect_backoff_ms_) + "ms)");
    }
  }
  auto c = PgConnection::Connect(conninfo_);
  MutexLock lock(mu_);
  if (!c.ok()) {
    connect_backoff_ms_ = std::clamp<int64_t>(connect_backoff_ms_ * 2, 50, 2000);
    next_connect_ =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(connect_backoff_ms_);
    return c.status();
  }
  connect_backoff_ms_ = 0;
  return Lent(this, std::move(*c));
}

void PostgresStore::Release(std::unique_ptr<PgConnection> connection) {
  if (connection->broken()) return;
  MutexLock lock(mu_);
  if (static_cast<int>(idle_.size()) < max_connections_) idle_.push_back(std::move(connection));
}

absl::StatusOr<std::unique_ptr<PostgresStore>> PostgresStore::Open(const StoreOptions& options) {
  auto store = std::unique_ptr<PostgresStore>(
      new PostgresStore(options.path, options.max_connections, options.attempts_per_step));
  WS_RETURN_IF_ERROR(store->Migrate());
  return store;
}

absl::Status PostgresStore::Migrate() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  // A session lock: held across the migration transactions, released below.
  WS_RETURN_IF_ERROR(
      c->Query("SELECT pg_advisory_lock($1::bigint)", Params(kMigrationLock)).status());
  absl::Status status = [&]() -> absl::Status {
    WS_RETURN_IF_ERROR(
        c->Exec("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER "
                "PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"));
    WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT version FROM schema_migrations"));
    WS_ASSIGN_OR_RETURN(std::vector<const Migration*> pending,
                        PendingMigrations(postgres_migrations(), PgRows(r, [](const PgRow& row) {
                                            return static_cast<int>(row.Int(0));
                                          })));
    for (const Migration* migration : pending) {
      WS_RETURN_IF_ERROR(c->Exec("BEGIN"));
      absl::Status applied = c->Exec(std::string(migration->sql));
      if (applied.ok()) {
        applied = c->Query(
                       "INSERT INTO schema_migrations VALUES ($1::integer, $2, "
                       "(extract(epoch from now()) * 1000)::bigint)",
                       Params(migration->version, migration->name))
                      .status();
      }
      if (applied.ok()) applied = c->Commit();
      if (!applied.ok()) {
        if (!c->Exec("ROLLBACK").ok()) c->MarkBroken();
        return applied;
      }
    }
    return absl::OkStatus();
  }();
  (void)c->Query("SELECT pg_advisory_unlock($1::bigint)", Params(kMigrationLock));
  return status;
}

absl::StatusOr<int> PostgresStore::SchemaVersion() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"));
  return static_cast<int>(r.Int(0, 0));
}

}  // namespace waystone
