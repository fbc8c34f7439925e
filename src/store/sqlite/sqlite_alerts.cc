// SqliteStore: alerts outside an instance lease (AlertStore).

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {

absl::StatusOr<int64_t> SqliteStore::RaiseAlert(const AlertRecord& alert,
                                                const EventRecord& event) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  int64_t id = 0;
  absl::Status status = InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(id, SqliteInsertAlert(db, alert, alert.instance_id, alert.created_at));
    return SqliteInsertEvent(db, event, event.instance_id, alert.created_at);
  });
  if (!status.ok()) return status;
  return id;
}

absl::StatusOr<AlertRecord> SqliteStore::GetAlert(int64_t id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare(absl::StrCat("SELECT ", kAlertColumns,
                                                                     " FROM alerts WHERE id = ?")));
  s->BindAll(id);
  WS_ASSIGN_OR_RETURN(std::optional<AlertRecord> alert, FirstRow(s, ReadAlert<SqliteStatement>));
  if (!alert) return absl::NotFoundError("no alert " + std::to_string(id));
  return *alert;
}

absl::StatusOr<std::vector<AlertRecord>> SqliteStore::ListAlerts(int64_t instance_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("SELECT ", kAlertColumns,
                                                " FROM alerts WHERE (?1 = 0 OR instance_id = ?1) "
                                                "ORDER BY id")));
  s->BindAll(instance_id);
  return CollectRows(s, ReadAlert<SqliteStatement>);
}

absl::Status SqliteStore::AcknowledgeAlert(int64_t id, const AuditRecord& audit) {
  static const std::string kAcknowledge =
      absl::StrCat("UPDATE alerts SET state = ", SqlValue(AlertState::kAcknowledged),
                   ", updated_at = ? WHERE id = ? AND state = ", SqlValue(AlertState::kOpen));
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * ack, db.Prepare(kAcknowledge));
    WS_RETURN_IF_ERROR(ack->BindAll(audit.at, id).Run());
    if (db.Changes() != 1) {
      return absl::FailedPreconditionError(
          "the alert is not open");  // no database id: callers show public ones
    }
    return SqliteInsertAudit(db, audit, audit.instance_id, audit.at);
  });
}

absl::StatusOr<std::vector<StaleUnknown>> SqliteStore::StaleUnknownSteps(Millis unknown_before) {
  static const std::string kStale = absl::StrCat(
      "SELECT s.instance_id, i.tenant, s.name, s.unknown_since FROM steps s JOIN instances i ON "
      "i.id = s.instance_id WHERE s.state = ",
      SqlValue(StepState::kUnknown),
      " AND s.unknown_since > 0 AND s.unknown_since <= ?1 AND NOT EXISTS (SELECT 1 FROM alerts a "
      "WHERE a.instance_id = s.instance_id AND a.step_name = s.name AND a.kind = ",
      SqlValue(AlertKind::kUnknownUnresolved), " AND a.created_at >= s.unknown_since)");
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare(kStale));
  s->BindAll(unknown_before);
  return CollectRows(s, ReadStaleUnknown<SqliteStatement>);
}

}  // namespace waystone
