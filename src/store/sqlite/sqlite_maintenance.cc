// SqliteStore: garbage collection, the summary and counters (MaintenanceStore).
// The order of a gc is CollectGarbageWith's; this file holds its SQL.

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/gc_order.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {
namespace {

class SqliteGcSql final : public GcSql {
 public:
  explicit SqliteGcSql(SqliteDb& db) : db_(db) {}

  absl::Status PickCollectable(Millis finished_before) override {
    static const std::string kPick = absl::StrCat(
        "INSERT INTO gc_ids SELECT id FROM instances i WHERE state IN ", SqlFinishedStates(),
        " AND updated_at < ? AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.instance_id = "
        "i.id AND d.state = ",
        SqlValue(DeliveryState::kPending), ")");
    WS_RETURN_IF_ERROR(db_.Exec("CREATE TEMP TABLE IF NOT EXISTS gc_ids (id INTEGER PRIMARY KEY)"));
    WS_RETURN_IF_ERROR(db_.Exec("DELETE FROM gc_ids"));
    WS_ASSIGN_OR_RETURN(SqliteStatement * pick, db_.Prepare(kPick));
    return pick->BindAll(finished_before).Run();
  }
  absl::StatusOr<GcReport> CountGarbage(Millis now, Millis protect_before) override {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * s,
        db_.Prepare("SELECT (SELECT COUNT(*) FROM gc_ids), (SELECT COUNT(*) FROM deliveries "
                    "WHERE instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM outbox "
                    "WHERE instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM steps "
                    "WHERE instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM alerts "
                    "WHERE instance_id IN (SELECT id FROM gc_ids)), (SELECT COUNT(*) FROM "
                    "idempotency_keys WHERE expires_at < ?1), (SELECT COUNT(*) FROM inbox WHERE "
                    "received_at < ?2 AND (instance_id IS NULL OR instance_id IN (SELECT id FROM "
                    "gc_ids) OR instance_id NOT IN (SELECT id FROM instances))), (SELECT COUNT(*) "
                    "FROM tombstones WHERE collected_at < ?2)"));
    s->BindAll(now, protect_before);
    WS_ASSIGN_OR_RETURN(std::optional<GcReport> report, FirstRow(s, [](const SqliteStatement& r) {
                          GcReport g;
                          g.instances = r.Int(0);
                          g.deliveries = r.Int(1);
                          g.events = r.Int(2);
                          g.steps = r.Int(3);
                          g.alerts = r.Int(4);
                          g.idempotency_keys = r.Int(5);
                          g.inbox_claims = r.Int(6);
                          g.tombstones = r.Int(7);
                          return g;
                        }));
    return report.value_or(GcReport{});
  }
  absl::Status DeleteTombstonesBefore(Millis protect_before) override {
    return Run("DELETE FROM tombstones WHERE collected_at < ?", protect_before);
  }
  absl::Status BuryPicked(Millis now) override {
    return Run(
        "INSERT OR REPLACE INTO tombstones SELECT tenant, business_key, workflow, "
        "input_hash, state, COALESCE((SELECT json_group_object(s.name, s.external_id) "
        "FROM steps s WHERE s.instance_id = i.id AND s.external_id <> ''), '{}'), id, "
        "updated_at, ? FROM instances i WHERE id IN (SELECT id FROM gc_ids)",
        now);
  }
  absl::Status Exec(std::string_view sql) override { return db_.Exec(sql); }
  absl::Status DeleteInboxClaimsBefore(Millis protect_before) override {
    return Run(
        "DELETE FROM inbox WHERE received_at < ? AND (instance_id IS NULL OR instance_id "
        "NOT IN (SELECT id FROM instances))",
        protect_before);
  }
  absl::Status DeleteIdempotencyKeysBefore(Millis now) override {
    return Run("DELETE FROM idempotency_keys WHERE expires_at < ?", now);
  }
  absl::Status DeleteApiRequestsBefore(Millis now) override {
    return Run("DELETE FROM api_requests WHERE expires_at < ?", now);
  }

 private:
  absl::Status Run(const std::string& sql, int64_t value) {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_.Prepare(sql));
    return s->BindAll(value).Run();
  }
  SqliteDb& db_;
};

}  // namespace

