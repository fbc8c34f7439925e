#include "store/sqlite/sqlite_store.h"

#include "base/status_macros.h"
#include "store/migration.h"
#include "store/start_decision.h"
#include "store/sqlite/sqlite_db.h"

namespace waystone {
namespace {

constexpr char kInstanceColumns[] =
    "id, tenant, business_key, workflow, definition_hash, input_json, input_hash, state, "
    "status_reason, next_run_at, lease_owner, lease_expires_at, lease_epoch, trace_id, "
    "source_event, created_at, updated_at";

InstanceRecord ReadInstance(const SqliteStatement& s) {
  InstanceRecord r;
  r.id = s.Int(0);
  r.tenant = s.Text(1);
  r.key = s.Text(2);
  r.workflow = s.Text(3);
  r.definition_hash = s.Text(4);
  r.input_json = s.Text(5);
  r.input_hash = s.Text(6);
  r.state = static_cast<InstanceState>(s.Int(7));
  r.status_reason = s.Text(8);
  r.next_run_at = s.Int(9);
  r.lease_owner = s.Text(10);
  r.lease_expires_at = s.Int(11);
  r.lease_epoch = s.Int(12);
  r.trace_id = s.Text(13);
  r.source_event = s.Text(14);
  r.created_at = s.Int(15);
  r.updated_at = s.Int(16);
  return r;
}

constexpr char kStepColumns[] =
    "instance_id, step_index, name, state, attempts, error_class, error_message, external_id, "
    "response_json, idempotency_key, request_hash, resolution, unknowns, lookups, "
    "compensation_attempts, next_attempt_at, started_at, finished_at, span_id, unknown_since";

StepRecord ReadStep(const SqliteStatement& s) {
  StepRecord r;
  r.instance_id = s.Int(0);
  r.index = static_cast<int>(s.Int(1));
  r.name = s.Text(2);
  r.state = static_cast<StepState>(s.Int(3));
  r.attempts = static_cast<int>(s.Int(4));
  r.error_class = static_cast<ErrorClass>(s.Int(5));
  r.error_message = s.Text(6);
  r.external_id = s.Text(7);
  r.response_json = s.Text(8);
  r.idempotency_key = s.Text(9);
  r.request_hash = s.Text(10);
  r.resolution = static_cast<Resolution>(s.Int(11));
  r.unknowns = static_cast<int>(s.Int(12));
  r.lookups = static_cast<int>(s.Int(13));
  r.compensation_attempts = static_cast<int>(s.Int(14));
  r.next_attempt_at = s.Int(15);
  r.started_at = s.Int(16);
  r.finished_at = s.Int(17);
  r.span_id = s.Text(18);
  r.unknown_since = s.Int(19);
  return r;
}

// Steps `statement` to the end, reading each row with `read`, then resets it.
template <typename Read>
auto CollectRows(SqliteStatement* statement, Read read)
    -> absl::StatusOr<std::vector<decltype(read(*statement))>> {
  std::vector<decltype(read(*statement))> rows;
  while (true) {
    auto row = statement->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    rows.push_back(read(*statement));
  }
  statement->Reset();
  return rows;
}

std::string ReadText0(const SqliteStatement& s) { return s.Text(0); }

EventRecord ReadEvent(const SqliteStatement& s) {
  return {s.Int(0), s.Text(1), s.Int(2), s.Text(3), s.Text(4), s.Text(5), s.Int(6)};
}

// Runs `body` inside BEGIN IMMEDIATE ... COMMIT; rolls back on any error.
template <typename Body>
absl::Status InWriteTransaction(SqliteDb& db, Body&& body) {
  WS_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
  absl::Status status = body();
  if (status.ok()) status = db.Exec("COMMIT");
  if (!status.ok()) (void)db.Exec("ROLLBACK");
  return status;
}

}  // namespace

SqliteStore::SqliteStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
SqliteStore::~SqliteStore() = default;

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const StoreOptions& options) {
  WS_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(options.path, static_cast<int>(options.busy_timeout)));
  if (options.synchronous != "FULL" && options.synchronous != "NORMAL" &&
      options.synchronous != "OFF" && options.synchronous != "EXTRA") {
    return absl::InvalidArgumentError("synchronous must be OFF, NORMAL, FULL or EXTRA");
  }
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=" + options.synchronous));
  WS_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  auto store = std::unique_ptr<SqliteStore>(new SqliteStore(std::move(db)));
  WS_RETURN_IF_ERROR(store->Migrate());
  return store;
}

absl::Status SqliteStore::Migrate() {
  std::lock_guard<std::mutex> lock(mu_);
  return InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_RETURN_IF_ERROR(db_->Exec(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
        "name TEXT NOT NULL, applied_at INTEGER NOT NULL)"));
    WS_ASSIGN_OR_RETURN(SqliteStatement * max,
                        db_->Prepare("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"));
    WS_ASSIGN_OR_RETURN(bool row, max->Step());
    const int current = row ? static_cast<int>(max->Int(0)) : 0;
    max->Reset();
    const auto& migrations = sqlite_migrations();
    const int newest = migrations.empty() ? 0 : migrations.back().version;
    if (current > newest) {
      return absl::FailedPreconditionError(
          "database schema is version " + std::to_string(current) + " but this build knows only " +
          "up to " + std::to_string(newest) + "; use a newer waystone");
    }
    for (const auto& migration : migrations) {
      if (migration.version <= current) continue;
      WS_RETURN_IF_ERROR(db_->Exec(migration.sql));
      WS_ASSIGN_OR_RETURN(SqliteStatement * insert,
                          db_->Prepare("INSERT INTO schema_migrations VALUES (?, ?, "
                                       "CAST(strftime('%s','now') AS INTEGER) * 1000)"));
      WS_RETURN_IF_ERROR(insert->BindAll(migration.version, migration.name).Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<int> SqliteStore::SchemaVersion() {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare("SELECT MAX(version) FROM schema_migrations"));
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  const int version = row ? static_cast<int>(s->Int(0)) : 0;
  s->Reset();
  return version;
}

absl::Status SqliteStore::PutDefinition(const std::string& hash, const std::string& workflow,
                                        const std::string& source, const std::string& text,
                                        Millis now) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("INSERT OR IGNORE INTO definitions VALUES (?, ?, ?, ?, ?)"));
  return s->BindAll(hash, workflow, source, text, now).Run();
}

absl::StatusOr<std::string> SqliteStore::GetDefinition(const std::string& hash) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare("SELECT body FROM definitions WHERE hash = ?"));
  s->BindAll(hash);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) return absl::NotFoundError("no definition with hash " + hash);
  std::string body = s->Text(0);
  s->Reset();
  return body;
}

absl::StatusOr<InstanceRecord> SqliteStore::LoadInstance(const std::string& where_sql, int64_t id,
                                                         const std::string& tenant,
                                                         const std::string& key) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(std::string("SELECT ") + kInstanceColumns +
                                   " FROM instances WHERE " + where_sql));
  if (id != 0) {
    s->BindAll(id);
  } else {
    s->BindAll(tenant, key);
  }
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) {
    s->Reset();
    return absl::NotFoundError(id != 0 ? "no instance with id " + std::to_string(id)
                                       : "no instance '" + key + "' in tenant '" + tenant + "'");
  }
  InstanceRecord record = ReadInstance(*s);
  s->Reset();
  return record;
}

