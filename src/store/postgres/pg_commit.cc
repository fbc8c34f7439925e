// PostgresStore: the group commit (InstanceStore::Commit). The loop and the order
// of a change are CommitChanges'; this file holds their SQL.

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "store/business_statement.h"
#include "store/claims.h"
#include "store/group_commit.h"
#include "store/postgres/pg_rows.h"
#include "store/sql_values.h"

namespace waystone {
namespace {

std::optional<int64_t> Number(const std::optional<InstanceState>& state) {
  if (!state) return std::nullopt;
  return static_cast<int64_t>(*state);
}

// The statements of a change, the same whether run one at a time or pipelined.
PgStatement FenceStatement(const Change& ch) {
  static const std::string kFence =
      "UPDATE instances SET updated_at = $1::bigint, lease_expires_at = $2::bigint, "
      "lease_owner = CASE WHEN $2::bigint = 0 THEN '' ELSE lease_owner END, "
      "state = COALESCE($3::smallint, state), status_reason = COALESCE($4::text, "
      "status_reason), next_run_at = COALESCE($5::bigint, next_run_at) "
      "WHERE id = $6::bigint AND lease_epoch = $7::bigint AND lease_owner = $8";
  return {&kFence, Params(ch.now, ch.lease_expires_at, Number(ch.state), ch.status_reason,
                          ch.next_run_at, ch.lease.instance_id, ch.lease.epoch, ch.lease.owner)};
}

PgStatement ClaimInboxStatement(const InboxClaim& claim, int64_t instance_id, Millis now) {
  static const std::string kClaim =
      "INSERT INTO inbox (tenant, source, event_id, data_hash, received_at, instance_id) VALUES "
      "($1, $2, $3, $4, $5::bigint, $6::bigint) ON CONFLICT DO NOTHING";
  return {&kClaim, Params(claim.tenant, claim.source, claim.id, claim.data_hash, now, instance_id)};
}

// Change::reservations: inserted where free, expired or given up; else left alone.
PgStatement ReserveKeyStatement(const IdempotencyClaim& claim, Millis now) {
  static const std::string kReserve =
      "INSERT INTO idempotency_keys VALUES ($1, $2, '', $3::bigint, $4, $5::bigint, $6::bigint) "
      "ON CONFLICT (tenant, key) DO UPDATE SET request_hash = '', expires_at = "
      "excluded.expires_at, instance_id = excluded.instance_id, step_name = excluded.step_name "
      "WHERE idempotency_keys.expires_at <= $5::bigint OR EXISTS " +
      std::string(kOwnerGaveUp);
  return {&kReserve,
          Params(claim.tenant, claim.key, claim.instance_id, claim.step, now, claim.expires_at)};
}

PgStatement ResolveAlertsStatement(int64_t instance_id, Millis now) {
  static const std::string kResolve =
      absl::StrCat("UPDATE alerts SET state = ", SqlValue(AlertState::kResolved),
                   ", updated_at = $1::bigint WHERE instance_id = $2::bigint AND state IN ",
                   SqlLiveAlertStates());
  return {&kResolve, Params(now, instance_id)};
}

PgStatement ReviseInputStatement(int64_t instance_id, const std::string& input_json) {
  static const std::string kRevise = "UPDATE instances SET input_json = $1 WHERE id = $2::bigint";
  return {&kRevise, Params(input_json, instance_id)};
}

PgStatement InsertStepStatement(int64_t instance_id, const StepRecord& s) {
  static const std::string kInsert =
      "INSERT INTO steps (instance_id, step_index, name, state, attempts, error_class, "
      "error_message, external_id, response_json, idempotency_key, request_hash, resolution, "
      "unknowns, lookups, compensation_attempts, next_attempt_at, started_at, finished_at, "
      "span_id, unknown_since) VALUES ($1::bigint, $2::integer, $3, $4::smallint, $5::integer, "
      "$6::smallint, $7, $8, $9, $10, $11, $12::smallint, $13::integer, $14::integer, "
      "$15::integer, $16::bigint, $17::bigint, $18::bigint, $19, $20::bigint)";
  return {&kInsert,
          Params(instance_id, s.index, s.name, static_cast<int64_t>(s.state), s.attempts,
                 static_cast<int64_t>(s.error_class), s.error_message, s.external_id,
                 s.response_json, s.idempotency_key, s.request_hash,
                 static_cast<int64_t>(s.resolution), s.unknowns, s.lookups, s.compensation_attempts,
                 s.next_attempt_at, s.started_at, s.finished_at, s.span_id, s.unknown_since)};
}

PgStatement UpdateStepStatement(int64_t instance_id, const StepRecord& s) {
  static const std::string kUpdate =
      "UPDATE steps SET state = $1::smallint, attempts = $2::integer, error_class = "
      "$3::smallint, error_message = $4, external_id = $5, response_json = $6, "
      "idempotency_key = $7, request_hash = $8, resolution = $9::smallint, unknowns = "
      "$10::integer, lookups = $11::integer, compensation_attempts = $12::integer, "
      "next_attempt_at = $13::bigint, started_at = $14::bigint, finished_at = "
      "$15::bigint, span_id = $16, unknown_since = $17::bigint WHERE instance_id = "
      "$18::bigint AND step_index = $19::integer";
  return {&kUpdate,
          Params(static_cast<int64_t>(s.state), s.attempts, static_cast<int64_t>(s.error_class),
                 s.error_message, s.external_id, s.response_json, s.idempotency_key, s.request_hash,
                 static_cast<int64_t>(s.resolution), s.unknowns, s.lookups, s.compensation_attempts,
                 s.next_attempt_at, s.started_at, s.finished_at, s.span_id, s.unknown_since,
                 instance_id, s.index)};
}

// Numbered after the step's last attempt in the same statement, so that attempts
// pipelined one after another number 1, 2, ... as well.
PgStatement InsertAttemptStatement(int64_t instance_id, const AttemptRecord& a) {
  static const std::string kInsert =
      "INSERT INTO attempts (instance_id, step_index, seq, phase, sent, connection, status, "
      "error_class, detail, started_at, finished_at, worker, lease_epoch) SELECT $1::bigint, "
      "$2::integer, COALESCE(MAX(seq), 0) + 1, $3::smallint, $4::boolean, $5::smallint, "
      "$6::integer, $7::smallint, $8, $9::bigint, $10::bigint, $11, $12::bigint FROM attempts "
      "WHERE instance_id = $1::bigint AND step_index = $2::integer";
  return {&kInsert, Params(instance_id, a.step_index, static_cast<int64_t>(a.phase),
                           a.sent ? "true" : "false", static_cast<int64_t>(a.connection), a.status,
                           static_cast<int64_t>(a.error_class), a.detail, a.started_at,
                           a.finished_at, a.worker, a.lease_epoch)};
}

PgStatement DropOldAttemptsStatement(int64_t instance_id, int step_index, int keep) {
  static const std::string kDrop =
      "DELETE FROM attempts WHERE instance_id = $1::bigint AND step_index = $2::integer AND "
      "seq <= (SELECT MAX(seq) FROM attempts WHERE instance_id = $1::bigint AND step_index = "
      "$2::integer) - $3::integer";
  return {&kDrop, Params(instance_id, step_index, keep)};
}

// The parameters of many rows of one statement as one array per parameter (a
// text[] literal each: quoted elements, NULL for a null), for unnest().
PgParams Columns(const std::vector<PgParams>& rows) {
  PgParams columns;
  if (rows.empty()) return columns;
  for (size_t column = 0; column < rows.front().size(); ++column) {
    std::string array = "{";
    for (size_t row = 0; row < rows.size(); ++row) {
      if (row > 0) array += ",";
      const std::optional<std::string>& value = rows[row][column];
      array += value ? QuoteEach({*value}) : "NULL";
    }
    array += "}";
    columns.push_back(std::move(array));
  }
  return columns;
}

// Runs each statement of a change at once (the way a change can fail alone).
// A sql step's statement failed on the server: its own error (SQLSTATE class 22 data,
// 23 integrity, 42 syntax or access, 44 check option, P0 a trigger's RAISE, 57014 its
// time ran out) fails its step; anything else is the database's trouble.
absl::Status Classified(const absl::Status& status) {
  const auto state = status.GetPayload(kPgSqlState);
  const std::string code = state ? std::string(*state) : "";
  const std::string cls = code.substr(0, 2);
  if (cls == "22" || cls == "23" || cls == "42" || cls == "44" || cls == "P0" || code == "57014") {
    return StatementFailure(std::string(status.message()));
  }
  return StatementTrouble(status);
}

absl::Status Trouble(const absl::Status& status) {
  return status.ok() ? status : StatementTrouble(status);
}

class PgChangeSql final : public ChangeSql {
 public:
  explicit PgChangeSql(PgConnection& c) : c_(c) {}

