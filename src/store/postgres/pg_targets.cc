// PostgresStore: the shared control of protected targets (TargetStore). Each
// admission locks the target's row (SELECT ... FOR UPDATE), so the workers of every
// process take their slots and permits one at a time.

#include "absl/strings/str_cat.h"
#include "store/columns.h"
#include "store/postgres/pg_rows.h"
#include "store/postgres/pg_store.h"
#include "store/sql_values.h"

namespace waystone {
namespace {

// Locks the target's row, created when absent, and counts its unexpired permits
// (the expired ones removed: their workers died holding them).
absl::StatusOr<TargetControl> PgLockedControl(PgConnection& c, const std::string& tenant,
                                              const std::string& target, Millis now) {
  WS_RETURN_IF_ERROR(c.Query("INSERT INTO target_controls (tenant, target) VALUES ($1, $2) "
                             "ON CONFLICT DO NOTHING",
                             Params(tenant, target))
                         .status());
  WS_ASSIGN_OR_RETURN(PgResult locked,
                      c.Query(absl::StrCat("SELECT ", kTargetControlColumns,
                                           ", 0 FROM target_controls WHERE tenant = $1 AND "
                                           "target = $2 FOR UPDATE"),
                              Params(tenant, target)));
  std::optional<TargetControl> control = PgFirstRow(locked, ReadCountedTargetControl<PgRow>);
  if (!control) return absl::InternalError("target control row vanished");
  WS_RETURN_IF_ERROR(c.Query("DELETE FROM target_calls WHERE tenant = $1 AND target = $2 AND "
                             "expires_at <= $3::bigint",
                             Params(tenant, target, now))
                         .status());
  WS_ASSIGN_OR_RETURN(PgResult counted,
                      c.Query("SELECT count(*) FROM target_calls WHERE tenant = $1 AND "
                              "target = $2",
                              Params(tenant, target)));
  control->calls = static_cast<int>(counted.Int(0, 0));
  return *control;
}

absl::Status PgWriteControl(PgConnection& c, const TargetControl& t) {
  return c
      .Query(
          "UPDATE target_controls SET paused = $3::integer, paused_by = $4, pause_reason = $5, "
          "paused_at = $6::bigint, next_slot_us = $7::bigint, failures = $8::integer, "
          "open_until = $9::bigint, probe_until = $10::bigint, updated_at = $11::bigint "
          "WHERE tenant = $1 AND target = $2",
          Params(t.tenant, t.target, t.paused ? 1 : 0, t.paused_by, t.pause_reason, t.paused_at,
                 t.next_slot_us, t.failures, t.open_until, t.probe_until, t.updated_at))
      .status();
}

}  // namespace

absl::StatusOr<Admission> PostgresStore::AdmitTargetCall(const TargetCallAsk& ask) {
  if (!ask.limits.Any()) {  // only a pause can stop it: a read, no permit
    WS_ASSIGN_OR_RETURN(Lent c, Acquire());
    WS_ASSIGN_OR_RETURN(PgResult r,
                        c->Query(absl::StrCat("SELECT ", kTargetControlColumns,
                                              " FROM target_controls WHERE tenant = $1 AND "
                                              "target = $2"),
                                 Params(ask.tenant, ask.target)));
    TargetControl unlimited =
        PgFirstRow(r, ReadTargetControl<PgRow>).value_or(TargetControl{ask.tenant, ask.target});
    return Admit(unlimited, ask.limits, ask.now, ask.horizon, ask.call_lease);
  }
  Admission admission;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(TargetControl control, PgLockedControl(c, ask.tenant, ask.target, ask.now));
    admission = Admit(control, ask.limits, ask.now, ask.horizon, ask.call_lease);
    if (!admission.admitted) return absl::OkStatus();
    WS_RETURN_IF_ERROR(PgWriteControl(c, control));
    return c
        .Query(
            "INSERT INTO target_calls (tenant, target, permit, expires_at) VALUES ($1, $2, "
            "$3, $4::bigint)",
            Params(ask.tenant, ask.target, ask.permit, ask.now + ask.call_lease))
        .status();
  });
  if (!status.ok()) return status;
  return admission;
}

absl::StatusOr<Millis> PostgresStore::RetakeRateSlot(const TargetCallAsk& ask) {
  Millis send_at = ask.now;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(TargetControl control, PgLockedControl(c, ask.tenant, ask.target, ask.now));
    send_at = RetakeSlot(control, ask.limits, ask.now);
    return PgWriteControl(c, control);
  });
  if (!status.ok()) return status;
  return send_at;
}

absl::Status PostgresStore::SettleTargetCall(const TargetCallSettle& settle) {
  // The row first, as every writer of a target takes it: no two wait on each other.
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(TargetControl control,
                        PgLockedControl(c, settle.tenant, settle.target, settle.now));
    WS_RETURN_IF_ERROR(c.Query("DELETE FROM target_calls WHERE tenant = $1 AND target = $2 AND "
                               "permit = $3",
                               Params(settle.tenant, settle.target, settle.permit))
                           .status());
    if (settle.limits.breaker_failures <= 0) return absl::OkStatus();
    Settle(control, settle.limits, settle.probe, settle.health, settle.now);
    return PgWriteControl(c, control);
  });
}

absl::StatusOr<TargetControl> PostgresStore::PauseTarget(const std::string& tenant,
                                                         const std::string& target, bool pause,
                                                         const AuditRecord& audit) {
  TargetControl control;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(control, PgLockedControl(c, tenant, target, audit.at));
    WS_RETURN_IF_ERROR(ChangePause(control, pause, audit.actor, audit.reason, audit.at));
    WS_RETURN_IF_ERROR(PgWriteControl(c, control));
    WS_RETURN_IF_ERROR(PgInsertAudit(c, audit, 0, audit.at));
    if (pause) return absl::OkStatus();
    // Those waiting for it go on now, not at their next look.
    static const std::string kWake =
        absl::StrCat("UPDATE instances SET next_run_at = $1::bigint WHERE tenant = $2 AND state = ",
                     SqlValue(InstanceState::kRunning),
                     " AND next_run_at > $1::bigint AND status_reason LIKE $3 ESCAPE '\\'");
    return c.Query(kWake, Params(audit.at, tenant, PausedReasonPattern(target))).status();
  });
  if (!status.ok()) return status;
  return control;
}

absl::StatusOr<std::vector<TargetControl>> PostgresStore::ListTargetControls(
    const std::string& tenant, Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query(absl::StrCat("SELECT ", kTargetControlColumns,
                            ", (SELECT count(*) FROM target_calls c WHERE c.tenant = t.tenant AND "
                            "c.target = t.target AND c.expires_at > $2::bigint) FROM "
                            "target_controls t WHERE $1 = '' OR tenant = $1 ORDER BY tenant, "
                            "target"),
               Params(tenant, now)));
  return PgRows(r, ReadCountedTargetControl<PgRow>);
}

}  // namespace waystone