absl::StatusOr<StartResult> SqliteStore::StartInstance(const NewInstance& in) {
  std::lock_guard<std::mutex> lock(mu_);
  StartResult result;
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    const bool has_event = !in.event_source.empty() && !in.event_id.empty();
    if (has_event) {
      WS_ASSIGN_OR_RETURN(SqliteStatement * claim,
                          db_->Prepare("INSERT OR IGNORE INTO inbox (tenant, source, event_id, "
                                       "data_hash, received_at) VALUES (?, ?, ?, ?, ?)"));
      WS_RETURN_IF_ERROR(
          claim->BindAll(in.tenant, in.event_source, in.event_id, in.event_data_hash, in.now)
              .Run());
      if (db_->Changes() == 0) {
        WS_ASSIGN_OR_RETURN(std::optional<InboxEntry> prior,
                            ReadInbox(in.tenant, in.event_source, in.event_id));
        if (!prior) return absl::InternalError("inbox claim vanished inside its transaction");
        result.outcome = DecideClaimedEvent(*prior, in.event_data_hash);
        result.stored_data_hash = prior->data_hash;
        auto instance = LoadInstance("id = ?", prior->instance_id, "", "");
        if (instance.ok()) {
          result.instance = *instance;
        } else if (absl::IsNotFound(instance.status())) {
          WS_ASSIGN_OR_RETURN(result.tombstone, ReadTombstone("instance_id = ?", prior->instance_id,
                                                              "", ""));
          if (result.tombstone) result.instance = InstanceFromTombstone(*result.tombstone);
        } else {
          return instance.status();
        }
        if (result.outcome == StartOutcome::kEventConflict) return absl::OkStatus();
        return db_->Exec("UPDATE counters SET value = value + 1 WHERE name = 'inbox_duplicates'");
      }
    }
    auto existing = LoadInstance("tenant = ? AND business_key = ?", 0, in.tenant, in.key);
    if (existing.ok()) {
      WS_RETURN_IF_ERROR(CheckStartAgainst(existing->workflow, existing->input_hash, in, false));
      result.outcome = StartOutcome::kExisting;
      result.instance = *existing;
    } else if (!absl::IsNotFound(existing.status())) {
      return existing.status();
    } else {
      WS_ASSIGN_OR_RETURN(result.tombstone,
                          ReadTombstone("tenant = ? AND business_key = ?", 0, in.tenant, in.key));
      if (result.tombstone) {
        WS_RETURN_IF_ERROR(CheckStartAgainst(result.tombstone->workflow,
                                             result.tombstone->input_hash, in, true));
        result.outcome = StartOutcome::kCollected;
        result.instance = InstanceFromTombstone(*result.tombstone);
      } else {
        WS_ASSIGN_OR_RETURN(int64_t id, InsertInstance(in, has_event));
        result.outcome = StartOutcome::kCreated;
        WS_ASSIGN_OR_RETURN(result.instance, LoadInstance("id = ?", id, "", ""));
      }
    }
    if (has_event) {
      WS_ASSIGN_OR_RETURN(SqliteStatement * link,
                          db_->Prepare("UPDATE inbox SET instance_id = ? WHERE tenant = ? AND "
                                       "source = ? AND event_id = ?"));
      WS_RETURN_IF_ERROR(
          link->BindAll(result.instance.id, in.tenant, in.event_source, in.event_id).Run());
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return result;
}

absl::StatusOr<int64_t> SqliteStore::InsertInstance(const NewInstance& in, bool has_event) {
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * insert,
      db_->Prepare("INSERT INTO instances (tenant, business_key, workflow, definition_hash, "
                   "input_json, input_hash, state, next_run_at, trace_id, source_event, "
                   "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
  const std::string source_event = has_event ? in.event_source + " " + in.event_id : std::string();
  WS_RETURN_IF_ERROR(insert
                         ->BindAll(in.tenant, in.key, in.workflow, in.definition_hash,
                                   in.input_json, in.input_hash,
                                   static_cast<int64_t>(InstanceState::kRunning), in.now,
                                   in.trace_id, source_event, in.now, in.now)
                         .Run());
  const int64_t id = db_->LastInsertRowId();
  WS_ASSIGN_OR_RETURN(SqliteStatement * step,
                      db_->Prepare("INSERT INTO steps (instance_id, step_index, name, state) "
                                   "VALUES (?, ?, ?, ?)"));
  for (size_t i = 0; i < in.step_names.size(); ++i) {
    WS_RETURN_IF_ERROR(step->BindAll(id, static_cast<int64_t>(i), in.step_names[i],
                                     static_cast<int64_t>(StepState::kPending))
                           .Run());
    step->Reset();
  }
  WS_RETURN_IF_ERROR(InsertEvent(in.started_event, id, in.now));
  return id;
}

absl::StatusOr<std::optional<InboxEntry>> SqliteStore::ReadInbox(const std::string& tenant,
                                                                 const std::string& source,
                                                                 const std::string& id) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT data_hash, COALESCE(instance_id, 0), received_at FROM "
                                   "inbox WHERE tenant = ? AND source = ? AND event_id = ?"));
  s->BindAll(tenant, source, id);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  std::optional<InboxEntry> entry;
  if (row) entry = InboxEntry{s->Text(0), s->Int(1), s->Int(2)};
  s->Reset();
  return entry;
}

absl::StatusOr<std::optional<TombstoneRecord>> SqliteStore::ReadTombstone(
    const std::string& where_sql, int64_t instance_id, const std::string& tenant,
    const std::string& key) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT tenant, workflow, business_key, input_hash, "
                                   "final_state, external_ids, instance_id, finished_at, "
                                   "collected_at FROM tombstones WHERE " + where_sql));
  if (instance_id != 0) s->BindAll(instance_id); else s->BindAll(tenant, key);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  std::optional<TombstoneRecord> t;
  if (row) {
    t = TombstoneRecord{s->Text(0), s->Text(1), s->Text(2), s->Text(3),
                        static_cast<InstanceState>(s->Int(4)), s->Text(5), s->Int(6), s->Int(7),
                        s->Int(8)};
  }
  s->Reset();
  return t;
}

absl::StatusOr<std::vector<Lease>> SqliteStore::ClaimRunnable(const std::string& owner,
                                                              Millis now, Millis lease_duration,
                                                              int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Lease> leases;
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    // The same rows the claim below takes (one writer at a time): count those whose
    // lease ran out without being released.
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * takeovers,
        db_->Prepare("UPDATE counters SET value = value + (SELECT COUNT(*) FROM (SELECT "
                     "lease_owner FROM instances WHERE state IN (1, 3) AND next_run_at <= ?1 AND "
                     "lease_expires_at <= ?1 ORDER BY next_run_at LIMIT ?2) WHERE lease_owner <> "
                     "'') WHERE name = 'lease_takeovers'"));
    WS_RETURN_IF_ERROR(takeovers->BindAll(now, limit).Run());
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * s,
        db_->Prepare("UPDATE instances SET lease_owner = ?1, lease_expires_at = ?2 + ?3, "
                     "lease_epoch = lease_epoch + 1 WHERE id IN (SELECT id FROM instances "
                     "WHERE state IN (1, 3) AND next_run_at <= ?2 AND lease_expires_at <= ?2 "
                     "ORDER BY next_run_at LIMIT ?4) RETURNING id, lease_epoch"));
      s->BindAll(owner, now, lease_duration, limit);
    while (true) {
      WS_ASSIGN_OR_RETURN(bool row, s->Step());
      if (!row) break;
      leases.push_back({s->Int(0), s->Int(1), owner});
    }
    s->Reset();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return leases;
}

