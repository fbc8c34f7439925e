// SqliteStore: outbox cursors and deliveries under leases (RelayStore).

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/mutex.h"
#include "store/relay_rules.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {
namespace {

absl::StatusOr<int64_t> CursorOf(SqliteDb& db, const std::string& sink) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db.Prepare("SELECT last_seq FROM relay_cursors WHERE sink = ?"));
  s->BindAll(sink);
  WS_ASSIGN_OR_RETURN(std::optional<int64_t> cursor,
                      FirstRow(s, [](const SqliteStatement& r) { return r.Int(0); }));
  return cursor.value_or(0);
}

// The SQL of a delivery's end; the rules are FinishDeliveryWith's.
class SqliteDeliverySql final : public DeliverySql {
 public:
  explicit SqliteDeliverySql(SqliteDb& db) : db_(db) {}

  absl::StatusOr<std::vector<EventRecord>> ReadEvents(const std::vector<int64_t>& seqs) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * events,
                        db_.Prepare(absl::StrCat("SELECT ", kEventColumns,
                                                 " FROM outbox WHERE seq IN (SELECT value FROM "
                                                 "json_each(?))")));
    events->BindAll(absl::StrCat("[", absl::StrJoin(seqs, ","), "]"));
    return CollectRows(events, waystone::ReadEvent<SqliteStatement>);
  }
  absl::StatusOr<bool> FinishClaimed(const DeliveryClaim& claim, const DeliveryUpdate& u) override {
    static const std::string kFinish = absl::StrCat(
        "UPDATE deliveries SET state = ?1, attempts = ?2, next_attempt_at = ?3, last_error = ?4, "
        "delivered_at = CASE WHEN ?1 = ",
        SqlValue(DeliveryState::kDelivered),
        " THEN ?5 ELSE delivered_at END, lease_owner = '', lease_expires_at = 0 WHERE id = ?6 "
        "AND lease_epoch = ?7 AND lease_owner = ?8");
    WS_ASSIGN_OR_RETURN(SqliteStatement * finish, db_.Prepare(kFinish));
    WS_RETURN_IF_ERROR(finish
                           ->BindAll(static_cast<int64_t>(u.state), u.attempts, u.next_attempt_at,
                                     u.error, u.now, claim.id, claim.epoch, claim.owner)
                           .Run());
    return db_.Changes() == 1;
  }
  absl::Status MarkEventDelivered(int64_t seq, Millis now) override {
    static const std::string kMark = absl::StrCat(
        "UPDATE outbox SET delivered_at = ?1 WHERE seq = ?2 AND NOT EXISTS (SELECT 1 FROM "
        "deliveries WHERE outbox_seq = ?2 AND state <> ",
        SqlValue(DeliveryState::kDelivered), ")");
    WS_ASSIGN_OR_RETURN(SqliteStatement * mark, db_.Prepare(kMark));
    return mark->BindAll(now, seq).Run();
  }
  absl::Status InsertAlert(const AlertRecord& alert, Millis now) override {
    return SqliteInsertAlert(db_, alert, alert.instance_id, now).status();
  }
  absl::Status InsertEvent(const EventRecord& event, Millis now) override {
    return SqliteInsertEvent(db_, event, event.instance_id, now);
  }
  absl::Status DisableSink(const std::string& sink, const std::string& reason,
                           Millis now) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * disable,
                        db_.Prepare("INSERT INTO relay_sinks VALUES (?, 1, ?, ?) ON CONFLICT "
                                    "(sink) DO UPDATE SET disabled = 1, reason = "
                                    "excluded.reason, updated_at = excluded.updated_at"));
    return disable->BindAll(sink, reason, now).Run();
  }

 private:
  SqliteDb& db_;
};

}  // namespace

absl::StatusOr<int64_t> SqliteStore::OutboxCursor(const std::string& sink) {
  MutexLock lock(mu_);
  return CursorOf(*db_, sink);
}

absl::StatusOr<std::vector<EventRecord>> SqliteStore::ReadOutbox(int64_t after_seq, int limit) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("SELECT ", kEventColumns,
                                                " FROM outbox WHERE seq > ? ORDER BY seq LIMIT "
                                                "?")));
  s->BindAll(after_seq, limit);
  return CollectRows(s, ReadEvent<SqliteStatement>);
}

absl::Status SqliteStore::AddDeliveries(const std::string& sink, int64_t expected_cursor,
                                        int64_t new_cursor,
                                        const std::vector<std::pair<int64_t, int64_t>>& wanted,
                                        Millis now) {
  static const std::string kInsert = absl::StrCat(
      "INSERT OR IGNORE INTO deliveries (outbox_seq, sink, instance_id, state, created_at) "
      "VALUES (?, ?, ?, ",
      SqlValue(DeliveryState::kPending), ", ?)");
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(int64_t cursor, CursorOf(db, sink));
    if (cursor != expected_cursor) {
      return absl::AbortedError("outbox cursor of sink " + sink + " moved");
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * insert, db.Prepare(kInsert));
    for (const auto& [seq, instance_id] : wanted) {
      WS_RETURN_IF_ERROR(insert->BindAll(seq, sink, instance_id, now).Run());
      insert->Reset();
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * move,
                        db.Prepare("INSERT INTO relay_cursors VALUES (?, ?) ON CONFLICT (sink) "
                                   "DO UPDATE SET last_seq = excluded.last_seq"));
    return move->BindAll(sink, new_cursor).Run();
  });
}

