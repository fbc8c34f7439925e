// PostgresStore: claims under leases and when work is due (LeaseStore).

#include <poll.h>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/lease_claims.h"
#include "store/postgres/pg_rows.h"
#include "store/sql_values.h"

namespace waystone {
namespace {

ClaimedRow ReadClaimed(const PgRow& r) { return {r.Int(0), r.Int(1), r.Text(2)}; }

// Counts the takeovers among `rows`. Rare (a worker died or stalled) and best
// effort: the claim has committed already.
std::vector<Lease> LeasesCounted(PgConnection& c, const std::vector<ClaimedRow>& rows,
                                 const std::string& owner) {
  int64_t takeovers = 0;
  std::vector<Lease> leases = LeasesOf(rows, owner, &takeovers);
  if (takeovers > 0) (void)PgAddToCounter(c, kCounterLeaseTakeovers, takeovers);
  return leases;
}

}  // namespace

absl::StatusOr<std::vector<Lease>> PostgresStore::ClaimRunnable(const std::string& owner,
                                                                Millis now, Millis lease_duration,
                                                                int limit) {
  static const std::string kClaim = absl::StrCat(
      "WITH picked AS (SELECT id, lease_owner AS previous FROM instances WHERE state IN ",
      SqlRunnableStates(),
      " AND next_run_at <= $2::bigint AND lease_expires_at <= $2::bigint ORDER BY next_run_at "
      "LIMIT $4::integer FOR UPDATE SKIP LOCKED) UPDATE instances i SET lease_owner = $1, "
      "lease_expires_at = $2::bigint + $3::bigint, lease_epoch = i.lease_epoch + 1 FROM picked "
      "WHERE i.id = picked.id RETURNING i.id, i.lease_epoch, picked.previous");
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kClaim, Params(owner, now, lease_duration, limit)));
  return LeasesCounted(*c, PgRows(r, ReadClaimed), owner);
}

absl::StatusOr<Lease> PostgresStore::ClaimInstance(int64_t instance_id, const std::string& owner,
                                                   Millis now, Millis lease_duration) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("WITH picked AS (SELECT id, lease_owner AS previous FROM instances WHERE id = "
               "$4::bigint AND lease_expires_at <= $2::bigint FOR UPDATE) UPDATE instances i SET "
               "lease_owner = $1, lease_expires_at = $2::bigint + $3::bigint, lease_epoch = "
               "i.lease_epoch + 1 FROM picked WHERE i.id = picked.id AND i.lease_expires_at <= "
               "$2::bigint RETURNING i.id, i.lease_epoch, picked.previous",
               Params(owner, now, lease_duration, instance_id)));
  if (r.rows() == 1) return LeasesCounted(*c, PgRows(r, ReadClaimed), owner).front();
  WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> record, PgInstanceById(*c, instance_id));
  if (!record) return absl::NotFoundError("no instance with id " + std::to_string(instance_id));
  return LeasedByAnother(*record);
}

absl::StatusOr<std::vector<std::string>> PostgresStore::LeaseOwners(Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return PgLeaseOwners(*c, "instances", SqlLeasedInstanceRows(), now);
}

absl::Status PostgresStore::ExpireLeases(const std::string& owner) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return PgExpireLeases(*c, "instances", owner);
}

absl::StatusOr<std::optional<Millis>> PostgresStore::NextDueTime() {
  static const std::string kNext = absl::StrCat(
      "SELECT MIN(GREATEST(next_run_at, lease_expires_at)) FROM instances WHERE state IN ",
      SqlRunnableStates(), " AND next_run_at < ", SqlNoDueTime());
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kNext));
  if (r.IsNull(0, 0)) return std::optional<Millis>();
  return std::optional<Millis>(r.Int(0, 0));
}

absl::Status PostgresStore::WaitForWork(Millis timeout) {
  MutexLock lock(listen_mu_);
  if (!listener_ || listener_->broken()) {
    listener_.reset();
    WS_ASSIGN_OR_RETURN(listener_, PgConnection::Connect(conninfo_));
    WS_RETURN_IF_ERROR(listener_->Exec("LISTEN waystone_work"));
  }
  if (listener_->DrainNotifications() > 0) return absl::OkStatus();
  pollfd fd{listener_->socket(), POLLIN, 0};
  if (poll(&fd, 1, static_cast<int>(std::max<Millis>(0, timeout))) > 0) {
    if (listener_->DrainNotifications() < 0) listener_.reset();
  }
  return absl::OkStatus();
}

}  // namespace waystone