absl::StatusOr<Lease> SqliteStore::ClaimInstance(int64_t instance_id, const std::string& owner,
                                                 Millis now, Millis lease_duration) {
  std::lock_guard<std::mutex> lock(mu_);
  Lease lease;
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * takeover,
        db_->Prepare("UPDATE counters SET value = value + (SELECT COUNT(*) FROM instances WHERE "
                     "id = ?1 AND lease_expires_at <= ?2 AND lease_owner <> '') WHERE name = "
                     "'lease_takeovers'"));
    WS_RETURN_IF_ERROR(takeover->BindAll(instance_id, now).Run());
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * s,
        db_->Prepare("UPDATE instances SET lease_owner = ?1, lease_expires_at = ?2 + ?3, "
                     "lease_epoch = lease_epoch + 1 WHERE id = ?4 AND lease_expires_at <= ?2 "
                     "RETURNING id, lease_epoch"));
    s->BindAll(owner, now, lease_duration, instance_id);
    WS_ASSIGN_OR_RETURN(bool row, s->Step());
    if (row) lease = {s->Int(0), s->Int(1), owner};
    s->Reset();
    if (row) return absl::OkStatus();
    WS_ASSIGN_OR_RETURN(InstanceRecord record, LoadInstance("id = ?", instance_id, "", ""));
    return absl::FailedPreconditionError("instance " + record.key + " is leased by " +
                                         record.lease_owner + " until " +
                                         std::to_string(record.lease_expires_at));
  });
  if (!status.ok()) return status;
  return lease;
}

absl::StatusOr<std::vector<std::string>> SqliteStore::OwnersIn(const char* table, Millis now) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(std::string("SELECT DISTINCT lease_owner FROM ") + table +
                                   " WHERE lease_expires_at > ? AND lease_owner <> ''"));
  s->BindAll(now);
  return CollectRows(s, ReadText0);
}

absl::Status SqliteStore::ExpireIn(const char* table, const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(std::string("UPDATE ") + table + " SET lease_expires_at = 0 "
                                   "WHERE lease_owner = ? AND lease_expires_at > 0"));
  return s->BindAll(owner).Run();
}

absl::StatusOr<std::vector<std::string>> SqliteStore::LeaseOwners(Millis now) {
  return OwnersIn("instances", now);
}

absl::Status SqliteStore::ExpireLeases(const std::string& owner) {
  return ExpireIn("instances", owner);
}

absl::Status SqliteStore::InsertEvent(const EventRecord& e, int64_t instance_id, Millis now) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * event,
                      db_->Prepare("INSERT INTO outbox (event_id, instance_id, tenant, type, "
                                   "payload, created_at) VALUES (?, ?, ?, ?, ?, ?)"));
  return event->BindAll(e.event_id, instance_id, e.tenant, e.type, e.payload_json, now).Run();
}

absl::StatusOr<int64_t> SqliteStore::InsertAlert(const AlertRecord& a, int64_t instance_id,
                                                 Millis now) {
  WS_ASSIGN_OR_RETURN(SqliteStatement * alert,
                      db_->Prepare("INSERT INTO alerts (instance_id, tenant, step_name, kind, "
                                   "state, message, created_at, updated_at) VALUES "
                                   "(?, ?, ?, ?, ?, ?, ?, ?)"));
  WS_RETURN_IF_ERROR(alert
                         ->BindAll(instance_id, a.tenant, a.step, static_cast<int64_t>(a.kind),
                                   static_cast<int64_t>(AlertState::kOpen), a.message, now, now)
                         .Run());
  return db_->LastInsertRowId();
}

