#include "store/sqlite/sqlite_rows.h"

#include "absl/strings/str_cat.h"
#include "store/sql_values.h"

namespace waystone {
namespace {

template <typename... Args>
absl::StatusOr<std::optional<InstanceRecord>> InstanceWhere(SqliteDb& db, const char* where,
                                                            const Args&... args) {
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db.Prepare(absl::StrCat("SELECT ", kInstanceColumns, " FROM instances WHERE ", where)));
  s->BindAll(args...);
  return FirstRow(s, ReadInstance<SqliteStatement>);
}

template <typename... Args>
absl::StatusOr<std::optional<TombstoneRecord>> TombstoneWhere(SqliteDb& db, const char* where,
                                                              const Args&... args) {
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db.Prepare(absl::StrCat("SELECT ", kTombstoneColumns, " FROM tombstones WHERE ", where)));
  s->BindAll(args...);
  return FirstRow(s, ReadTombstone<SqliteStatement>);
}

}  // namespace

absl::StatusOr<std::optional<InstanceRecord>> SqliteInstanceById(SqliteDb& db, int64_t id) {
  return InstanceWhere(db, "id = ?", id);
}

absl::StatusOr<std::optional<InstanceRecord>> SqliteInstanceByKey(SqliteDb& db,
                                                                  const std::string& tenant,
                                                                  const std::string& key) {
  return InstanceWhere(db, "tenant = ? AND business_key = ?", tenant, key);
}

absl::StatusOr<std::optional<TombstoneRecord>> SqliteTombstoneOfInstance(SqliteDb& db,
                                                                         int64_t instance_id) {
  return TombstoneWhere(db, "instance_id = ?", instance_id);
}

absl::StatusOr<std::optional<TombstoneRecord>> SqliteTombstoneOfKey(SqliteDb& db,
                                                                    const std::string& tenant,
                                                                    const std::string& key) {
  return TombstoneWhere(db, "tenant = ? AND business_key = ?", tenant, key);
}

absl::StatusOr<std::optional<InboxEntry>> SqliteInboxEntry(SqliteDb& db, const std::string& tenant,
                                                           const std::string& source,
                                                           const std::string& id) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db.Prepare("SELECT data_hash, COALESCE(instance_id, 0), received_at FROM "
                                 "inbox WHERE tenant = ? AND source = ? AND event_id = ?"));
  s->BindAll(tenant, source, id);
  return FirstRow(s, [](const SqliteStatement& r) {
    return InboxEntry{r.Text(0), r.Int(1), r.Int(2)};
  });
}

absl::Status SqliteInsertEvent(SqliteDb& db, const EventRecord& e, int64_t instance_id,
                               Millis now) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * event,
                      db.Prepare("INSERT INTO outbox (event_id, instance_id, tenant, type, "
                                 "payload, created_at) VALUES (?, ?, ?, ?, ?, ?)"));
  return event->BindAll(e.event_id, instance_id, e.tenant, e.type, e.payload_json, now).Run();
}

absl::StatusOr<int64_t> SqliteInsertAlert(SqliteDb& db, const AlertRecord& a, int64_t instance_id,
                                          Millis now) {
  static const std::string kInsert = absl::StrCat(
      "INSERT INTO alerts (instance_id, tenant, step_name, kind, state, message, "
      "created_at, updated_at) VALUES (?, ?, ?, ?, ",
      SqlValue(AlertState::kOpen), ", ?, ?, ?)");
  WS_ASSIGN_OR_RETURN(SqliteStatement * alert, db.Prepare(kInsert));
  WS_RETURN_IF_ERROR(alert
                         ->BindAll(instance_id, a.tenant, a.step, static_cast<int64_t>(a.kind),
                                   a.message, now, now)
                         .Run());
  return db.LastInsertRowId();
}

absl::Status SqliteInsertAudit(SqliteDb& db, const AuditRecord& a, int64_t instance_id, Millis at) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * audit,
                      db.Prepare("INSERT INTO audit_log (at, actor, tenant, instance_id, action, "
                                 "reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?)"));
  return audit
      ->BindAll(at, a.actor, a.tenant, instance_id, a.action, a.reason,
                a.detail_json.empty() ? "{}" : a.detail_json)
      .Run();
}

absl::Status SqliteAddToCounter(SqliteDb& db, const std::string& name, int64_t delta) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db.Prepare("UPDATE counters SET value = value + ? WHERE name = ?"));
  return s->BindAll(delta, name).Run();
}

}  // namespace waystone

namespace waystone {

absl::StatusOr<std::vector<std::string>> SqliteLeaseOwners(SqliteDb& db, const char* table,
                                                           const std::vector<std::string>& rows,
                                                           Millis now) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db.Prepare(SqlLeaseOwners(table, rows, "?1")));
  s->BindAll(now);
  return CollectRows(s, ReadText0<SqliteStatement>);
}

absl::Status SqliteExpireLeases(SqliteDb& db, const char* table, const std::string& owner) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db.Prepare(absl::StrCat("UPDATE ", table,
                                              " SET lease_expires_at = 0 WHERE lease_owner = ? "
                                              "AND lease_expires_at > 0")));
  return s->BindAll(owner).Run();
}

}  // namespace waystone
