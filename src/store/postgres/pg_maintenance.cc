// PostgresStore: garbage collection, the summary and counters (MaintenanceStore).
// The order of a gc is CollectGarbageWith's; this file holds its SQL.

#include "absl/strings/str_cat.h"
#include "store/gc_order.h"
#include "store/postgres/pg_rows.h"
#include "store/sql_values.h"

namespace waystone {
namespace {

class PgGcSql final : public GcSql {
 public:
  explicit PgGcSql(PgConnection& c) : c_(c) {}

  absl::Status PickCollectable(Millis finished_before) override {
    static const std::string kPick = absl::StrCat(
        "INSERT INTO gc_ids SELECT id FROM instances i WHERE state IN ", SqlFinishedStates(),
        " AND updated_at < $1::bigint AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE "
        "d.instance_id = i.id AND d.state = ",
        SqlValue(DeliveryState::kPending), ") FOR UPDATE SKIP LOCKED");
    WS_RETURN_IF_ERROR(
        c_.Exec("CREATE TEMP TABLE IF NOT EXISTS gc_ids (id BIGINT PRIMARY KEY) "
                "ON COMMIT DELETE ROWS"));
    return c_.Query(kPick, Params(finished_before)).status();
  }
  absl::StatusOr<GcReport> CountGarbage(Millis now, Millis protect_before) override {
    WS_ASSIGN_OR_RETURN(
        PgResult counts,
        c_.Query("SELECT (SELECT COUNT(*) FROM gc_ids), (SELECT COUNT(*) FROM deliveries WHERE "
                 "instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM outbox WHERE "
                 "instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM steps WHERE "
                 "instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM alerts WHERE "
                 "instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM "
                 "idempotency_keys WHERE expires_at < $1::bigint), (SELECT COUNT(*) FROM inbox "
                 "WHERE received_at < $2::bigint AND (instance_id IS NULL OR instance_id IN "
                 "(SELECT id FROM gc_ids) OR NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = "
                 "inbox.instance_id))), (SELECT COUNT(*) FROM tombstones WHERE collected_at < "
                 "$2::bigint)",
                 Params(now, protect_before)));
    GcReport report;
    report.instances = counts.Int(0, 0);
    report.deliveries = counts.Int(0, 1);
    report.events = counts.Int(0, 2);
    report.steps = counts.Int(0, 3);
    report.alerts = counts.Int(0, 4);
    report.idempotency_keys = counts.Int(0, 5);
    report.inbox_claims = counts.Int(0, 6);
    report.tombstones = counts.Int(0, 7);
    return report;
  }
  absl::Status DeleteTombstonesBefore(Millis protect_before) override {
    return Run("DELETE FROM tombstones WHERE collected_at < $1::bigint", protect_before);
  }
  absl::Status BuryPicked(Millis now) override {
    return Run(
        "INSERT INTO tombstones SELECT tenant, business_key, workflow, input_hash, state, "
        "COALESCE((SELECT json_object_agg(s.name, s.external_id)::text FROM steps s WHERE "
        "s.instance_id = i.id AND s.external_id <> ''), '{}'), id, updated_at, $1::bigint "
        "FROM instances i WHERE id IN (SELECT id FROM gc_ids) ON CONFLICT (tenant, "
        "business_key) DO UPDATE SET workflow = excluded.workflow, input_hash = "
        "excluded.input_hash, final_state = excluded.final_state, external_ids = "
        "excluded.external_ids, instance_id = excluded.instance_id, finished_at = "
        "excluded.finished_at, collected_at = excluded.collected_at",
        now);
  }
  absl::Status Exec(std::string_view sql) override { return c_.Exec(std::string(sql)); }
  absl::Status DeleteInboxClaimsBefore(Millis protect_before) override {
    return Run(
        "DELETE FROM inbox WHERE received_at < $1::bigint AND (instance_id IS NULL OR NOT "
        "EXISTS (SELECT 1 FROM instances i WHERE i.id = inbox.instance_id))",
        protect_before);
  }
  absl::Status DeleteIdempotencyKeysBefore(Millis now) override {
    return Run("DELETE FROM idempotency_keys WHERE expires_at < $1::bigint", now);
  }
  absl::Status DeleteApiRequestsBefore(Millis now) override {
    return Run("DELETE FROM api_requests WHERE expires_at < $1::bigint", now);
  }

 private:
  absl::Status Run(const std::string& sql, int64_t value) {
    return c_.Query(sql, Params(value)).status();
  }
  PgConnection& c_;
};

}  // namespace

absl::StatusOr<GcReport> PostgresStore::CollectGarbage(Millis finished_before, Millis now,
                                                       Millis protect_before, bool dry_run) {
  GcReport report;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    PgGcSql sql(c);
    WS_ASSIGN_OR_RETURN(report,
                        CollectGarbageWith(sql, finished_before, now, protect_before, dry_run));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return report;
}

absl::StatusOr<StoreSummary> PostgresStore::Summary() {
  static const std::string kSteps = absl::StrCat(
      "SELECT COALESCE(SUM(GREATEST(attempts - 1, 0)), 0), COALESCE(SUM(unknowns), 0), COUNT(*) "
      "FILTER (WHERE resolution = ",
      SqlValue(Resolution::kLookupFound),
      "), COUNT(*) FILTER (WHERE resolution = ", SqlValue(Resolution::kResubmitted),
      "), COUNT(*) FILTER (WHERE state = ", SqlValue(StepState::kCompensated),
      "), (SELECT COUNT(*) FROM alerts WHERE state = ", SqlValue(AlertState::kOpen),
      "), (SELECT COUNT(*) FROM outbox), COALESCE(SUM(attempts), 0), COUNT(*) FILTER (WHERE "
      "resolution = ",
      SqlValue(Resolution::kOperator),
      "), COALESCE(SUM(compensation_attempts), 0), COUNT(*) FILTER (WHERE state = ",
      SqlValue(StepState::kCompensationFailed), "), (SELECT value FROM counters WHERE name = '",
      kCounterLeaseTakeovers, "'), (SELECT value FROM counters WHERE name = '",
      kCounterInboxDuplicates, "') FROM steps");
  static const std::string kClasses =
      absl::StrCat("SELECT error_class, COUNT(*) FROM steps WHERE error_class <> ",
                   SqlValue(ErrorClass::kNone), " GROUP BY error_class ORDER BY error_class");
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  StoreSummary summary;
  WS_ASSIGN_OR_RETURN(
      PgResult by_state,
      c->Query("SELECT state, COUNT(*) FROM instances GROUP BY state ORDER BY state"));
  summary.instances_by_state = PgRows(by_state, ReadCountOf<InstanceState, PgRow>);
  WS_ASSIGN_OR_RETURN(PgResult steps, c->Query(kSteps));
  ReadSummaryCounts(PgRow(steps, 0), &summary);
  WS_ASSIGN_OR_RETURN(PgResult classes, c->Query(kClasses));
  summary.steps_by_error_class = PgRows(classes, ReadCountOf<ErrorClass, PgRow>);
  WS_ASSIGN_OR_RETURN(PgResult states,
                      c->Query("SELECT state, COUNT(*) FROM steps GROUP BY state ORDER BY state"));
  summary.steps_by_state = PgRows(states, ReadCountOf<StepState, PgRow>);
  return summary;
}

absl::Status PostgresStore::AddToCounter(const std::string& name, int64_t delta) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return PgAddToCounter(*c, name, delta);
}

}  // namespace waystone