absl::Status SqliteStore::ApplyChange(const Change& c) {
  // Fencing first: nothing else is written unless this worker still holds the lease.
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * fence,
      db_->Prepare("UPDATE instances SET updated_at = ?1, lease_expires_at = ?2, "
                   "lease_owner = CASE WHEN ?2 = 0 THEN '' ELSE lease_owner END, "
                   "state = COALESCE(?3, state), status_reason = COALESCE(?4, status_reason), "
                   "next_run_at = COALESCE(?5, next_run_at) "
                   "WHERE id = ?6 AND lease_epoch = ?7 AND lease_owner = ?8"));
  fence->Bind(1, c.now).Bind(2, c.lease_expires_at);
  if (c.state) fence->Bind(3, static_cast<int64_t>(*c.state)); else fence->BindNull(3);
  if (c.status_reason) fence->Bind(4, std::string_view(*c.status_reason)); else fence->BindNull(4);
  if (c.next_run_at) fence->Bind(5, *c.next_run_at); else fence->BindNull(5);
  fence->Bind(6, c.lease.instance_id).Bind(7, c.lease.epoch).Bind(8, std::string_view(c.lease.owner));
  WS_RETURN_IF_ERROR(fence->Run());
  if (db_->Changes() != 1) {
    return absl::AbortedError("lease lost on instance " + std::to_string(c.lease.instance_id) +
                              " (epoch " + std::to_string(c.lease.epoch) + ")");
  }

  if (c.inbox) {
    WS_ASSIGN_OR_RETURN(SqliteStatement * claim,
                        db_->Prepare("INSERT OR IGNORE INTO inbox (tenant, source, event_id, "
                                     "data_hash, received_at, instance_id) VALUES (?, ?, ?, ?, ?, "
                                     "?)"));
    WS_RETURN_IF_ERROR(claim
                           ->BindAll(c.inbox->tenant, c.inbox->source, c.inbox->id,
                                     c.inbox->data_hash, c.now, c.lease.instance_id)
                           .Run());
    if (db_->Changes() == 0) {
      return absl::AlreadyExistsError("event " + c.inbox->source + " " + c.inbox->id +
                                      " was received before");
    }
  }
  if (c.resolve_alerts) {
    WS_ASSIGN_OR_RETURN(SqliteStatement * resolve,
                        db_->Prepare("UPDATE alerts SET state = 3, updated_at = ? WHERE "
                                     "instance_id = ? AND state IN (1, 2)"));
    WS_RETURN_IF_ERROR(resolve->BindAll(c.now, c.lease.instance_id).Run());
  }
  if (c.idempotency) {
    const IdempotencyClaim& claim = *c.idempotency;
    WS_ASSIGN_OR_RETURN(SqliteStatement * get,
                        db_->Prepare("SELECT request_hash, expires_at FROM idempotency_keys "
                                     "WHERE tenant = ? AND key = ?"));
    get->BindAll(claim.tenant, claim.key);
    WS_ASSIGN_OR_RETURN(bool row, get->Step());
    const std::string stored_hash = row ? get->Text(0) : "";
    const Millis expires_at = row ? get->Int(1) : 0;
    get->Reset();
    if (row && expires_at > c.now && stored_hash != claim.request_hash) {
      return absl::FailedPreconditionError(
          "idempotency key '" + claim.key + "' was used for request hash " +
          stored_hash.substr(0, 16) + "; this request has hash " +
          claim.request_hash.substr(0, 16) + " (the request changed under the same key)");
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * put,
                        db_->Prepare("INSERT INTO idempotency_keys VALUES (?, ?, ?, ?, ?, ?, ?) "
                                     "ON CONFLICT (tenant, key) DO UPDATE SET request_hash = "
                                     "excluded.request_hash, expires_at = excluded.expires_at"));
    WS_RETURN_IF_ERROR(put->BindAll(claim.tenant, claim.key, claim.request_hash,
                                    claim.instance_id, claim.step, c.now, claim.expires_at)
                           .Run());
  }

  WS_ASSIGN_OR_RETURN(
      SqliteStatement * step,
      db_->Prepare("UPDATE steps SET state = ?, attempts = ?, error_class = ?, error_message = ?, "
                   "external_id = ?, response_json = ?, idempotency_key = ?, request_hash = ?, "
                   "resolution = ?, unknowns = ?, lookups = ?, compensation_attempts = ?, "
                   "next_attempt_at = ?, started_at = ?, finished_at = ?, span_id = ?, unknown_since = ? "
                   "WHERE instance_id = ? AND step_index = ?"));
  for (const StepRecord& s : c.steps) {
    WS_RETURN_IF_ERROR(step->BindAll(static_cast<int64_t>(s.state), s.attempts,
                                     static_cast<int64_t>(s.error_class), s.error_message,
                                     s.external_id, s.response_json, s.idempotency_key,
                                     s.request_hash, static_cast<int64_t>(s.resolution),
                                     s.unknowns, s.lookups, s.compensation_attempts,
                                     s.next_attempt_at, s.started_at, s.finished_at, s.span_id,
                                     s.unknown_since, c.lease.instance_id, s.index)
                             .Run());
    if (db_->Changes() != 1) {
      return absl::InternalError("step " + std::to_string(s.index) + " of instance " +
                                 std::to_string(c.lease.instance_id) + " does not exist");
    }
    step->Reset();
  }

  if (!c.attempts.empty()) {
    // The store numbers a step's requests: 1, 2, ... in the order they were recorded.
    WS_ASSIGN_OR_RETURN(SqliteStatement * attempt,
                        db_->Prepare("INSERT INTO attempts SELECT ?1, ?2, COALESCE(MAX(seq), 0) + 1, "
                                     "?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10 FROM attempts WHERE "
                                     "instance_id = ?1 AND step_index = ?2"));
    for (const AttemptRecord& a : c.attempts) {
      WS_RETURN_IF_ERROR(attempt
                             ->BindAll(c.lease.instance_id, a.step_index,
                                       static_cast<int64_t>(a.phase), a.sent ? 1 : 0,
                                       static_cast<int64_t>(a.connection), a.status,
                                       static_cast<int64_t>(a.error_class), a.detail,
                                       a.started_at, a.finished_at)
                             .Run());
      attempt->Reset();
    }
  }
  for (const EventRecord& e : c.events) {
    WS_RETURN_IF_ERROR(InsertEvent(e, c.lease.instance_id, c.now));
  }
  for (const AlertRecord& a : c.alerts) {
    WS_RETURN_IF_ERROR(InsertAlert(a, c.lease.instance_id, c.now).status());
  }

  WS_ASSIGN_OR_RETURN(SqliteStatement * audit,
                      db_->Prepare("INSERT INTO audit_log (at, actor, tenant, instance_id, action, "
                                   "reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?)"));
  for (const AuditRecord& a : c.audits) {
    WS_RETURN_IF_ERROR(audit
                           ->BindAll(c.now, a.actor, a.tenant, c.lease.instance_id, a.action,
                                     a.reason, a.detail_json.empty() ? "{}" : a.detail_json)
                           .Run());
    audit->Reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::Status>> SqliteStore::Commit(const std::vector<Change>& changes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<absl::Status> results;
  results.reserve(changes.size());
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    for (const Change& change : changes) {
      WS_RETURN_IF_ERROR(db_->Exec("SAVEPOINT change"));
      absl::Status applied = ApplyChange(change);
      if (!applied.ok()) {
        // A lost lease, a key conflict or an event received before undoes this change
        // only; anything else (I/O, busy, bug) fails the whole group so every caller
        // retries.
        WS_RETURN_IF_ERROR(db_->Exec("ROLLBACK TO change"));
        if (!absl::IsAborted(applied) && !absl::IsFailedPrecondition(applied) &&
            !(absl::IsAlreadyExists(applied) && change.inbox)) {
          return applied;
        }
      }
      WS_RETURN_IF_ERROR(db_->Exec("RELEASE change"));
      results.push_back(applied);
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return results;
}

absl::StatusOr<InstanceRecord> SqliteStore::GetInstance(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  return LoadInstance("id = ?", id, "", "");
}

absl::StatusOr<InstanceRecord> SqliteStore::FindInstance(const std::string& tenant,
                                                         const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return LoadInstance("tenant = ? AND business_key = ?", 0, tenant, key);
}

absl::StatusOr<std::vector<StepRecord>> SqliteStore::GetSteps(int64_t instance_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(std::string("SELECT ") + kStepColumns +
                                   " FROM steps WHERE instance_id = ? ORDER BY step_index"));
  s->BindAll(instance_id);
  return CollectRows(s, ReadStep);
}

absl::StatusOr<std::vector<AttemptRecord>> SqliteStore::ListAttempts(int64_t instance_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT step_index, seq, phase, sent, connection, status, "
                                   "error_class, detail, started_at, finished_at FROM attempts "
                                   "WHERE instance_id = ? ORDER BY step_index, seq"));
  s->BindAll(instance_id);
  return CollectRows(s, [](const SqliteStatement& r) {
    return AttemptRecord{static_cast<int>(r.Int(0)), static_cast<int>(r.Int(1)),
                         static_cast<AttemptPhase>(r.Int(2)), r.Int(3) != 0,
                         static_cast<ConnectionUsed>(r.Int(4)), static_cast<int>(r.Int(5)),
                         static_cast<ErrorClass>(r.Int(6)), r.Text(7), r.Int(8), r.Int(9)};
  });
}

absl::StatusOr<TombstoneRecord> SqliteStore::FindTombstone(const std::string& tenant,
                                                           const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(std::optional<TombstoneRecord> t,
                      ReadTombstone("tenant = ? AND business_key = ?", 0, tenant, key));
  if (!t) return absl::NotFoundError("no tombstone for '" + key + "' in tenant '" + tenant + "'");
  return *t;
}

absl::StatusOr<std::vector<InstanceRecord>> SqliteStore::ListInstances(
    const InstanceFilter& filter) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db_->Prepare(std::string("SELECT ") + kInstanceColumns +
                   " FROM instances i WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR "
                   "workflow = ?2) AND (?3 IS NULL OR state = ?3) AND id > ?5 AND created_at >= "
                   "?6 AND (?7 = 0 OR created_at < ?7) AND (?8 IS NULL OR EXISTS (SELECT 1 FROM "
                   "steps s WHERE s.instance_id = i.id AND s.error_class = ?8)) AND (?9 = 0 OR "
                   "EXISTS (SELECT 1 FROM alerts a WHERE a.instance_id = i.id AND a.state IN "
                   "(1, 2) AND (?10 = 0 OR a.kind = ?10))) ORDER BY id LIMIT ?4"));
  if (filter.tenant) s->Bind(1, std::string_view(*filter.tenant)); else s->BindNull(1);
  if (filter.workflow) s->Bind(2, std::string_view(*filter.workflow)); else s->BindNull(2);
  if (filter.state) s->Bind(3, static_cast<int64_t>(*filter.state)); else s->BindNull(3);
  s->Bind(4, static_cast<int64_t>(filter.limit));
  s->Bind(5, filter.after_id).Bind(6, filter.created_from).Bind(7, filter.created_to);
  if (filter.error_class) s->Bind(8, static_cast<int64_t>(*filter.error_class)); else s->BindNull(8);
  s->Bind(9, static_cast<int64_t>(filter.with_alert || filter.alert_kind ? 1 : 0));
  s->Bind(10, static_cast<int64_t>(filter.alert_kind ? static_cast<int64_t>(*filter.alert_kind) : 0));
  return CollectRows(s, ReadInstance);
}