absl::StatusOr<GcReport> SqliteStore::CollectGarbage(Millis finished_before, Millis now,
                                                     Millis protect_before, bool dry_run) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  GcReport report;
  absl::Status status = InWriteTransaction(db, [&]() -> absl::Status {
    SqliteGcSql sql(db);
    WS_ASSIGN_OR_RETURN(report,
                        CollectGarbageWith(sql, finished_before, now, protect_before, dry_run));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return report;
}

absl::StatusOr<StoreSummary> SqliteStore::Summary() {
  static const std::string kSteps = absl::StrCat(
      "SELECT COALESCE(SUM(MAX(attempts - 1, 0)), 0), COALESCE(SUM(unknowns), 0), "
      "COALESCE(SUM(resolution = ",
      SqlValue(Resolution::kLookupFound),
      "), 0), COALESCE(SUM(resolution = ", SqlValue(Resolution::kResubmitted),
      "), 0), COALESCE(SUM(state = ", SqlValue(StepState::kCompensated),
      "), 0), (SELECT COUNT(*) FROM alerts WHERE state = ", SqlValue(AlertState::kOpen),
      "), (SELECT COUNT(*) FROM outbox), COALESCE(SUM(attempts), 0), COALESCE(SUM(resolution = ",
      SqlValue(Resolution::kOperator),
      "), 0), COALESCE(SUM(compensation_attempts), 0), "
      "COALESCE(SUM(state = ",
      SqlValue(StepState::kCompensationFailed), "), 0), (SELECT value FROM counters WHERE name = '",
      kCounterLeaseTakeovers, "'), (SELECT value FROM counters WHERE name = '",
      kCounterInboxDuplicates, "') FROM steps");
  static const std::string kClasses =
      absl::StrCat("SELECT error_class, COUNT(*) FROM steps WHERE error_class <> ",
                   SqlValue(ErrorClass::kNone), " GROUP BY error_class ORDER BY error_class");
  // Scans of whole tables: on the reporting connection, not the writer's, in one read
  // transaction so that the counts are of one moment.
  return Reporting([&](SqliteDb& db) -> absl::StatusOr<StoreSummary> {
    // (In memory it is the writer's connection, whose lock keeps the moment still.)
    const bool snapshot = !db.InMemory();
    if (snapshot) WS_RETURN_IF_ERROR(db.Exec("BEGIN"));
    absl::Cleanup end = [&db, snapshot] {
      // Never left open: an open read would pin this old moment for every later report.
      if (snapshot && !db.Exec("COMMIT").ok()) (void)db.Exec("ROLLBACK");
    };
    StoreSummary summary;
    WS_ASSIGN_OR_RETURN(SqliteStatement * by_state,
                        db.Prepare("SELECT state, COUNT(*) FROM instances GROUP BY state "
                                   "ORDER BY state"));
    WS_ASSIGN_OR_RETURN(summary.instances_by_state,
                        CollectRows(by_state, ReadCountOf<InstanceState, SqliteStatement>));
    WS_ASSIGN_OR_RETURN(SqliteStatement * steps, db.Prepare(kSteps));
    WS_ASSIGN_OR_RETURN(bool row, steps->Step());
    if (row) ReadSummaryCounts(*steps, &summary);
    steps->Reset();
    WS_ASSIGN_OR_RETURN(SqliteStatement * classes, db.Prepare(kClasses));
    WS_ASSIGN_OR_RETURN(summary.steps_by_error_class,
                        CollectRows(classes, ReadCountOf<ErrorClass, SqliteStatement>));
    WS_ASSIGN_OR_RETURN(SqliteStatement * states,
                        db.Prepare("SELECT state, COUNT(*) FROM steps GROUP BY state ORDER BY "
                                   "state"));
    WS_ASSIGN_OR_RETURN(summary.steps_by_state,
                        CollectRows(states, ReadCountOf<StepState, SqliteStatement>));
    return summary;
  });
}

absl::Status SqliteStore::AddToCounter(const std::string& name, int64_t delta) {
  MutexLock lock(mu_);
  return SqliteAddToCounter(*db_, name, delta);
}

}  // namespace waystone
