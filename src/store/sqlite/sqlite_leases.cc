// SqliteStore: claims under leases and when work is due (LeaseStore).

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/lease_claims.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {
namespace {

// Takes the lease of each picked row (id, previous owner) for `owner`.
absl::StatusOr<std::vector<ClaimedRow>> TakeLeases(
    SqliteDb& db, const std::vector<std::pair<int64_t, std::string>>& picked,
    const std::string& owner, Millis now, Millis lease_duration) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * take,
                      db.Prepare("UPDATE instances SET lease_owner = ?1, lease_expires_at = ?2 + "
                                 "?3, lease_epoch = lease_epoch + 1 WHERE id = ?4 RETURNING "
                                 "lease_epoch"));
  std::vector<ClaimedRow> rows;
  for (const auto& [id, previous] : picked) {
    take->BindAll(owner, now, lease_duration, id);
    WS_ASSIGN_OR_RETURN(std::optional<int64_t> epoch,
                        FirstRow(take, [](const SqliteStatement& r) { return r.Int(0); }));
    if (epoch) rows.push_back({id, *epoch, previous});
  }
  return rows;
}

std::pair<int64_t, std::string> ReadPicked(const SqliteStatement& r) {
  return {r.Int(0), r.Text(1)};
}

}  // namespace

absl::StatusOr<std::vector<Lease>> SqliteStore::ClaimRunnable(const std::string& owner, Millis now,
                                                              Millis lease_duration, int limit) {
  static const std::string kPick = absl::StrCat(
      "SELECT id, lease_owner FROM instances WHERE state IN ", SqlRunnableStates(),
      " AND next_run_at <= ?1 AND lease_expires_at <= ?1 ORDER BY next_run_at LIMIT ?2");
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  std::vector<Lease> leases;
  absl::Status status = InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * pick, db.Prepare(kPick));
    pick->BindAll(now, limit);
    WS_ASSIGN_OR_RETURN(auto picked, CollectRows(pick, ReadPicked));
    WS_ASSIGN_OR_RETURN(std::vector<ClaimedRow> rows,
                        TakeLeases(db, picked, owner, now, lease_duration));
    int64_t takeovers = 0;
    leases = LeasesOf(rows, owner, &takeovers);
    if (takeovers == 0) return absl::OkStatus();
    return SqliteAddToCounter(db, kCounterLeaseTakeovers, takeovers);
  });
  if (!status.ok()) return status;
  return leases;
}

absl::StatusOr<Lease> SqliteStore::ClaimInstance(int64_t instance_id, const std::string& owner,
                                                 Millis now, Millis lease_duration) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  Lease lease;
  absl::Status status = InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * pick,
                        db.Prepare("SELECT id, lease_owner FROM instances WHERE id = ?1 AND "
                                   "lease_expires_at <= ?2"));
    pick->BindAll(instance_id, now);
    WS_ASSIGN_OR_RETURN(auto picked, CollectRows(pick, ReadPicked));
    WS_ASSIGN_OR_RETURN(std::vector<ClaimedRow> rows,
                        TakeLeases(db, picked, owner, now, lease_duration));
    if (rows.empty()) {
      WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> record,
                          SqliteInstanceById(db, instance_id));
      if (!record) return absl::NotFoundError("no instance with id " + std::to_string(instance_id));
      return LeasedByAnother(*record);
    }
    int64_t takeovers = 0;
    lease = LeasesOf(rows, owner, &takeovers).front();
    if (takeovers == 0) return absl::OkStatus();
    return SqliteAddToCounter(db, kCounterLeaseTakeovers, takeovers);
  });
  if (!status.ok()) return status;
  return lease;
}

absl::StatusOr<std::vector<std::string>> SqliteStore::LeaseOwners(Millis now) {
  MutexLock lock(mu_);
  return SqliteLeaseOwners(*db_, "instances", SqlLeasedInstanceRows(), now);
}

absl::Status SqliteStore::ExpireLeases(const std::string& owner) {
  MutexLock lock(mu_);
  return SqliteExpireLeases(*db_, "instances", owner);
}

absl::StatusOr<std::optional<Millis>> SqliteStore::NextDueTime() {
  static const std::string kNext =
      absl::StrCat("SELECT MIN(MAX(next_run_at, lease_expires_at)) FROM instances WHERE state IN ",
                   SqlRunnableStates(), " AND next_run_at < ", SqlNoDueTime());
  return Reading([&](SqliteDb& db) -> absl::StatusOr<std::optional<Millis>> {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s, db.Prepare(kNext));
    WS_ASSIGN_OR_RETURN(std::optional<std::optional<Millis>> due,
                        FirstRow(s, [](const SqliteStatement& r) {
                          return r.IsNull(0) ? std::optional<Millis>() : r.Int(0);
                        }));
    return due ? *due : std::nullopt;
  });
}

}  // namespace waystone