absl::StatusOr<std::vector<EventRecord>> SqliteStore::ListEvents(int64_t instance_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT seq, event_id, instance_id, tenant, type, payload, "
                                   "created_at FROM outbox WHERE instance_id = ? ORDER BY seq"));
  s->BindAll(instance_id);
  return CollectRows(s, ReadEvent);
}

absl::StatusOr<std::vector<AlertRecord>> SqliteStore::ListAlerts(int64_t instance_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT id, instance_id, tenant, step_name, kind, state, "
                                   "message, created_at FROM alerts WHERE (?1 = 0 OR "
                                   "instance_id = ?1) ORDER BY id"));
  s->BindAll(instance_id);
  std::vector<AlertRecord> out;
  while (true) {
    WS_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back({s->Int(0), s->Int(1), s->Text(2), s->Text(3),
                   static_cast<AlertKind>(s->Int(4)), static_cast<AlertState>(s->Int(5)),
                   s->Text(6), s->Int(7)});
  }
  s->Reset();
  return out;
}

absl::StatusOr<std::vector<AuditRecord>> SqliteStore::ListAudit(int64_t instance_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT seq, at, actor, tenant, instance_id, action, reason, "
                                   "detail FROM audit_log WHERE instance_id = ? ORDER BY seq"));
  s->BindAll(instance_id);
  std::vector<AuditRecord> out;
  while (true) {
    WS_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back({s->Int(0), s->Int(1), s->Text(2), s->Text(3), s->Int(4), s->Text(5),
                   s->Text(6), s->Text(7)});
  }
  s->Reset();
  return out;
}

absl::StatusOr<std::optional<IdempotencyClaim>> SqliteStore::GetIdempotencyClaim(
    const std::string& tenant, const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT request_hash, instance_id, step_name, expires_at FROM "
                                   "idempotency_keys WHERE tenant = ? AND key = ?"));
  s->BindAll(tenant, key);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  std::optional<IdempotencyClaim> claim;
  if (row) claim = IdempotencyClaim{tenant, key, s->Text(0), s->Int(1), s->Text(2), s->Int(3)};
  s->Reset();
  return claim;
}

absl::StatusOr<StoreSummary> SqliteStore::Summary() {
  std::lock_guard<std::mutex> lock(mu_);
  StoreSummary summary;
  WS_ASSIGN_OR_RETURN(SqliteStatement * by_state,
                      db_->Prepare("SELECT state, COUNT(*) FROM instances GROUP BY state "
                                   "ORDER BY state"));
  while (true) {
    WS_ASSIGN_OR_RETURN(bool row, by_state->Step());
    if (!row) break;
    summary.instances_by_state.emplace_back(static_cast<InstanceState>(by_state->Int(0)),
                                            by_state->Int(1));
  }
  by_state->Reset();
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * steps,
      db_->Prepare("SELECT COALESCE(SUM(MAX(attempts - 1, 0)), 0), COALESCE(SUM(unknowns), 0), "
                   "COALESCE(SUM(resolution = 1), 0), COALESCE(SUM(resolution = 2), 0), "
                   "COALESCE(SUM(state = 7), 0) FROM steps"));
  WS_ASSIGN_OR_RETURN(bool row, steps->Step());
  if (row) {
    summary.retries = steps->Int(0);
    summary.unknown_outcomes = steps->Int(1);
    summary.resolved_by_lookup = steps->Int(2);
    summary.resubmitted_after_lookup = steps->Int(3);
    summary.compensations = steps->Int(4);
  }
  steps->Reset();
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * counts,
      db_->Prepare("SELECT (SELECT COUNT(*) FROM alerts WHERE state = 1), (SELECT COUNT(*) FROM "
                   "outbox), (SELECT COALESCE(SUM(attempts), 0) FROM steps), (SELECT COUNT(*) "
                   "FROM steps WHERE resolution = 3), (SELECT COALESCE(SUM(compensation_attempts), "
                   "0) FROM steps), (SELECT COUNT(*) FROM steps WHERE state = 8), (SELECT value "
                   "FROM counters WHERE name = 'lease_takeovers'), (SELECT value FROM counters "
                   "WHERE name = 'inbox_duplicates')"));
  WS_ASSIGN_OR_RETURN(row, counts->Step());
  if (row) {
    summary.open_alerts = counts->Int(0);
    summary.outbox_events = counts->Int(1);
    summary.attempts = counts->Int(2);
    summary.resolved_by_operator = counts->Int(3);
    summary.compensation_attempts = counts->Int(4);
    summary.compensation_failures = counts->Int(5);
    summary.lease_takeovers = counts->Int(6);
    summary.inbox_duplicates = counts->Int(7);
  }
  counts->Reset();
  WS_ASSIGN_OR_RETURN(SqliteStatement * classes,
                      db_->Prepare("SELECT error_class, COUNT(*) FROM steps WHERE error_class > 0 "
                                   "GROUP BY error_class ORDER BY error_class"));
  while (true) {
    WS_ASSIGN_OR_RETURN(bool more, classes->Step());
    if (!more) break;
    summary.steps_by_error_class.emplace_back(static_cast<ErrorClass>(classes->Int(0)),
                                              classes->Int(1));
  }
  classes->Reset();
  WS_ASSIGN_OR_RETURN(SqliteStatement * states,
                      db_->Prepare("SELECT state, COUNT(*) FROM steps GROUP BY state ORDER BY "
                                   "state"));
  while (true) {
    WS_ASSIGN_OR_RETURN(bool more, states->Step());
    if (!more) break;
    summary.steps_by_state.emplace_back(static_cast<StepState>(states->Int(0)), states->Int(1));
  }
  states->Reset();
  return summary;
}

absl::StatusOr<std::optional<Millis>> SqliteStore::NextDueTime() {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT MIN(MAX(next_run_at, lease_expires_at)) FROM "
                                   "instances WHERE state IN (1, 3) AND next_run_at < 4000000000000000"));
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  std::optional<Millis> due;
  if (row && !s->IsNull(0)) due = s->Int(0);
  s->Reset();
  return due;
}

absl::StatusOr<int64_t> SqliteStore::OutboxCursor(const std::string& sink) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT last_seq FROM relay_cursors WHERE sink = ?"));
  s->BindAll(sink);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  const int64_t cursor = row ? s->Int(0) : 0;
  s->Reset();
  return cursor;
}

absl::StatusOr<std::vector<EventRecord>> SqliteStore::ReadOutbox(int64_t after_seq, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT seq, event_id, instance_id, tenant, type, payload, "
                                   "created_at FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?"));
  s->BindAll(after_seq, limit);
  return CollectRows(s, ReadEvent);
}

absl::Status SqliteStore::AddDeliveries(const std::string& sink, int64_t expected_cursor,
                                        int64_t new_cursor,
                                        const std::vector<std::pair<int64_t, int64_t>>& wanted,
                                        Millis now) {
  std::lock_guard<std::mutex> lock(mu_);
  return InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * get,
                        db_->Prepare("SELECT last_seq FROM relay_cursors WHERE sink = ?"));
    get->BindAll(sink);
    WS_ASSIGN_OR_RETURN(bool row, get->Step());
    const int64_t cursor = row ? get->Int(0) : 0;
    get->Reset();
    if (cursor != expected_cursor) {
      return absl::AbortedError("outbox cursor of sink " + sink + " moved");
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * insert,
                        db_->Prepare("INSERT OR IGNORE INTO deliveries (outbox_seq, sink, "
                                     "instance_id, state, created_at) VALUES (?, ?, ?, 1, ?)"));
    for (const auto& [seq, instance_id] : wanted) {
      WS_RETURN_IF_ERROR(insert->BindAll(seq, sink, instance_id, now).Run());
      insert->Reset();
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * move,
                        db_->Prepare("INSERT INTO relay_cursors VALUES (?, ?) ON CONFLICT (sink) "
                                     "DO UPDATE SET last_seq = excluded.last_seq"));
    return move->BindAll(sink, new_cursor).Run();
  });
}