  absl::Status Savepoint() override { return c_.Exec("SAVEPOINT change"); }
  absl::Status RollbackToSavepoint() override { return c_.Exec("ROLLBACK TO SAVEPOINT change"); }
  absl::Status ReleaseSavepoint() override { return c_.Exec("RELEASE SAVEPOINT change"); }

  absl::StatusOr<bool> Fence(const Change& ch) override {
    WS_ASSIGN_OR_RETURN(PgResult fence, c_.Query(FenceStatement(ch)));
    return fence.affected() == 1;
  }
  absl::Status SignalWork() override { return PgSignalWork(c_); }
  absl::StatusOr<bool> ClaimInbox(const InboxClaim& claim, int64_t instance_id,
                                  Millis now) override {
    WS_ASSIGN_OR_RETURN(PgResult r, c_.Query(ClaimInboxStatement(claim, instance_id, now)));
    return r.affected() == 1;
  }
  absl::Status ResolveAlerts(int64_t instance_id, Millis now) override {
    return c_.Query(ResolveAlertsStatement(instance_id, now)).status();
  }
  absl::Status ReviseInput(int64_t instance_id, const std::string& input_json) override {
    return c_.Query(ReviseInputStatement(instance_id, input_json)).status();
  }
  // FOR UPDATE: a concurrent claim of the same key waits for this transaction.
  absl::StatusOr<std::optional<StoredIdempotencyKey>> ReadIdempotencyKey(
      const std::string& tenant, const std::string& key) override {
    WS_ASSIGN_OR_RETURN(
        PgResult r, c_.Query("SELECT request_hash, expires_at, instance_id, step_name, EXISTS " +
                                 std::string(kOwnerGaveUp) +
                                 " FROM idempotency_keys WHERE tenant = $1 AND key = $2 FOR "
                                 "UPDATE OF idempotency_keys",
                             Params(tenant, key)));
    return PgFirstRow(r, [](const PgRow& row) {
      return StoredIdempotencyKey{row.Text(0), row.Int(1), row.Int(2), row.Text(3),
                                  row.Text(4) == "t"};
    });
  }
  // An exclusive claim takes the row only when it is free, expired or its own. The
  // read above locks an existing row; two first claims of one key both find none, and
  // the second INSERT waits for the first to commit and then sees its row here.
  absl::Status PutIdempotencyKey(const IdempotencyClaim& claim, Millis now) override {
    WS_ASSIGN_OR_RETURN(
        PgResult r,
        c_.Query("INSERT INTO idempotency_keys VALUES ($1, $2, $3, $4::bigint, $5, $6::bigint, "
                 "$7::bigint) ON CONFLICT (tenant, key) DO UPDATE SET request_hash = "
                 "excluded.request_hash, expires_at = excluded.expires_at, instance_id = "
                 "excluded.instance_id, step_name = excluded.step_name WHERE NOT $8::boolean "
                 "OR idempotency_keys.expires_at <= $6::bigint OR "
                 "(idempotency_keys.instance_id = $4::bigint AND idempotency_keys.step_name = $5) "
                 "OR EXISTS " +
                     std::string(kOwnerGaveUp),
                 Params(claim.tenant, claim.key, claim.request_hash, claim.instance_id, claim.step,
                        now, claim.expires_at, claim.exclusive ? "true" : "false")));
    if (r.affected() == 0) {
      return DeliveryOwnedError("delivery '" + claim.key + "' belongs to another instance step");
    }
    return absl::OkStatus();
  }
  absl::Status ReserveIdempotencyKey(const IdempotencyClaim& claim, Millis now) override {
    return c_.Query(ReserveKeyStatement(claim, now)).status();
  }
  absl::Status InsertStep(int64_t instance_id, const StepRecord& s) override {
    return c_.Query(InsertStepStatement(instance_id, s)).status();
  }
  // Only the lease holder keeps events for an instance, so MAX + 1 does not race.
  absl::Status KeepEvent(int64_t instance_id, const KeptEvent& e) override {
    return c_
        .Query(
            "INSERT INTO kept_events (instance_id, seq, event_type, source, event_id, "
            "data_json, received_at) VALUES ($1::bigint, (SELECT COALESCE(MAX(seq), 0) "
            "+ 1 FROM kept_events WHERE instance_id = $1::bigint), $2, $3, $4, $5, "
            "$6::bigint)",
            Params(instance_id, e.event_type, e.source, e.event_id, e.data_json, e.received_at))
        .status();
  }
  absl::StatusOr<bool> TakeKeptEvent(int64_t instance_id, const KeptEventTake& take,
                                     Millis now) override {
    WS_ASSIGN_OR_RETURN(
        PgResult taken,
        c_.Query("UPDATE kept_events SET taken_by = $1::integer, taken_at = $2::bigint WHERE "
                 "instance_id = $3::bigint AND seq = $4::bigint AND taken_by IS NULL",
                 Params(take.step_index, now, instance_id, take.seq)));
    return taken.affected() == 1;
  }
  absl::StatusOr<bool> UpdateStep(int64_t instance_id, const StepRecord& s) override {
    WS_ASSIGN_OR_RETURN(PgResult updated, c_.Query(UpdateStepStatement(instance_id, s)));
    return updated.affected() == 1;
  }
  absl::Status InsertAttempt(int64_t instance_id, const AttemptRecord& a) override {
    return c_.Query(InsertAttemptStatement(instance_id, a)).status();
  }
  absl::Status DropOldAttempts(int64_t instance_id, int step_index, int keep) override {
    return c_.Query(DropOldAttemptsStatement(instance_id, step_index, keep)).status();
  }
  absl::Status InsertEvent(const EventRecord& event, int64_t instance_id, Millis now) override {
    return PgInsertEvent(c_, event, instance_id, now);
  }
  absl::Status InsertAlert(const AlertRecord& alert, int64_t instance_id, Millis now) override {
    return PgInsertAlert(c_, alert, instance_id, now).status();
  }
  absl::Status InsertAudit(const AuditRecord& audit, int64_t instance_id, Millis at) override {
    return PgInsertAudit(c_, audit, instance_id, at);
  }
  absl::StatusOr<std::string> RunStatement(const BusinessStatement& statement) override {
    PgParams params;
    params.reserve(statement.values.size());
    for (const SqlParam& v : statement.values) {
      if (v.kind == SqlParam::Kind::kNull) {
        params.push_back(std::nullopt);
      } else {
        params.push_back(v.text);  // typed by the server from where it is used
      }
    }
    // Bounded: a lock held on the integration's table must not stall the commit of
    // every instance behind it. SET LOCAL ends with the savepoint of the change or the
    // transaction; it is set back for what follows in the same transaction.
    WS_RETURN_IF_ERROR(
        Trouble(c_.Exec("SET LOCAL lock_timeout = '5s'; "
                        "SET LOCAL statement_timeout = '30s'")));
    // Unprepared: the integration migrates its tables, and a plan kept on the
    // connection would outlive them.
    auto result = c_.QueryUnprepared(statement.postgres, params);
    if (!result.ok()) return Classified(result.status());
    WS_RETURN_IF_ERROR(
        Trouble(c_.Exec("SET LOCAL lock_timeout TO DEFAULT; "
                        "SET LOCAL statement_timeout TO DEFAULT")));
    StatementRows rows;
    for (int r = 0; r < result->rows(); ++r) {
      WS_RETURN_IF_ERROR(rows.StartRow());
      for (int col = 0; col < result->columns(); ++col) {
        StatementRows::Type type = StatementRows::Type::kText;
        switch (result->ColumnType(col)) {
          case 20:
          case 21:
          case 23:
            type = StatementRows::Type::kInteger;
            break;  // int8, int2, int4
          case 700:
          case 701:
            type = StatementRows::Type::kReal;
            break;  // float4, float8
          case 1700:
            type = StatementRows::Type::kDecimal;
            break;  // numeric: exact
          case 16:
            type = StatementRows::Type::kBoolean;
            break;
          case 114:
          case 3802:
            type = StatementRows::Type::kJson;
            break;  // json, jsonb
          default:
            break;
        }
        if (result->IsNull(r, col)) type = StatementRows::Type::kNull;
        rows.Add(result->ColumnName(col), type, result->Text(r, col));
      }
    }
    std::string json;
    WS_RETURN_IF_ERROR(rows.Finish(result->affected(), &json));
    return json;
  }

