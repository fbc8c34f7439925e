#include "store/postgres/pg_rows.h"

#include "absl/strings/str_cat.h"
#include "store/sql_values.h"

namespace waystone {

absl::StatusOr<std::optional<InstanceRecord>> PgInstanceById(PgConnection& c, int64_t id) {
  WS_ASSIGN_OR_RETURN(PgResult r, c.Query(absl::StrCat("SELECT ", kInstanceColumns,
                                                       " FROM instances WHERE id = $1::bigint"),
                                          Params(id)));
  return PgFirstRow(r, ReadInstance<PgRow>);
}

absl::StatusOr<std::optional<InstanceRecord>> PgInstanceByKey(PgConnection& c,
                                                              const std::string& tenant,
                                                              const std::string& key) {
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c.Query(absl::StrCat("SELECT ", kInstanceColumns,
                                           " FROM instances WHERE tenant = $1 AND business_key = "
                                           "$2"),
                              Params(tenant, key)));
  return PgFirstRow(r, ReadInstance<PgRow>);
}

absl::StatusOr<std::optional<TombstoneRecord>> PgTombstoneOfInstance(PgConnection& c,
                                                                     int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c.Query(absl::StrCat("SELECT ", kTombstoneColumns,
                                           " FROM tombstones WHERE instance_id = $1::bigint"),
                              Params(instance_id)));
  return PgFirstRow(r, ReadTombstone<PgRow>);
}

PgStatement PgTombstoneOfKeyStatement(const std::string& tenant, const std::string& key) {
  static const std::string kSelect = absl::StrCat(
      "SELECT ", kTombstoneColumns, " FROM tombstones WHERE tenant = $1 AND business_key = $2");
  return {&kSelect, Params(tenant, key)};
}

absl::StatusOr<std::optional<TombstoneRecord>> PgTombstoneOfKey(PgConnection& c,
                                                                const std::string& tenant,
                                                                const std::string& key) {
  WS_ASSIGN_OR_RETURN(PgResult r, c.Query(PgTombstoneOfKeyStatement(tenant, key)));
  return PgFirstRow(r, ReadTombstone<PgRow>);
}

absl::StatusOr<std::optional<InboxEntry>> PgInboxEntry(PgConnection& c, const std::string& tenant,
                                                       const std::string& source,
                                                       const std::string& id) {
  WS_ASSIGN_OR_RETURN(PgResult r, c.Query("SELECT data_hash, COALESCE(instance_id, 0), "
                                          "received_at FROM inbox WHERE tenant = $1 AND source = "
                                          "$2 AND event_id = $3",
                                          Params(tenant, source, id)));
  return PgFirstRow(r, [](const PgRow& row) {
    return InboxEntry{row.Text(0), row.Int(1), row.Int(2)};
  });
}

PgStatement PgInsertEventStatement(const EventRecord& e, int64_t instance_id, Millis now) {
  static const std::string kInsert =
      "INSERT INTO outbox (event_id, instance_id, tenant, type, payload, created_at) "
      "VALUES ($1, $2::bigint, $3, $4, $5, $6::bigint)";
  return {&kInsert, Params(e.event_id, instance_id, e.tenant, e.type, e.payload_json, now)};
}

absl::Status PgInsertEvent(PgConnection& c, const EventRecord& e, int64_t instance_id, Millis now) {
  return c.Query(PgInsertEventStatement(e, instance_id, now)).status();
}

PgStatement PgInsertAlertStatement(const AlertRecord& a, int64_t instance_id, Millis now) {
  static const std::string kInsert = absl::StrCat(
      "INSERT INTO alerts (instance_id, tenant, step_name, kind, state, message, created_at, "
      "updated_at) VALUES ($1::bigint, $2, $3, $4::smallint, ",
      SqlValue(AlertState::kOpen), ", $5, $6::bigint, $6::bigint) RETURNING id");
  return {&kInsert,
          Params(instance_id, a.tenant, a.step, static_cast<int64_t>(a.kind), a.message, now)};
}

absl::StatusOr<int64_t> PgInsertAlert(PgConnection& c, const AlertRecord& a, int64_t instance_id,
                                      Millis now) {
  WS_ASSIGN_OR_RETURN(PgResult r, c.Query(PgInsertAlertStatement(a, instance_id, now)));
  return r.Int(0, 0);
}

PgStatement PgInsertAuditStatement(const AuditRecord& a, int64_t instance_id, Millis at) {
  static const std::string kInsert =
      "INSERT INTO audit_log (at, actor, tenant, instance_id, action, reason, detail) "
      "VALUES ($1::bigint, $2, $3, $4::bigint, $5, $6, $7)";
  return {&kInsert, Params(at, a.actor, a.tenant, instance_id, a.action, a.reason,
                           a.detail_json.empty() ? "{}" : a.detail_json)};
}

absl::Status PgInsertAudit(PgConnection& c, const AuditRecord& a, int64_t instance_id, Millis at) {
  return c.Query(PgInsertAuditStatement(a, instance_id, at)).status();
}

absl::Status PgAddToCounter(PgConnection& c, const std::string& name, int64_t delta) {
  return c
      .Query("UPDATE counters SET value = value + $1::bigint WHERE name = $2", Params(delta, name))
      .status();
}

PgStatement PgSignalWorkStatement() {
  static const std::string kNotify = "SELECT pg_notify('waystone_work', '')";
  return {&kNotify, {}};
}

absl::Status PgSignalWork(PgConnection& c) { return c.Query(PgSignalWorkStatement()).status(); }

absl::StatusOr<std::vector<std::string>> PgLeaseOwners(PgConnection& c, const char* table,
                                                       const std::vector<std::string>& rows,
                                                       Millis now) {
  WS_ASSIGN_OR_RETURN(PgResult r, c.Query(SqlLeaseOwners(table, rows, "$1::bigint"), Params(now)));
  return PgRows(r, ReadText0<PgRow>);
}

absl::Status PgExpireLeases(PgConnection& c, const char* table, const std::string& owner) {
  return c
      .Query(absl::StrCat("UPDATE ", table,
                          " SET lease_expires_at = 0 WHERE lease_owner = $1 AND "
                          "lease_expires_at > 0"),
             Params(owner))
      .status();
}

}  // namespace waystone