absl::StatusOr<std::vector<DeliveryClaim>> SqliteStore::ClaimDeliveries(
    const std::string& owner, Millis now, Millis lease_duration, int limit,
    const std::vector<std::string>& sinks) {
  std::string sink_list = "[";
  for (size_t i = 0; i < sinks.size(); ++i) {
    if (i > 0) sink_list += ",";
    sink_list += "\"";
    for (char c : sinks[i]) {
      if (c == '"' || c == '\\') sink_list += '\\';
      sink_list += c;
    }
    sink_list += "\"";
  }
  sink_list += "]";
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<DeliveryClaim> claims;
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    // Only the oldest pending delivery of an instance per sink is eligible, so a
    // later event never overtakes an earlier one that is still being retried.
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * claim,
        db_->Prepare("UPDATE deliveries SET lease_owner = ?1, lease_expires_at = ?2 + ?3, "
                     "lease_epoch = lease_epoch + 1 WHERE id IN (SELECT d.id FROM deliveries d "
                     "WHERE d.state = 1 AND d.next_attempt_at <= ?2 AND d.lease_expires_at <= ?2 "
                     "AND d.sink IN (SELECT value FROM json_each(?5)) AND NOT EXISTS (SELECT 1 "
                     "FROM deliveries e WHERE e.sink = d.sink AND e.instance_id = d.instance_id "
                     "AND e.state = 1 AND e.outbox_seq < d.outbox_seq) ORDER BY d.outbox_seq "
                     "LIMIT ?4) RETURNING id, lease_epoch, sink, attempts, outbox_seq"));
    claim->BindAll(owner, now, lease_duration, limit, sink_list);
    std::vector<int64_t> seqs;
    while (true) {
      WS_ASSIGN_OR_RETURN(bool row, claim->Step());
      if (!row) break;
      DeliveryClaim c;
      c.id = claim->Int(0);
      c.epoch = claim->Int(1);
      c.owner = owner;
      c.sink = claim->Text(2);
      c.attempts = static_cast<int>(claim->Int(3));
      seqs.push_back(claim->Int(4));
      claims.push_back(std::move(c));
    }
    claim->Reset();
    WS_ASSIGN_OR_RETURN(SqliteStatement * event,
                        db_->Prepare("SELECT seq, event_id, instance_id, tenant, type, payload, "
                                     "created_at FROM outbox WHERE seq = ?"));
    for (size_t i = 0; i < claims.size(); ++i) {
      event->BindAll(seqs[i]);
      WS_ASSIGN_OR_RETURN(bool row, event->Step());
      if (!row) return absl::DataLossError("delivery of missing outbox row " + std::to_string(seqs[i]));
      claims[i].event = {event->Int(0), event->Text(1), event->Int(2), event->Text(3),
                         event->Text(4), event->Text(5), event->Int(6)};
      event->Reset();
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  // Deliver in outbox order: the RETURNING order is not guaranteed.
  std::sort(claims.begin(), claims.end(),
            [](const DeliveryClaim& a, const DeliveryClaim& b) { return a.event.seq < b.event.seq; });
  return claims;
}

absl::Status SqliteStore::FinishDelivery(const DeliveryClaim& claim, const DeliveryUpdate& u) {
  std::lock_guard<std::mutex> lock(mu_);
  return InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * finish,
        db_->Prepare("UPDATE deliveries SET state = ?1, attempts = ?2, next_attempt_at = ?3, "
                     "last_error = ?4, delivered_at = CASE WHEN ?1 = 2 THEN ?5 ELSE delivered_at "
                     "END, lease_owner = '', lease_expires_at = 0 WHERE id = ?6 AND "
                     "lease_epoch = ?7 AND lease_owner = ?8"));
    WS_RETURN_IF_ERROR(finish
                           ->BindAll(static_cast<int64_t>(u.state), u.attempts, u.next_attempt_at,
                                     u.error, u.now, claim.id, claim.epoch, claim.owner)
                           .Run());
    if (db_->Changes() != 1) {
      return absl::AbortedError("delivery " + std::to_string(claim.id) + " lease lost");
    }
    if (u.state == DeliveryState::kDelivered) {
      WS_ASSIGN_OR_RETURN(SqliteStatement * mark,
                          db_->Prepare("UPDATE outbox SET delivered_at = ?1 WHERE seq = ?2 AND "
                                       "NOT EXISTS (SELECT 1 FROM deliveries WHERE outbox_seq = "
                                       "?2 AND state <> 2)"));
      WS_RETURN_IF_ERROR(mark->BindAll(u.now, claim.event.seq).Run());
    }
    if (u.alert) WS_RETURN_IF_ERROR(InsertAlert(*u.alert, u.alert->instance_id, u.now).status());
    if (u.alert_event) {
      WS_RETURN_IF_ERROR(InsertEvent(*u.alert_event, u.alert_event->instance_id, u.now));
    }
    if (u.disable_sink) {
      WS_ASSIGN_OR_RETURN(SqliteStatement * disable,
                          db_->Prepare("INSERT INTO relay_sinks VALUES (?, 1, ?, ?) ON CONFLICT "
                                       "(sink) DO UPDATE SET disabled = 1, reason = "
                                       "excluded.reason, updated_at = excluded.updated_at"));
      WS_RETURN_IF_ERROR(disable->BindAll(claim.sink, u.error, u.now).Run());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> SqliteStore::DeliveryLeaseOwners(Millis now) {
  return OwnersIn("deliveries", now);
}

absl::Status SqliteStore::ExpireDeliveryLeases(const std::string& owner) {
  return ExpireIn("deliveries", owner);
}

absl::StatusOr<std::vector<std::string>> SqliteStore::DisabledSinks() {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT sink FROM relay_sinks WHERE disabled = 1"));
  return CollectRows(s, ReadText0);
}

absl::Status SqliteStore::EnableSink(const std::string& sink, Millis now) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("UPDATE relay_sinks SET disabled = 0, reason = 'enabled', "
                                   "updated_at = ? WHERE sink = ?"));
  return s->BindAll(now, sink).Run();
}

absl::StatusOr<std::vector<DeliveryRecord>> SqliteStore::ListDeliveries(int64_t instance_id) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db_->Prepare("SELECT d.id, d.outbox_seq, d.sink, d.state, d.attempts, d.next_attempt_at, "
                   "d.last_error, d.created_at, d.delivered_at, o.event_id, o.type FROM "
                   "deliveries d JOIN outbox o ON o.seq = d.outbox_seq WHERE d.instance_id = ? "
                   "ORDER BY d.outbox_seq, d.sink"));
  s->BindAll(instance_id);
  std::vector<DeliveryRecord> out;
  while (true) {
    WS_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back({s->Int(0), s->Int(1), s->Text(2), static_cast<DeliveryState>(s->Int(3)),
                   static_cast<int>(s->Int(4)), s->Int(5), s->Text(6), s->Int(7), s->Int(8),
                   s->Text(9), s->Text(10)});
  }
  s->Reset();
  return out;
}

