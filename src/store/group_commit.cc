#include "store/group_commit.h"

#include <algorithm>

#include "base/status_macros.h"
#include "store/business_statement.h"
#include "store/business_work.h"
#include "store/claims.h"

namespace waystone {

absl::Status CheckIdempotencyKey(const IdempotencyClaim& claim,
                                 const std::optional<StoredIdempotencyKey>& stored, Millis now) {
  if (!stored || stored->expires_at <= now) return absl::OkStatus();
  if (claim.exclusive && stored->owner_gave_up) return absl::OkStatus();
  const bool own = stored->instance_id == claim.instance_id && stored->step == claim.step;
  if (claim.exclusive && stored->request_hash.empty()) {  // reserved, not yet sent
    if (own) return absl::OkStatus();
    return DeliveryOwnedError("delivery '" + claim.key + "' belongs to step '" + stored->step +
                              "' of another instance");
  }
  if (stored->request_hash == claim.request_hash) {
    if (claim.exclusive &&
        (stored->instance_id != claim.instance_id || stored->step != claim.step)) {
      return DeliveryOwnedError("delivery '" + claim.key + "' belongs to step '" + stored->step +
                                "' of another instance");
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "idempotency key '" + claim.key + "' was used for request hash " +
      stored->request_hash.substr(0, 16) + "; this request has hash " +
      claim.request_hash.substr(0, 16) + " (the request changed under the same key)");
}

bool TakesSavepoint(const Change& c) {
  return c.inbox.has_value() || c.take.has_value() || c.idempotency.has_value() ||
         !c.statements.empty() || c.work != nullptr;
}

bool UndoesOnlyItself(const absl::Status& applied, const Change& change) {
  return absl::IsAborted(applied) || absl::IsFailedPrecondition(applied) ||
         (IsStatementFailure(applied) && (!change.statements.empty() || change.work)) ||
         (absl::IsAlreadyExists(applied) && change.inbox.has_value()) || IsDeliveryOwned(applied);
}

namespace {

// The statements of a code workflow's transaction, run on the change's own
// connection. After the first failure nothing more runs (PostgreSQL could not go
// on in the transaction anyway): the work fails with it, whatever it returns.
class WorkStatements final : public StatementRunner {
 public:
  explicit WorkStatements(ChangeSql& sql) : sql_(sql) {}
  absl::StatusOr<std::string> Run(const BusinessStatement& statement) override {
    if (!failed_.ok()) return failed_;
    auto rows = sql_.RunStatement(statement);
    if (!rows.ok()) failed_ = rows.status();
    return rows;
  }
  const absl::Status& failed() const { return failed_; }

 private:
  ChangeSql& sql_;
  absl::Status failed_;
};

// Runs the work: the database's trouble fails the batch (Unavailable); the
// statement's refusal, or an error of the work's own, fails its change alone.
absl::StatusOr<BusinessWorkResult> RunWork(ChangeSql& sql, const BusinessWork& work) {
  WorkStatements statements(sql);
  auto done = work.Run(statements);
  if (!statements.failed().ok()) return statements.failed();
  if (done.ok()) return done;
  if (IsStatementFailure(done.status())) return done.status();
  return StatementFailure(std::string(done.status().message()));
}

}  // namespace

absl::Status ApplyChange(ChangeSql& sql, const Change& c, int attempts_per_step) {
  const int64_t id = c.lease.instance_id;
  WS_ASSIGN_OR_RETURN(bool held, sql.Fence(c));
  if (!held) {
    return LeaseLostError("lease lost on instance " + std::to_string(id) + " (epoch " +
                          std::to_string(c.lease.epoch) + ")");
  }
  if (c.lease_expires_at == 0 && c.next_run_at && *c.next_run_at <= c.now &&
      (!c.state || *c.state == InstanceState::kRunning ||
       *c.state == InstanceState::kCompensating)) {
    // Released to run now (a drain, an operator): another worker may take it at once.
    WS_RETURN_IF_ERROR(sql.SignalWork());
  }
  if (c.inbox) {
    WS_ASSIGN_OR_RETURN(bool claimed, sql.ClaimInbox(*c.inbox, id, c.now));
    if (!claimed) {
      return absl::AlreadyExistsError("event " + c.inbox->source + " " + c.inbox->id +
                                      " was received before");
    }
  }
  if (c.keep) WS_RETURN_IF_ERROR(sql.KeepEvent(id, *c.keep));
  if (c.take) {
    WS_ASSIGN_OR_RETURN(bool taken, sql.TakeKeptEvent(id, *c.take, c.now));
    if (!taken) {
      return absl::FailedPreconditionError("kept event " + std::to_string(c.take->seq) +
                                           " of instance " + std::to_string(id) +
                                           " was taken before");
    }
  }
  if (c.input_json) WS_RETURN_IF_ERROR(sql.ReviseInput(id, *c.input_json));
  if (c.resolve_alerts) WS_RETURN_IF_ERROR(sql.ResolveAlerts(id, c.now));
  if (c.idempotency) {
    WS_ASSIGN_OR_RETURN(std::optional<StoredIdempotencyKey> stored,
                        sql.ReadIdempotencyKey(c.idempotency->tenant, c.idempotency->key));
    WS_RETURN_IF_ERROR(CheckIdempotencyKey(*c.idempotency, stored, c.now));
    WS_RETURN_IF_ERROR(sql.PutIdempotencyKey(*c.idempotency, c.now));
  }
  for (const IdempotencyClaim& owed : c.reservations) {
    WS_RETURN_IF_ERROR(sql.ReserveIdempotencyKey(owed, c.now));
  }
  // A sql step's statement: its rows are the result its step row records.
  std::vector<std::pair<int, std::string>> results;
  for (const BusinessStatement& statement : c.statements) {
    WS_ASSIGN_OR_RETURN(std::string result, sql.RunStatement(statement));
    if (statement.records_result) results.emplace_back(statement.step_index, std::move(result));
  }
  std::vector<EventRecord> work_events;
  if (c.work) {
    WS_ASSIGN_OR_RETURN(BusinessWorkResult done, RunWork(sql, *c.work));
    results.emplace_back(c.work->step_index(), std::move(done.result_json));
    work_events = std::move(done.events);
  }
  for (const StepRecord& step : c.added_steps) {
    StepRecord row = step;
    for (auto& [index, result] : results) {
      if (index == step.index) row.response_json = result;
    }
    WS_RETURN_IF_ERROR(sql.InsertStep(id, row));
  }
  for (const StepRecord& step : c.steps) {
    StepRecord with_result;
    const StepRecord* row = &step;
    for (auto& [index, result] : results) {
      if (index != step.index) continue;
      with_result = step;
      with_result.response_json = result;
      row = &with_result;
    }
    const StepRecord& s = *row;
    WS_ASSIGN_OR_RETURN(bool updated, sql.UpdateStep(id, s));
    if (!updated) {
      return absl::InternalError("step " + std::to_string(s.index) + " of instance " +
                                 std::to_string(id) + " does not exist");
    }
  }
  // The store numbers a step's requests: 1, 2, ... in the order they were recorded
  // (only the lease holder writes them, so MAX + 1 does not race).
  for (const AttemptRecord& a : c.attempts) WS_RETURN_IF_ERROR(sql.InsertAttempt(id, a));
  // The history is bounded per step; the newest seq still counts every request.
  std::vector<int> added_to;
  for (const AttemptRecord& a : c.attempts) {
    if (std::find(added_to.begin(), added_to.end(), a.step_index) != added_to.end()) continue;
    added_to.push_back(a.step_index);
    WS_RETURN_IF_ERROR(sql.DropOldAttempts(id, a.step_index, attempts_per_step));
  }
  for (const EventRecord& e : c.events) WS_RETURN_IF_ERROR(sql.InsertEvent(e, id, c.now));
  for (const EventRecord& e : work_events) WS_RETURN_IF_ERROR(sql.InsertEvent(e, id, c.now));
  for (const AlertRecord& a : c.alerts) WS_RETURN_IF_ERROR(sql.InsertAlert(a, id, c.now));
  for (const AuditRecord& a : c.audits) WS_RETURN_IF_ERROR(sql.InsertAudit(a, id, c.now));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::Status>> CommitChanges(ChangeSql& sql,
                                                        const std::vector<Change>& changes,
                                                        int attempts_per_step) {
  auto applied = EachUnderSavepoint<absl::Status>(
      sql, changes,
      [&](const Change& change) { return ApplyChange(sql, change, attempts_per_step); },
      // Without a savepoint, only a lease lost at the fence (before anything was
      // written) undoes only its change: any other failure, PostgreSQL's lock timeout
      // (Aborted too) among them, fails the whole transaction.
      [](const absl::Status& applied, const Change& change) {
        return TakesSavepoint(change) ? UndoesOnlyItself(applied, change) : IsLeaseLost(applied);
      },
      TakesSavepoint);
  // A transaction failed as a whole by an Aborted (a lock timeout) lost no lease: its
  // callers reload and go on, as after any failed transaction.
  if (!applied.ok() && absl::IsAborted(applied.status()) && !IsLeaseLost(applied.status())) {
    return absl::UnavailableError(applied.status().message());
  }
  return applied;
}

}  // namespace waystone
