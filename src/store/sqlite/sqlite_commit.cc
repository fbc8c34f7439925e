// SqliteStore: the group commit (InstanceStore::Commit). The loop and the order of
// a change are CommitChanges'; this file holds their SQL.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/business_statement.h"
#include "store/claims.h"
#include "store/group_commit.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"

namespace waystone {
namespace {

// What a sql step's statement may do (sqlite3_set_authorizer): read, insert, update
// and delete rows of tables that are not Waystone's, and call functions other than
// load_extension. Everything else (transaction control, savepoints, PRAGMA, ATTACH,
// schema changes) is refused when it is prepared.
int AuthorizeBusinessStatement(void*, int action, const char* first, const char* second,
                               const char*, const char*) {
  const auto ours = [&] {
    if (first == nullptr) return false;
    std::string table(first);
    for (char& c : table) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return table.starts_with("sqlite_") || IsWaystoneTable(table);
  };
  switch (action) {
    case SQLITE_SELECT:
    case SQLITE_RECURSIVE:
      return SQLITE_OK;
    case SQLITE_READ:
    case SQLITE_INSERT:
    case SQLITE_UPDATE:
    case SQLITE_DELETE:
      return ours() ? SQLITE_DENY : SQLITE_OK;
    case SQLITE_FUNCTION:  // `second` is the function's name
      return second != nullptr && std::string_view(second) == "load_extension" ? SQLITE_DENY
                                                                               : SQLITE_OK;
    default:
      return SQLITE_DENY;
  }
}

// How long a sql step's statement may run.
constexpr std::chrono::seconds kStatementTimeout{30};

// A statement's own errors (the SQL, its tables, its data, the authorizer) fail its
// step; anything else is the database's trouble and fails the batch.
absl::Status Classified(int rc, sqlite3* db, std::string_view what) {
  const absl::Status status = SqliteStatus(rc, db, what);
  switch (rc & 0xff) {
    case SQLITE_ERROR:
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
    case SQLITE_TOOBIG:
    case SQLITE_AUTH:
    case SQLITE_INTERRUPT:  // it ran past kStatementTimeout
      return StatementFailure(std::string(status.message()));
    default:
      return StatementTrouble(status);
  }
}

class SqliteChangeSql final : public ChangeSql {
 public:
  explicit SqliteChangeSql(SqliteDb& db) : db_(db) {}

  absl::Status Savepoint() override { return db_.Run("SAVEPOINT change"); }
  absl::Status RollbackToSavepoint() override { return db_.Run("ROLLBACK TO change"); }
  absl::Status ReleaseSavepoint() override { return db_.Run("RELEASE change"); }