 private:
  PgConnection& c_;
};

// Queues the statements of a batch for one pipeline instead of running them: each
// answers as if it did what the commit hoped (the lease held, the event is new,
// the step exists) and notes the row count its result must then show. Savepoints
// are not needed: when a result shows otherwise, the whole transaction is rolled
// back and the batch applied again with PgChangeSql, which gives each change its
// own result. An idempotency key cannot be queued (its check needs the stored key
// before what follows), so a batch with one is not pipelined.
class PgQueuedChangeSql final : public ChangeSql {
 public:
  absl::Status Savepoint() override { return absl::OkStatus(); }
  absl::Status RollbackToSavepoint() override { return absl::OkStatus(); }
  absl::Status ReleaseSavepoint() override { return absl::OkStatus(); }

  absl::StatusOr<bool> Fence(const Change& ch) override {
    fences_.push_back(FenceStatement(ch).params);
    return true;
  }
  // Once per batch: the transaction delivers one notification however often sent.
  absl::Status SignalWork() override {
    if (signalled_) return absl::OkStatus();
    signalled_ = true;
    return Queue(PgSignalWorkStatement());
  }
  absl::StatusOr<bool> ClaimInbox(const InboxClaim& claim, int64_t instance_id,
                                  Millis now) override {
    return Queue(ClaimInboxStatement(claim, instance_id, now), 1);
  }
  absl::Status ResolveAlerts(int64_t instance_id, Millis now) override {
    return Queue(ResolveAlertsStatement(instance_id, now));
  }
  absl::Status ReviseInput(int64_t instance_id, const std::string& input_json) override {
    return Queue(ReviseInputStatement(instance_id, input_json));
  }
  absl::StatusOr<std::optional<StoredIdempotencyKey>> ReadIdempotencyKey(
      const std::string&, const std::string&) override {
    return absl::UnimplementedError("an idempotency key is not pipelined");
  }
  absl::Status PutIdempotencyKey(const IdempotencyClaim&, Millis) override {
    return absl::UnimplementedError("an idempotency key is not pipelined");
  }
  absl::Status ReserveIdempotencyKey(const IdempotencyClaim& claim, Millis now) override {
    return Queue(ReserveKeyStatement(claim, now));  // its row count tells nothing
  }
  absl::StatusOr<std::string> RunStatement(const BusinessStatement&) override {
    return absl::UnimplementedError("a sql step's statement is not pipelined");
  }
  absl::Status InsertStep(int64_t, const StepRecord&) override {
    return absl::UnimplementedError("an added step is not pipelined");
  }
  absl::Status KeepEvent(int64_t, const KeptEvent&) override {
    return absl::UnimplementedError("a kept event is not pipelined");
  }
  absl::StatusOr<bool> TakeKeptEvent(int64_t, const KeptEventTake&, Millis) override {
    return absl::UnimplementedError("a kept event is not pipelined");
  }
  absl::StatusOr<bool> UpdateStep(int64_t instance_id, const StepRecord& s) override {
    steps_.push_back(UpdateStepStatement(instance_id, s).params);
    return true;
  }
  absl::Status InsertAttempt(int64_t instance_id, const AttemptRecord& a) override {
    attempts_.push_back(InsertAttemptStatement(instance_id, a).params);
    return absl::OkStatus();
  }
  absl::Status DropOldAttempts(int64_t instance_id, int step_index, int keep) override {
    drops_.push_back(DropOldAttemptsStatement(instance_id, step_index, keep).params);
    return absl::OkStatus();
  }
  absl::Status InsertEvent(const EventRecord& event, int64_t instance_id, Millis now) override {
    events_.push_back(PgInsertEventStatement(event, instance_id, now).params);
    return absl::OkStatus();
  }
  absl::Status InsertAlert(const AlertRecord& alert, int64_t instance_id, Millis now) override {
    return Queue(PgInsertAlertStatement(alert, instance_id, now));
  }
  absl::Status InsertAudit(const AuditRecord& audit, int64_t instance_id, Millis at) override {
    return Queue(PgInsertAuditStatement(audit, instance_id, at));
  }

