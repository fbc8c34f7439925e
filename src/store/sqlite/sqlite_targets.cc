// SqliteStore: the shared control of protected targets (TargetStore). BEGIN
// IMMEDIATE serializes every writer of the file, so each admission reads and
// writes the row alone.

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/columns.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {
namespace {

// Reads the target's row, created when absent, with its unexpired permits counted
// (the expired ones removed: their workers died holding them).
absl::StatusOr<TargetControl> SqliteLockedControl(SqliteDb& db, const std::string& tenant,
                                                  const std::string& target, Millis now) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * create,
                      db.Prepare("INSERT OR IGNORE INTO target_controls (tenant, target) "
                                 "VALUES (?1, ?2)"));
  WS_RETURN_IF_ERROR(create->BindAll(tenant, target).Run());
  WS_ASSIGN_OR_RETURN(SqliteStatement * expire,
                      db.Prepare("DELETE FROM target_calls WHERE tenant = ?1 AND target = ?2 "
                                 "AND expires_at <= ?3"));
  WS_RETURN_IF_ERROR(expire->BindAll(tenant, target, now).Run());
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * read,
      db.Prepare(absl::StrCat("SELECT ", kTargetControlColumns,
                              ", (SELECT count(*) FROM target_calls c WHERE "
                              "c.tenant = t.tenant AND c.target = t.target) FROM "
                              "target_controls t WHERE tenant = ?1 AND target = ?2")));
  read->BindAll(tenant, target);
  WS_ASSIGN_OR_RETURN(std::optional<TargetControl> control,
                      FirstRow(read, ReadCountedTargetControl<SqliteStatement>));
  if (!control) return absl::InternalError("target control row vanished");
  return *control;
}

absl::Status SqliteWriteControl(SqliteDb& db, const TargetControl& c) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * write,
                      db.Prepare("UPDATE target_controls SET paused = ?3, paused_by = ?4, "
                                 "pause_reason = ?5, paused_at = ?6, next_slot_us = ?7, "
                                 "failures = ?8, open_until = ?9, probe_until = ?10, "
                                 "updated_at = ?11 WHERE tenant = ?1 AND target = ?2"));
  return write
      ->BindAll(c.tenant, c.target, c.paused ? 1 : 0, c.paused_by, c.pause_reason, c.paused_at,
                c.next_slot_us, c.failures, c.open_until, c.probe_until, c.updated_at)
      .Run();
}

}  // namespace

absl::StatusOr<Admission> SqliteStore::AdmitTargetCall(const TargetCallAsk& ask) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;      // the lambdas below run with the lock held
  if (!ask.limits.Any()) {  // only a pause can stop it: a read, no permit
    WS_ASSIGN_OR_RETURN(SqliteStatement * read,
                        db.Prepare(absl::StrCat("SELECT ", kTargetControlColumns,
                                                " FROM target_controls WHERE tenant = ?1 AND "
                                                "target = ?2")));
    read->BindAll(ask.tenant, ask.target);
    WS_ASSIGN_OR_RETURN(std::optional<TargetControl> control,
                        FirstRow(read, ReadTargetControl<SqliteStatement>));
    TargetControl unlimited = control.value_or(TargetControl{ask.tenant, ask.target});
    return Admit(unlimited, ask.limits, ask.now, ask.horizon, ask.call_lease);
  }
  return InWriteTransactionFor(db, [&]() -> absl::StatusOr<Admission> {
    WS_ASSIGN_OR_RETURN(TargetControl control,
                        SqliteLockedControl(db, ask.tenant, ask.target, ask.now));
    Admission admission = Admit(control, ask.limits, ask.now, ask.horizon, ask.call_lease);
    if (!admission.admitted) return admission;
    WS_RETURN_IF_ERROR(SqliteWriteControl(db, control));
    WS_ASSIGN_OR_RETURN(SqliteStatement * permit,
                        db.Prepare("INSERT INTO target_calls (tenant, target, permit, expires_at) "
                                   "VALUES (?1, ?2, ?3, ?4)"));
    WS_RETURN_IF_ERROR(
        permit->BindAll(ask.tenant, ask.target, ask.permit, ask.now + ask.call_lease).Run());
    return admission;
  });
}

absl::StatusOr<Millis> SqliteStore::RetakeRateSlot(const TargetCallAsk& ask) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;
  return InWriteTransactionFor(db, [&]() -> absl::StatusOr<Millis> {
    WS_ASSIGN_OR_RETURN(TargetControl control,
                        SqliteLockedControl(db, ask.tenant, ask.target, ask.now));
    const Millis send_at = RetakeSlot(control, ask.limits, ask.now);
    WS_RETURN_IF_ERROR(SqliteWriteControl(db, control));
    return send_at;
  });
}

absl::Status SqliteStore::SettleTargetCall(const TargetCallSettle& settle) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;
  return InWriteTransaction(db, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(TargetControl control,
                        SqliteLockedControl(db, settle.tenant, settle.target, settle.now));
    WS_ASSIGN_OR_RETURN(SqliteStatement * drop,
                        db.Prepare("DELETE FROM target_calls WHERE tenant = ?1 AND target = ?2 "
                                   "AND permit = ?3"));
    WS_RETURN_IF_ERROR(drop->BindAll(settle.tenant, settle.target, settle.permit).Run());
    if (settle.limits.breaker_failures <= 0) return absl::OkStatus();
    Settle(control, settle.limits, settle.probe, settle.health, settle.now);
    return SqliteWriteControl(db, control);
  });
}

absl::StatusOr<TargetControl> SqliteStore::PauseTarget(const std::string& tenant,
                                                       const std::string& target, bool pause,
                                                       const AuditRecord& audit) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;
  return InWriteTransactionFor(db, [&]() -> absl::StatusOr<TargetControl> {
    WS_ASSIGN_OR_RETURN(TargetControl control, SqliteLockedControl(db, tenant, target, audit.at));
    WS_RETURN_IF_ERROR(ChangePause(control, pause, audit.actor, audit.reason, audit.at));
    WS_RETURN_IF_ERROR(SqliteWriteControl(db, control));
    WS_RETURN_IF_ERROR(SqliteInsertAudit(db, audit, 0, audit.at));
    if (!pause) {  // those waiting for it go on now, not at their next look
      static const std::string kWake =
          absl::StrCat("UPDATE instances SET next_run_at = ?1 WHERE tenant = ?2 AND state = ",
                       SqlValue(InstanceState::kRunning),
                       " AND next_run_at > ?1 AND status_reason LIKE ?3 ESCAPE '\\'");
      WS_ASSIGN_OR_RETURN(SqliteStatement * wake, db.Prepare(kWake));
      WS_RETURN_IF_ERROR(wake->BindAll(audit.at, tenant, PausedReasonPattern(target)).Run());
    }
    return control;
  });
}

absl::StatusOr<std::vector<TargetControl>> SqliteStore::ListTargetControls(
    const std::string& tenant, Millis now) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat(
                          "SELECT ", kTargetControlColumns,
                          ", (SELECT count(*) FROM target_calls c WHERE c.tenant = t.tenant AND "
                          "c.target = t.target AND c.expires_at > ?2) FROM target_controls t "
                          "WHERE ?1 = '' OR tenant = ?1 ORDER BY tenant, target")));
  s->BindAll(tenant, now);
  return CollectRows(s, ReadCountedTargetControl<SqliteStatement>);
}

}  // namespace waystone