absl::StatusOr<std::vector<DeliveryClaim>> SqliteStore::ClaimDeliveries(
    const std::string& owner, Millis now, Millis lease_duration, int limit,
    const std::vector<std::string>& sinks) {
  // Only the oldest pending delivery of an instance per sink is eligible, so a
  // later event never overtakes an earlier one that is still being retried. Pending
  // deliveries are walked in outbox order (deliveries_due), stopping at the limit;
  // without statistics SQLite would pick the sink's index and sort the whole backlog.
  static const std::string kClaim = absl::StrCat(
      "UPDATE deliveries SET lease_owner = ?1, lease_expires_at = ?2 + ?3, lease_epoch = "
      "lease_epoch + 1 WHERE id IN (SELECT d.id FROM deliveries d INDEXED BY deliveries_due "
      "WHERE d.state = ",
      SqlValue(DeliveryState::kPending),
      " AND d.next_attempt_at <= ?2 AND d.lease_expires_at <= ?2 AND d.sink IN (SELECT value "
      "FROM json_each(?5)) AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.sink = d.sink AND "
      "e.instance_id = d.instance_id AND e.state = ",
      SqlValue(DeliveryState::kPending),
      " AND e.outbox_seq < d.outbox_seq) ORDER BY d.outbox_seq LIMIT ?4) RETURNING id, "
      "lease_epoch, sink, attempts, outbox_seq");
  const std::string sink_list = absl::StrCat("[", QuoteEach(sinks), "]");
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  std::vector<DeliveryClaim> claims;
  absl::Status status = InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * claim, db.Prepare(kClaim));
    claim->BindAll(owner, now, lease_duration, limit, sink_list);
    WS_ASSIGN_OR_RETURN(claims, CollectRows(claim, [&](const SqliteStatement& r) {
                          DeliveryClaim c;
                          c.id = r.Int(0);
                          c.epoch = r.Int(1);
                          c.owner = owner;
                          c.sink = r.Text(2);
                          c.attempts = static_cast<int>(r.Int(3));
                          c.event.seq = r.Int(4);
                          return c;
                        }));
    SqliteDeliverySql sql(db);
    return CompleteClaims(sql, &claims);
  });
  if (!status.ok()) return status;
  return claims;
}

absl::Status SqliteStore::FinishDelivery(const DeliveryClaim& claim, const DeliveryUpdate& u) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    SqliteDeliverySql sql(db);
    return FinishDeliveryWith(sql, claim, u);
  });
}

absl::StatusOr<std::vector<absl::Status>> SqliteStore::FinishDeliveries(
    const std::vector<FinishedDelivery>& finished) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransactionFor(db, [&] {
    SqliteDeliverySql sql(db);
    return FinishDeliveriesWith(sql, finished);
  });
}

absl::StatusOr<std::vector<std::string>> SqliteStore::DeliveryLeaseOwners(Millis now) {
  MutexLock lock(mu_);
  return SqliteLeaseOwners(*db_, "deliveries", SqlLeasedDeliveryRows(), now);
}

absl::Status SqliteStore::ExpireDeliveryLeases(const std::string& owner) {
  MutexLock lock(mu_);
  return SqliteExpireLeases(*db_, "deliveries", owner);
}

absl::StatusOr<std::vector<std::string>> SqliteStore::DisabledSinks() {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT sink FROM relay_sinks WHERE disabled = 1"));
  return CollectRows(s, ReadText0<SqliteStatement>);
}

absl::Status SqliteStore::EnableSink(const std::string& sink, Millis now) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("UPDATE relay_sinks SET disabled = 0, reason = 'enabled', "
                                   "updated_at = ? WHERE sink = ?"));
  return s->BindAll(now, sink).Run();
}

absl::StatusOr<std::vector<DeliveryRecord>> SqliteStore::ListDeliveries(int64_t instance_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("SELECT ", kDeliveryColumns,
                                                " FROM deliveries d JOIN outbox o ON o.seq = "
                                                "d.outbox_seq WHERE d.instance_id = ? ORDER BY "
                                                "d.outbox_seq, d.sink")));
  s->BindAll(instance_id);
  return CollectRows(s, ReadDelivery<SqliteStatement>);
}

absl::StatusOr<std::vector<SinkStats>> SqliteStore::DeliveryStats() {
  static const std::string kStats = absl::StrCat(
      "SELECT d.sink, SUM(d.state = ", SqlValue(DeliveryState::kPending),
      "), SUM(d.state = ", SqlValue(DeliveryState::kDelivered),
      "), SUM(d.state = ", SqlValue(DeliveryState::kParked),
      "), SUM(d.attempts) - SUM(d.state = ", SqlValue(DeliveryState::kDelivered),
      "), COALESCE(MIN(CASE WHEN d.state = ", SqlValue(DeliveryState::kPending),
      " THEN d.created_at END), 0), COALESCE((SELECT disabled FROM relay_sinks r WHERE r.sink = "
      "d.sink), 0) FROM deliveries d GROUP BY d.sink ORDER BY d.sink");
  // A scan of every delivery kept: on the reporting connection, not the writer's.
  return Reporting([&](SqliteDb& db) -> absl::StatusOr<std::vector<SinkStats>> {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s, db.Prepare(kStats));
    return CollectRows(s, ReadSinkStats<SqliteStatement>);
  });
}

}  // namespace waystone