  // Ends the queue: the fences, step updates and events of all changes as one
  // statement each, then the rest in the order queued, all after `begin`, and last
  // the attempts and the bound on them, as one statement each.
  void Finish(PgStatement begin) {
    PgAssumedBatch all;
    all.Add(std::move(begin));
    // Every fence, then every step, must find its row: one instance or step twice
    // in a batch (updated once by a joined UPDATE) counts short and is applied
    // again one change at a time, in order.
    if (!fences_.empty()) {
      all.Add(Joined(kFences, fences_), static_cast<int64_t>(fences_.size()));
    }
    if (!steps_.empty()) {
      all.Add(Joined(kSteps, steps_), static_cast<int64_t>(steps_.size()));
    }
    // In the batch's order: unnest yields its rows in order, and the outbox's
    // sequence numbers them as they come.
    if (!events_.empty()) {
      all.Add({&kEvents, Columns(events_)});
    }
    for (size_t i = 0; i < queued_.statements.size(); ++i) {
      all.Add(std::move(queued_.statements[i]), queued_.rows[i]);
    }
    if (!attempts_.empty()) {
      all.Add(Joined(kAttempts, attempts_), static_cast<int64_t>(attempts_.size()));
    }
    if (!drops_.empty()) {
      all.Add(Joined(kDrops, drops_));
    }
    queued_ = std::move(all);
  }
  const PgAssumedBatch& batch() const { return queued_; }