  absl::StatusOr<bool> Fence(const Change& c) override {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * fence,
        db_.Prepare("UPDATE instances SET updated_at = ?1, lease_expires_at = ?2, "
                    "lease_owner = CASE WHEN ?2 = 0 THEN '' ELSE lease_owner END, "
                    "state = COALESCE(?3, state), status_reason = COALESCE(?4, status_reason), "
                    "next_run_at = COALESCE(?5, next_run_at) "
                    "WHERE id = ?6 AND lease_epoch = ?7 AND lease_owner = ?8"));
    fence->Bind(1, c.now).Bind(2, c.lease_expires_at);
    if (c.state)
      fence->Bind(3, static_cast<int64_t>(*c.state));
    else
      fence->BindNull(3);
    if (c.status_reason)
      fence->Bind(4, std::string_view(*c.status_reason));
    else
      fence->BindNull(4);
    if (c.next_run_at)
      fence->Bind(5, *c.next_run_at);
    else
      fence->BindNull(5);
    fence->Bind(6, c.lease.instance_id).Bind(7, c.lease.epoch);
    fence->Bind(8, std::string_view(c.lease.owner));
    WS_RETURN_IF_ERROR(fence->Run());
    return db_.Changes() == 1;
  }
  absl::Status SignalWork() override { return absl::OkStatus(); }  // workers poll
  absl::StatusOr<bool> ClaimInbox(const InboxClaim& claim, int64_t instance_id,
                                  Millis now) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                        db_.Prepare("INSERT OR IGNORE INTO inbox (tenant, source, event_id, "
                                    "data_hash, received_at, instance_id) VALUES (?, ?, ?, ?, ?, "
                                    "?)"));
    WS_RETURN_IF_ERROR(
        s->BindAll(claim.tenant, claim.source, claim.id, claim.data_hash, now, instance_id).Run());
    return db_.Changes() == 1;
  }
  absl::Status KeepEvent(int64_t instance_id, const KeptEvent& e) override {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * s,
        db_.Prepare("INSERT INTO kept_events (instance_id, seq, event_type, source, event_id, "
                    "data_json, received_at) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM "
                    "kept_events WHERE instance_id = ?1), ?2, ?3, ?4, ?5, ?6)"));
    return s
        ->BindAll(instance_id, e.event_type, e.source, e.event_id, std::string_view(e.data_json),
                  e.received_at)
        .Run();
  }
  absl::StatusOr<bool> TakeKeptEvent(int64_t instance_id, const KeptEventTake& take,
                                     Millis now) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                        db_.Prepare("UPDATE kept_events SET taken_by = ?, taken_at = ? WHERE "
                                    "instance_id = ? AND seq = ? AND taken_by IS NULL"));
    WS_RETURN_IF_ERROR(s->BindAll(take.step_index, now, instance_id, take.seq).Run());
    return db_.Changes() == 1;
  }
  absl::Status ReviseInput(int64_t instance_id, const std::string& input_json) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                        db_.Prepare("UPDATE instances SET input_json = ? WHERE id = ?"));
    return s->BindAll(std::string_view(input_json), instance_id).Run();
  }
  absl::Status ResolveAlerts(int64_t instance_id, Millis now) override {
    static const std::string kResolve =
        absl::StrCat("UPDATE alerts SET state = ", SqlValue(AlertState::kResolved),
                     ", updated_at = ? WHERE instance_id = ? AND state IN ", SqlLiveAlertStates());
    WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_.Prepare(kResolve));
    return s->BindAll(now, instance_id).Run();
  }
  absl::StatusOr<std::optional<StoredIdempotencyKey>> ReadIdempotencyKey(
      const std::string& tenant, const std::string& key) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                        db_.Prepare("SELECT request_hash, expires_at, instance_id, step_name, "
                                    "EXISTS " +
                                    std::string(kOwnerGaveUp) +
                                    " FROM idempotency_keys WHERE tenant = ? AND key = ?"));
    s->BindAll(tenant, key);
    return FirstRow(s, [](const SqliteStatement& r) {
      return StoredIdempotencyKey{r.Text(0), r.Int(1), r.Int(2), r.Text(3), r.Int(4) != 0};
    });
  }
  // An exclusive claim takes the row only when it is free, expired or its own: the
  // check before it read the row, but the write itself decides.
  absl::Status PutIdempotencyKey(const IdempotencyClaim& claim, Millis now) override {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * s,
        db_.Prepare("INSERT INTO idempotency_keys VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
                    "ON CONFLICT (tenant, key) DO UPDATE SET request_hash = "
                    "excluded.request_hash, expires_at = excluded.expires_at, "
                    "instance_id = excluded.instance_id, step_name = excluded.step_name "
                    "WHERE ?8 = 0 OR idempotency_keys.expires_at <= ?6 OR "
                    "(idempotency_keys.instance_id = ?4 AND idempotency_keys.step_name = ?5) OR "
                    "EXISTS " +
                    std::string(kOwnerGaveUp)));
    WS_RETURN_IF_ERROR(s->BindAll(claim.tenant, claim.key, claim.request_hash, claim.instance_id,
                                  claim.step, now, claim.expires_at,
                                  static_cast<int64_t>(claim.exclusive))
                           .Run());
    if (db_.Changes() == 0) {
      return DeliveryOwnedError("delivery '" + claim.key + "' belongs to another instance step");
    }
    return absl::OkStatus();
  }
  absl::Status ReserveIdempotencyKey(const IdempotencyClaim& claim, Millis now) override {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * s,
        db_.Prepare("INSERT INTO idempotency_keys VALUES (?1, ?2, '', ?3, ?4, ?5, ?6) "
                    "ON CONFLICT (tenant, key) DO UPDATE SET request_hash = '', expires_at = "
                    "excluded.expires_at, instance_id = excluded.instance_id, step_name = "
                    "excluded.step_name WHERE idempotency_keys.expires_at <= ?5 OR "
                    "EXISTS " +
                    std::string(kOwnerGaveUp)));
    return s->BindAll(claim.tenant, claim.key, claim.instance_id, claim.step, now, claim.expires_at)
        .Run();
  }
  absl::Status InsertStep(int64_t instance_id, const StepRecord& s) override {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * step,
        db_.Prepare("INSERT INTO steps (instance_id, step_index, name, state, attempts, "
                    "error_class, error_message, external_id, response_json, idempotency_key, "
                    "request_hash, resolution, unknowns, lookups, compensation_attempts, "
                    "next_attempt_at, started_at, finished_at, span_id, unknown_since) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
    return step
        ->BindAll(instance_id, s.index, s.name, static_cast<int64_t>(s.state), s.attempts,
                  static_cast<int64_t>(s.error_class), s.error_message, s.external_id,
                  s.response_json, s.idempotency_key, s.request_hash,
                  static_cast<int64_t>(s.resolution), s.unknowns, s.lookups,
                  s.compensation_attempts, s.next_attempt_at, s.started_at, s.finished_at,
                  s.span_id, s.unknown_since)
        .Run();
  }
  absl::StatusOr<bool> UpdateStep(int64_t instance_id, const StepRecord& s) override {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * step,
        db_.Prepare("UPDATE steps SET state = ?, attempts = ?, error_class = ?, error_message = ?, "
                    "external_id = ?, response_json = ?, idempotency_key = ?, request_hash = ?, "
                    "resolution = ?, unknowns = ?, lookups = ?, compensation_attempts = ?, "
                    "next_attempt_at = ?, started_at = ?, finished_at = ?, span_id = ?, "
                    "unknown_since = ? WHERE instance_id = ? AND step_index = ?"));
    WS_RETURN_IF_ERROR(step->BindAll(static_cast<int64_t>(s.state), s.attempts,
                                     static_cast<int64_t>(s.error_class), s.error_message,
                                     s.external_id, s.response_json, s.idempotency_key,
                                     s.request_hash, static_cast<int64_t>(s.resolution), s.unknowns,
                                     s.lookups, s.compensation_attempts, s.next_attempt_at,
                                     s.started_at, s.finished_at, s.span_id, s.unknown_since,
                                     instance_id, s.index)
                           .Run());
    return db_.Changes() == 1;
  }
  absl::Status InsertAttempt(int64_t instance_id, const AttemptRecord& a) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * attempt,
                        db_.Prepare("INSERT INTO attempts (instance_id, step_index, seq, "
                                    "phase, sent, connection, status, error_class, detail, "
                                    "started_at, finished_at, worker, lease_epoch) SELECT ?1, ?2, "
                                    "COALESCE(MAX(seq), 0) + 1, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
                                    "?11, ?12 FROM attempts WHERE instance_id = ?1 AND "
                                    "step_index = ?2"));
    return attempt
        ->BindAll(instance_id, a.step_index, static_cast<int64_t>(a.phase), a.sent ? 1 : 0,
                  static_cast<int64_t>(a.connection), a.status, static_cast<int64_t>(a.error_class),
                  a.detail, a.started_at, a.finished_at, a.worker, a.lease_epoch)
        .Run();
  }
  absl::Status DropOldAttempts(int64_t instance_id, int step_index, int keep) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * drop,
                        db_.Prepare("DELETE FROM attempts WHERE instance_id = ?1 AND step_index = "
                                    "?2 AND seq <= (SELECT MAX(seq) FROM attempts WHERE "
                                    "instance_id = ?1 AND step_index = ?2) - ?3"));
    return drop->BindAll(instance_id, step_index, keep).Run();
  }
  absl::StatusOr<std::string> RunStatement(const BusinessStatement& statement) override {
    sqlite3* db = db_.raw();
    sqlite3_stmt* raw = nullptr;
    const char* tail = nullptr;
    // The authorizer is the boundary the definition's lint only approximates: the
    // statement may touch no table of Waystone's, and do nothing but read and write.
    sqlite3_set_authorizer(db, &AuthorizeBusinessStatement, nullptr);
    const int rc = sqlite3_prepare_v2(db, statement.sqlite.c_str(),
                                      static_cast<int>(statement.sqlite.size()), &raw, &tail);
    sqlite3_set_authorizer(db, nullptr, nullptr);
    std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> stmt(raw, sqlite3_finalize);
    if (rc != SQLITE_OK) return Classified(rc, db, "prepare");
    if (stmt == nullptr) return StatementFailure("the statement is empty");
    for (const char* rest = tail; rest != nullptr && *rest != '\0'; ++rest) {
      if (std::isspace(static_cast<unsigned char>(*rest)) == 0 && *rest != ';') {
        return StatementFailure("more than one statement");
      }
    }
    for (size_t i = 0; i < statement.values.size(); ++i) {
      const SqlParam& v = statement.values[i];
      const int at = static_cast<int>(i) + 1;
      switch (v.kind) {
        case SqlParam::Kind::kNull:
          sqlite3_bind_null(raw, at);
          break;
        case SqlParam::Kind::kInteger:
          sqlite3_bind_int64(raw, at, std::strtoll(v.text.c_str(), nullptr, 10));
          break;
        case SqlParam::Kind::kReal:
          sqlite3_bind_double(raw, at, std::strtod(v.text.c_str(), nullptr));
          break;
        case SqlParam::Kind::kBoolean:
          sqlite3_bind_int(raw, at, v.text == "true" ? 1 : 0);
          break;
        case SqlParam::Kind::kText:
          sqlite3_bind_text(raw, at, v.text.data(), static_cast<int>(v.text.size()),
                            SQLITE_TRANSIENT);
          break;
      }
    }
    // Bounded, as on PostgreSQL: the statement holds the write lock every instance's
    // commit waits for.
    const auto deadline = std::chrono::steady_clock::now() + kStatementTimeout;
    sqlite3_progress_handler(
        db, 1000,
        [](void* until) {
          return std::chrono::steady_clock::now() >
                         *static_cast<std::chrono::steady_clock::time_point*>(until)
                     ? 1
                     : 0;
        },
        const_cast<std::chrono::steady_clock::time_point*>(&deadline));
    struct ClearProgress {
      sqlite3* db;
      ~ClearProgress() { sqlite3_progress_handler(db, 0, nullptr, nullptr); }
    } clear_progress{db};
    StatementRows rows;
    int64_t returned = 0;
    while (true) {
      const int step = sqlite3_step(raw);
      if (step == SQLITE_DONE) break;
      if (step != SQLITE_ROW) {
        // A conflict clause of the table (ON CONFLICT ROLLBACK) may have ended the whole
        // transaction: nothing after this may run in it, so the batch fails as a whole.
        if (sqlite3_get_autocommit(db) != 0) {
          return absl::UnavailableError(
              std::string("the statement ended the transaction (a table's ON CONFLICT "
                          "ROLLBACK?): ") +
              sqlite3_errmsg(db));
        }
        return Classified(step, db, "sql step");
      }
      ++returned;
      WS_RETURN_IF_ERROR(rows.StartRow());
      for (int c = 0; c < sqlite3_column_count(raw); ++c) {
        const char* name = sqlite3_column_name(raw, c);
        StatementRows::Type type = StatementRows::Type::kText;
        switch (sqlite3_column_type(raw, c)) {
          case SQLITE_NULL:
            type = StatementRows::Type::kNull;
            break;
          case SQLITE_INTEGER:
            type = StatementRows::Type::kInteger;
            break;
          case SQLITE_FLOAT:
            type = StatementRows::Type::kReal;
            break;
          default:
            break;  // text; a blob is shown as its bytes
        }
        const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(raw, c));
        rows.Add(name != nullptr ? name : "", type,
                 text != nullptr
                     ? std::string_view(text, static_cast<size_t>(sqlite3_column_bytes(raw, c)))
                     : std::string_view());
      }
    }
    const int64_t count = sqlite3_stmt_readonly(raw) != 0 ? returned : db_.Changes();
    std::string json;
    WS_RETURN_IF_ERROR(rows.Finish(count, &json));
    return json;
  }
  absl::Status InsertEvent(const EventRecord& event, int64_t instance_id, Millis now) override {
    return SqliteInsertEvent(db_, event, instance_id, now);
  }
  absl::Status InsertAlert(const AlertRecord& alert, int64_t instance_id, Millis now) override {
    return SqliteInsertAlert(db_, alert, instance_id, now).status();
  }
  absl::Status InsertAudit(const AuditRecord& audit, int64_t instance_id, Millis at) override {
    return SqliteInsertAudit(db_, audit, instance_id, at);
  }

 private:
  SqliteDb& db_;
};

}  // namespace

absl::StatusOr<std::vector<absl::Status>> SqliteApplyChanges(SqliteDb& db,
                                                             const std::vector<Change>& changes,
                                                             int attempts_per_step) {
  SqliteChangeSql sql(db);
  return CommitChanges(sql, changes, attempts_per_step);
}

absl::StatusOr<std::vector<absl::Status>> SqliteStore::Commit(const std::vector<Change>& changes) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransactionFor(db,
                               [&] { return SqliteApplyChanges(db, changes, attempts_per_step_); });
}

absl::StatusOr<InstanceStore::Committed> SqliteStore::StartAndCommit(
    const std::vector<NewInstance>& starts, const std::vector<Change>& changes) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransactionFor(db, [&]() -> absl::StatusOr<Committed> {
    Committed committed;
    WS_ASSIGN_OR_RETURN(committed.started, SqliteStartInstances(db, starts));
    WS_ASSIGN_OR_RETURN(committed.applied, SqliteApplyChanges(db, changes, attempts_per_step_));
    return committed;
  });
}

}  // namespace waystone
