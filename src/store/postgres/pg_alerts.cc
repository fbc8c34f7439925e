// PostgresStore: alerts outside an instance lease (AlertStore).

#include "absl/strings/str_cat.h"
#include "store/postgres/pg_rows.h"
#include "store/sql_values.h"

namespace waystone {

absl::StatusOr<int64_t> PostgresStore::RaiseAlert(const AlertRecord& alert,
                                                  const EventRecord& event) {
  int64_t id = 0;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(id, PgInsertAlert(c, alert, alert.instance_id, alert.created_at));
    return PgInsertEvent(c, event, event.instance_id, alert.created_at);
  });
  if (!status.ok()) return status;
  return id;
}

absl::StatusOr<AlertRecord> PostgresStore::GetAlert(int64_t id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kAlertColumns,
                                                        " FROM alerts WHERE id = $1::bigint"),
                                           Params(id)));
  std::optional<AlertRecord> alert = PgFirstRow(r, ReadAlert<PgRow>);
  if (!alert) return absl::NotFoundError("no alert " + std::to_string(id));
  return *alert;
}

absl::StatusOr<std::vector<AlertRecord>> PostgresStore::ListAlerts(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kAlertColumns,
                                                        " FROM alerts WHERE ($1::bigint = 0 OR "
                                                        "instance_id = $1::bigint) ORDER BY id"),
                                           Params(instance_id)));
  return PgRows(r, ReadAlert<PgRow>);
}

absl::Status PostgresStore::AcknowledgeAlert(int64_t id, const AuditRecord& audit) {
  static const std::string kAcknowledge = absl::StrCat(
      "UPDATE alerts SET state = ", SqlValue(AlertState::kAcknowledged),
      ", updated_at = $1::bigint WHERE id = $2::bigint AND state = ", SqlValue(AlertState::kOpen));
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(PgResult ack, c.Query(kAcknowledge, Params(audit.at, id)));
    if (ack.affected() != 1) {
      return absl::FailedPreconditionError(
          "the alert is not open");  // no database id: callers show public ones
    }
    return PgInsertAudit(c, audit, audit.instance_id, audit.at);
  });
}

absl::StatusOr<std::vector<StaleUnknown>> PostgresStore::StaleUnknownSteps(Millis unknown_before) {
  static const std::string kStale = absl::StrCat(
      "SELECT s.instance_id, i.tenant, s.name, s.unknown_since FROM steps s JOIN instances i ON "
      "i.id = s.instance_id WHERE s.state = ",
      SqlValue(StepState::kUnknown),
      " AND s.unknown_since > 0 AND s.unknown_since <= $1::bigint AND NOT EXISTS (SELECT 1 FROM "
      "alerts a WHERE a.instance_id = s.instance_id AND a.step_name = s.name AND a.kind = ",
      SqlValue(AlertKind::kUnknownUnresolved), " AND a.created_at >= s.unknown_since)");
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kStale, Params(unknown_before)));
  return PgRows(r, ReadStaleUnknown<PgRow>);
}

}  // namespace waystone