 private:
  absl::Status Queue(PgStatement statement) {
    queued_.Add(std::move(statement));
    return absl::OkStatus();
  }
  bool Queue(PgStatement statement, int64_t rows) {
    queued_.Add(std::move(statement), rows);
    return true;
  }

  // One of the statements below over its rows' parameters, planned each time: each
  // joins a table, and a plan kept from the first batches on a new database, when
  // `steps` held a few hundred rows, scanned the whole table for every batch after
  // (1,712 of 2,685 step updates in a 5 s benchmark window, two thirds of the
  // server's statement time). kEvents joins none and stays prepared.
  static PgStatement Joined(const std::string& sql, const std::vector<PgParams>& rows) {
    return {&sql, Columns(rows), /*planned_each_time=*/true};
  }

  // FenceStatement, UpdateStepStatement, PgInsertEventStatement,
  // InsertAttemptStatement and DropOldAttemptsStatement over arrays of their
  // parameters, in the same order.
  static const std::string kFences;
  static const std::string kSteps;
  static const std::string kEvents;
  static const std::string kAttempts;
  static const std::string kDrops;

  bool signalled_ = false;
  std::vector<PgParams> fences_;
  std::vector<PgParams> steps_;
  std::vector<PgParams> events_;
  std::vector<PgParams> attempts_;
  std::vector<PgParams> drops_;
  PgAssumedBatch queued_;  // the statements queued, then (Finish) the whole batch
};

const std::string PgQueuedChangeSql::kFences =
    "UPDATE instances i SET updated_at = u.now, lease_expires_at = u.expires, lease_owner = "
    "CASE WHEN u.expires = 0 THEN '' ELSE i.lease_owner END, state = COALESCE(u.state, "
    "i.state), status_reason = COALESCE(u.reason, i.status_reason), next_run_at = "
    "COALESCE(u.next_run, i.next_run_at) FROM unnest($1::bigint[], $2::bigint[], "
    "$3::smallint[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::text[]) AS "
    "u(now, expires, state, reason, next_run, id, epoch, owner) WHERE i.id = u.id AND "
    "i.lease_epoch = u.epoch AND i.lease_owner = u.owner";
const std::string PgQueuedChangeSql::kSteps =
    "UPDATE steps s SET state = u.state, attempts = u.attempts, error_class = u.error_class, "
    "error_message = u.error_message, external_id = u.external_id, response_json = "
    "u.response_json, idempotency_key = u.idempotency_key, request_hash = u.request_hash, "
    "resolution = u.resolution, unknowns = u.unknowns, lookups = u.lookups, "
    "compensation_attempts = u.compensation_attempts, next_attempt_at = u.next_attempt_at, "
    "started_at = u.started_at, finished_at = u.finished_at, span_id = u.span_id, "
    "unknown_since = u.unknown_since FROM unnest($1::smallint[], $2::integer[], "
    "$3::smallint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], "
    "$9::smallint[], $10::integer[], $11::integer[], $12::integer[], $13::bigint[], "
    "$14::bigint[], $15::bigint[], $16::text[], $17::bigint[], $18::bigint[], $19::integer[]) "
    "AS u(state, attempts, error_class, error_message, external_id, response_json, "
    "idempotency_key, request_hash, resolution, unknowns, lookups, compensation_attempts, "
    "next_attempt_at, started_at, finished_at, span_id, unknown_since, instance_id, "
    "step_index) WHERE s.instance_id = u.instance_id AND s.step_index = u.step_index";
const std::string PgQueuedChangeSql::kEvents =
    "INSERT INTO outbox (event_id, instance_id, tenant, type, payload, created_at) SELECT * "
    "FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[])";
// Numbered after each step's last attempt as InsertAttemptStatement does: the
// subquery sees the table as it was before this statement, and row_number() counts
// the batch's own attempts of the step in the order they were queued.
const std::string PgQueuedChangeSql::kAttempts =
    "INSERT INTO attempts (instance_id, step_index, seq, phase, sent, connection, status, "
    "error_class, detail, started_at, finished_at, worker, lease_epoch) SELECT u.instance_id, "
    "u.step_index, COALESCE((SELECT MAX(m.seq) FROM attempts m WHERE m.instance_id = "
    "u.instance_id AND m.step_index = u.step_index), 0) + row_number() OVER (PARTITION BY "
    "u.instance_id, u.step_index ORDER BY u.n), u.phase, u.sent, u.connection, u.status, "
    "u.error_class, u.detail, u.started_at, u.finished_at, u.worker, u.lease_epoch FROM "
    "unnest($1::bigint[], $2::integer[], $3::smallint[], $4::boolean[], $5::smallint[], "
    "$6::integer[], $7::smallint[], $8::text[], $9::bigint[], $10::bigint[], $11::text[], "
    "$12::bigint[]) WITH ORDINALITY AS u(instance_id, step_index, phase, sent, connection, "
    "status, error_class, detail, started_at, finished_at, worker, lease_epoch, n)";
// Per step, its newest seq and then its older rows are read through the primary key
// (the OFFSET 0 keeps the lateral subquery a lookup per step: flattened into a join,
// the planner may scan the whole table, and evaluate the newest seq once per row).
const std::string PgQueuedChangeSql::kDrops =
    "DELETE FROM attempts WHERE ctid = ANY(ARRAY(SELECT o.ctid FROM unnest($1::bigint[], "
    "$2::integer[], $3::integer[]) AS u(instance_id, step_index, keep) CROSS JOIN LATERAL "
    "(SELECT a.ctid FROM attempts a WHERE a.instance_id = u.instance_id AND a.step_index = "
    "u.step_index AND a.seq <= (SELECT MAX(m.seq) FROM attempts m WHERE m.instance_id = "
    "u.instance_id AND m.step_index = u.step_index) - u.keep OFFSET 0) o))";

}  // namespace

absl::StatusOr<bool> PostgresStore::CommitAsAssumed(const PgAssumedBatch& batch) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  auto results = c->Pipeline(batch.statements);
  const bool as_assumed =
      results.ok() && results->size() == batch.rows.size() &&
      std::equal(batch.rows.begin(), batch.rows.end(), results->begin(),
                 [](const std::optional<int64_t>& rows, const PgResult& result) {
                   return !rows || result.affected() == *rows;
                 });
  if (as_assumed) {
    WS_RETURN_IF_ERROR(c->Commit());
    return true;
  }
  // A lost connection fails the batch as it would one statement at a time.
  if (c->broken()) {
    return results.ok() ? absl::UnavailableError("connection lost") : results.status();
  }
  if (absl::Status rolled_back = c->Exec("ROLLBACK"); !rolled_back.ok()) {
    c->MarkBroken();  // it may still be in the transaction: never lent again
    return rolled_back;
  }
  return false;
}