absl::StatusOr<std::vector<SinkStats>> SqliteStore::DeliveryStats() {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db_->Prepare("SELECT d.sink, SUM(d.state = 1), SUM(d.state = 2), SUM(d.state = 3), "
                   "SUM(d.attempts) - SUM(d.state = 2), COALESCE(MIN(CASE WHEN d.state = 1 THEN "
                   "d.created_at END), 0), COALESCE((SELECT disabled FROM relay_sinks r WHERE "
                   "r.sink = d.sink), 0) FROM deliveries d GROUP BY d.sink ORDER BY d.sink"));
  std::vector<SinkStats> out;
  while (true) {
    WS_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back({s->Text(0), s->Int(1), s->Int(2), s->Int(3), s->Int(4), s->Int(5),
                   s->Int(6) != 0});
  }
  s->Reset();
  return out;
}

absl::StatusOr<std::vector<StaleUnknown>> SqliteStore::StaleUnknownSteps(Millis unknown_before) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(
      SqliteStatement * s,
      db_->Prepare("SELECT s.instance_id, i.tenant, s.name, s.unknown_since FROM steps s JOIN "
                   "instances i ON i.id = s.instance_id WHERE s.state = 5 AND s.unknown_since > 0 "
                   "AND s.unknown_since <= ?1 AND NOT EXISTS (SELECT 1 FROM alerts a WHERE "
                   "a.instance_id = s.instance_id AND a.step_name = s.name AND a.kind = 8 AND "
                   "a.created_at >= s.unknown_since)"));
  s->BindAll(unknown_before);
  std::vector<StaleUnknown> out;
  while (true) {
    WS_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) break;
    out.push_back({s->Int(0), s->Text(1), s->Text(2), s->Int(3)});
  }
  s->Reset();
  return out;
}

absl::StatusOr<int64_t> SqliteStore::RaiseAlert(const AlertRecord& alert, const EventRecord& event) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t id = 0;
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(id, InsertAlert(alert, alert.instance_id, alert.created_at));
    return InsertEvent(event, event.instance_id, alert.created_at);
  });
  if (!status.ok()) return status;
  return id;
}

absl::StatusOr<GcReport> SqliteStore::CollectGarbage(Millis finished_before, Millis now,
                                                     Millis protect_before, bool dry_run) {
  std::lock_guard<std::mutex> lock(mu_);
  GcReport report;
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_RETURN_IF_ERROR(db_->Exec("CREATE TEMP TABLE IF NOT EXISTS gc_ids (id INTEGER PRIMARY KEY)"));
    WS_RETURN_IF_ERROR(db_->Exec("DELETE FROM gc_ids"));
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * pick,
        db_->Prepare("INSERT INTO gc_ids SELECT id FROM instances i WHERE state IN (2, 4, 5, 7) "
                     "AND updated_at < ? AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE "
                     "d.instance_id = i.id AND d.state = 1)"));
    WS_RETURN_IF_ERROR(pick->BindAll(finished_before).Run());
    // ?1 = now, ?2 = protect_before. Inbox claims and tombstones are the protection
    // against late redeliveries: they go only past the protection window, and a
    // claim only once its instance is gone too.
    struct Part {
      const char* count_sql;
      const char* delete_sql;  // nullptr: counted only
      int64_t* field;
    };
    const Part parts[] = {
        {"SELECT COUNT(*) FROM gc_ids", nullptr, &report.tombstones_written},
        {"SELECT COUNT(*) FROM deliveries WHERE instance_id IN (SELECT id FROM gc_ids)",
         "DELETE FROM deliveries WHERE instance_id IN (SELECT id FROM gc_ids)", &report.deliveries},
        {"SELECT COUNT(*) FROM outbox WHERE instance_id IN (SELECT id FROM gc_ids)",
         "DELETE FROM outbox WHERE instance_id IN (SELECT id FROM gc_ids)", &report.events},
        {"SELECT COUNT(*) FROM steps WHERE instance_id IN (SELECT id FROM gc_ids)",
         "DELETE FROM steps WHERE instance_id IN (SELECT id FROM gc_ids)", &report.steps},
        {"SELECT COUNT(*) FROM alerts WHERE instance_id IN (SELECT id FROM gc_ids)",
         "DELETE FROM alerts WHERE instance_id IN (SELECT id FROM gc_ids)", &report.alerts},
        {"SELECT COUNT(*) FROM gc_ids",
         "DELETE FROM instances WHERE id IN (SELECT id FROM gc_ids)", &report.instances},
        {"SELECT COUNT(*) FROM idempotency_keys WHERE expires_at < ?1",
         "DELETE FROM idempotency_keys WHERE expires_at < ?1", &report.idempotency_keys},
        {"SELECT COUNT(*) FROM inbox WHERE received_at < ?2 AND (instance_id IS NULL OR "
         "instance_id IN (SELECT id FROM gc_ids) OR instance_id NOT IN (SELECT id FROM instances))",
         "DELETE FROM inbox WHERE received_at < ?2 AND (instance_id IS NULL OR instance_id NOT IN "
         "(SELECT id FROM instances))",
         &report.inbox_claims},
        {"SELECT COUNT(*) FROM tombstones WHERE collected_at < ?2",
         "DELETE FROM tombstones WHERE collected_at < ?2", &report.tombstones},
    };
    for (const Part& part : parts) {
      WS_ASSIGN_OR_RETURN(SqliteStatement * count, db_->Prepare(part.count_sql));
      if (std::string_view(part.count_sql).find("?1") != std::string_view::npos) count->Bind(1, now);
      if (std::string_view(part.count_sql).find("?2") != std::string_view::npos) {
        count->Bind(2, protect_before);
      }
      WS_ASSIGN_OR_RETURN(bool row, count->Step());
      *part.field = row ? count->Int(0) : 0;
      count->Reset();
    }
    if (dry_run) return absl::OkStatus();
    // Tombstones first (they read the instances and steps about to go); old ones
    // past the window go before new ones are written, so a fresh one is never lost.
    WS_ASSIGN_OR_RETURN(SqliteStatement * expired,
                        db_->Prepare("DELETE FROM tombstones WHERE collected_at < ?"));
    WS_RETURN_IF_ERROR(expired->BindAll(protect_before).Run());
    WS_ASSIGN_OR_RETURN(
        SqliteStatement * bury,
        db_->Prepare("INSERT OR REPLACE INTO tombstones SELECT tenant, business_key, workflow, "
                     "input_hash, state, COALESCE((SELECT json_group_object(s.name, "
                     "s.external_id) FROM steps s WHERE s.instance_id = i.id AND s.external_id "
                     "<> ''), '{}'), id, updated_at, ? FROM instances i WHERE id IN (SELECT id "
                     "FROM gc_ids)"));
    WS_RETURN_IF_ERROR(bury->BindAll(now).Run());
    WS_RETURN_IF_ERROR(db_->Exec("DELETE FROM attempts WHERE instance_id IN (SELECT id FROM gc_ids)"));
    for (const Part& part : parts) {
      if (part.delete_sql == nullptr || part.field == &report.tombstones) continue;
      WS_ASSIGN_OR_RETURN(SqliteStatement * remove, db_->Prepare(part.delete_sql));
      if (std::string_view(part.delete_sql).find("?1") != std::string_view::npos) {
        remove->Bind(1, now);
      }
      if (std::string_view(part.delete_sql).find("?2") != std::string_view::npos) {
        remove->Bind(2, protect_before);
      }
      WS_RETURN_IF_ERROR(remove->Run());
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * requests,
                        db_->Prepare("DELETE FROM api_requests WHERE expires_at < ?"));
    return requests->BindAll(now).Run();
  });
  if (!status.ok()) return status;
  return report;
}