absl::StatusOr<std::vector<absl::Status>> PostgresStore::Commit(
    const std::vector<Change>& changes) {
  // The common batch (checkpoints whose leases hold) is sent as one pipeline and
  // committed: two round trips, where one statement at a time costs one per
  // statement while every other change of the batch waits.
  // Nor is a sql step's statement, or a code workflow's transaction: its failure is
  // its change's alone, and its rows are the step's result. Nor are added step rows
  // or kept events (a code workflow's), whose statements the batch does not hold.
  const bool queueable = std::none_of(changes.begin(), changes.end(), [](const Change& c) {
    return c.idempotency.has_value() || !c.statements.empty() || c.work || !c.added_steps.empty() ||
           c.keep || c.take;
  });
  if (queueable && !changes.empty()) {
    PgQueuedChangeSql queued;
    auto assumed = CommitChanges(queued, changes, attempts_per_step_);
    if (assumed.ok() && std::all_of(assumed->begin(), assumed->end(),
                                    [](const absl::Status& s) { return s.ok(); })) {
      static const std::string kBegin = "BEGIN";
      queued.Finish({&kBegin, {}});
      WS_ASSIGN_OR_RETURN(bool committed, CommitAsAssumed(queued.batch()));
      if (committed) return *assumed;
    }
  }
  std::vector<absl::Status> results;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    PgChangeSql sql(c);
    WS_ASSIGN_OR_RETURN(results, CommitChanges(sql, changes, attempts_per_step_));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return results;
}

}  // namespace waystone