absl::Status SqliteStore::PutToken(const TokenRecord& t) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("INSERT INTO api_tokens (token_hash, name, tenant, role, "
                                   "created_at, revoked_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)"));
  auto status =
      s->BindAll(t.token_hash, t.name, t.tenant, t.role, t.created_at, t.revoked_at, t.expires_at)
          .Run();
  if (status.code() == absl::StatusCode::kAlreadyExists ||
      (!status.ok() && std::string(status.message()).find("UNIQUE") != std::string::npos)) {
    return absl::AlreadyExistsError("a token named '" + t.name + "' exists");
  }
  return status;
}

namespace {
constexpr const char* kTokenColumns =
    "SELECT token_hash, name, tenant, role, created_at, revoked_at, expires_at FROM api_tokens ";
TokenRecord TokenRow(SqliteStatement* s) {
  return TokenRecord{s->Text(0), s->Text(1), s->Text(2), s->Text(3),
                     s->Int(4),  s->Int(5),  s->Int(6)};
}
}  // namespace

absl::StatusOr<TokenRecord> SqliteStore::FindToken(const std::string& token_hash) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(std::string(kTokenColumns) + "WHERE token_hash = ?"));
  s->BindAll(token_hash);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) {
    s->Reset();
    return absl::NotFoundError("no such token");
  }
  TokenRecord t = TokenRow(s);
  s->Reset();
  return t;
}

absl::StatusOr<std::vector<TokenRecord>> SqliteStore::ListTokens() {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(std::string(kTokenColumns) + "ORDER BY name"));
  std::vector<TokenRecord> out;
  while (true) {
    auto row = s->Step();
    if (!row.ok()) {
      s->Reset();
      return row.status();
    }
    if (!*row) break;
    out.push_back(TokenRow(s));
  }
  s->Reset();
  return out;
}

absl::StatusOr<std::string> SqliteStore::ServerKey(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT value FROM server_keys WHERE name = ?"));
  s->BindAll(name);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  std::string value = row ? s->Text(0) : "";
  s->Reset();
  if (!row) return absl::NotFoundError("no server key '" + name + "'");
  return value;
}

absl::Status SqliteStore::RevokeToken(const std::string& name, Millis now) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * find,
                      db_->Prepare("SELECT revoked_at FROM api_tokens WHERE name = ?"));
  find->BindAll(name);
  WS_ASSIGN_OR_RETURN(bool row, find->Step());
  const Millis revoked = row ? find->Int(0) : 0;
  find->Reset();
  if (!row) return absl::NotFoundError("no token named '" + name + "'");
  if (revoked != 0) return absl::FailedPreconditionError("token '" + name + "' is revoked already");
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("UPDATE api_tokens SET revoked_at = ? WHERE name = ?"));
  return s->BindAll(now, name).Run();
}

absl::StatusOr<AlertRecord> SqliteStore::GetAlert(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT id, instance_id, tenant, step_name, kind, state, "
                                   "message, created_at FROM alerts WHERE id = ?"));
  s->BindAll(id);
  WS_ASSIGN_OR_RETURN(bool row, s->Step());
  if (!row) {
    s->Reset();
    return absl::NotFoundError("no alert " + std::to_string(id));
  }
  AlertRecord a{s->Int(0), s->Int(1), s->Text(2), s->Text(3), static_cast<AlertKind>(s->Int(4)),
                static_cast<AlertState>(s->Int(5)), s->Text(6), s->Int(7)};
  s->Reset();
  return a;
}

absl::Status SqliteStore::AcknowledgeAlert(int64_t id, const AuditRecord& audit) {
  std::lock_guard<std::mutex> lock(mu_);
  return InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * ack,
                        db_->Prepare("UPDATE alerts SET state = 2, updated_at = ? WHERE id = ? "
                                     "AND state = 1"));
    WS_RETURN_IF_ERROR(ack->BindAll(audit.at, id).Run());
    if (db_->Changes() != 1) {
      return absl::FailedPreconditionError("the alert is not open");  // no database id: callers show public ones
    }
    WS_ASSIGN_OR_RETURN(SqliteStatement * log,
                        db_->Prepare("INSERT INTO audit_log (at, actor, tenant, instance_id, "
                                     "action, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?)"));
    return log->BindAll(audit.at, audit.actor, audit.tenant, audit.instance_id, audit.action,
                        audit.reason, audit.detail_json.empty() ? "{}" : audit.detail_json)
        .Run();
  });
}

absl::StatusOr<ApiRequestClaim> SqliteStore::BeginApiRequest(const ApiRequestRecord& request,
                                                             Millis stale_before,
                                                             const std::string& dead_owner) {
  std::lock_guard<std::mutex> lock(mu_);
  ApiRequestClaim claim;
  absl::Status status = InWriteTransaction(*db_, [&]() -> absl::Status {
    WS_ASSIGN_OR_RETURN(SqliteStatement * get,
                        db_->Prepare("SELECT request_hash, done, status, content_type, body, "
                                     "created_at, expires_at, owner FROM api_requests WHERE "
                                     "tenant = ? AND key = ?"));
    get->BindAll(request.tenant, request.key);
    WS_ASSIGN_OR_RETURN(bool row, get->Step());
    std::optional<ApiRequestRecord> stored;
    if (row) {
      stored = ApiRequestRecord{request.tenant, request.key, get->Text(0), get->Int(1) != 0,
                                static_cast<int>(get->Int(2)), get->Text(3), get->Text(4),
                                get->Int(5), get->Int(6), get->Text(7)};
    }
    get->Reset();
    claim = DecideApiRequest(stored, request, stale_before, dead_owner);
    if (claim.outcome != ApiRequestOutcome::kNew) return absl::OkStatus();
    WS_ASSIGN_OR_RETURN(SqliteStatement * put,
                        db_->Prepare("INSERT OR REPLACE INTO api_requests (tenant, key, "
                                     "request_hash, created_at, expires_at, owner) VALUES (?, ?, "
                                     "?, ?, ?, ?)"));
    return put->BindAll(request.tenant, request.key, request.request_hash, request.created_at,
                        request.expires_at, request.owner)
        .Run();
  });
  if (!status.ok()) return status;
  return claim;
}

absl::Status SqliteStore::FinishApiRequest(const ApiRequestRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("UPDATE api_requests SET done = 1, status = ?, content_type = "
                                   "?, body = ? WHERE tenant = ? AND key = ? AND request_hash = ?"));
  return s->BindAll(r.status, r.content_type, r.body, r.tenant, r.key, r.request_hash).Run();
}

absl::Status SqliteStore::AbandonApiRequest(const std::string& tenant, const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("DELETE FROM api_requests WHERE tenant = ? AND key = ? AND "
                                   "done = 0"));
  return s->BindAll(tenant, key).Run();
}

absl::StatusOr<std::optional<InboxEntry>> SqliteStore::LookupInbox(const std::string& tenant,
                                                                   const std::string& source,
                                                                   const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return ReadInbox(tenant, source, id);
}

absl::Status SqliteStore::AddToCounter(const std::string& name, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("UPDATE counters SET value = value + ? WHERE name = ?"));
  return s->BindAll(delta, name).Run();
}

}  // namespace waystone
