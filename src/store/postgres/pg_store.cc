#include "store/postgres/pg_store.h"

#include <poll.h>

#include <algorithm>

#include "base/status_macros.h"
#include "store/migration.h"
#include "store/postgres/pg_connection.h"
#include "store/start_decision.h"

namespace waystone {
namespace {

// Any key shared by every Waystone process: serialises migrations.
constexpr int64_t kMigrationLock = 0x57415953544f4e45;  // "WAYSTONE"

constexpr char kInstanceColumns[] =
    "id, tenant, business_key, workflow, definition_hash, input_json, input_hash, state, "
    "status_reason, next_run_at, lease_owner, lease_expires_at, lease_epoch, trace_id, "
    "source_event, created_at, updated_at";

InstanceRecord ReadInstance(const PgResult& r, int row) {
  InstanceRecord i;
  i.id = r.Int(row, 0);
  i.tenant = r.Text(row, 1);
  i.key = r.Text(row, 2);
  i.workflow = r.Text(row, 3);
  i.definition_hash = r.Text(row, 4);
  i.input_json = r.Text(row, 5);
  i.input_hash = r.Text(row, 6);
  i.state = static_cast<InstanceState>(r.Int(row, 7));
  i.status_reason = r.Text(row, 8);
  i.next_run_at = r.Int(row, 9);
  i.lease_owner = r.Text(row, 10);
  i.lease_expires_at = r.Int(row, 11);
  i.lease_epoch = r.Int(row, 12);
  i.trace_id = r.Text(row, 13);
  i.source_event = r.Text(row, 14);
  i.created_at = r.Int(row, 15);
  i.updated_at = r.Int(row, 16);
  return i;
}

constexpr char kStepColumns[] =
    "instance_id, step_index, name, state, attempts, error_class, error_message, external_id, "
    "response_json, idempotency_key, request_hash, resolution, unknowns, lookups, "
    "compensation_attempts, next_attempt_at, started_at, finished_at, span_id, unknown_since";

StepRecord ReadStep(const PgResult& r, int row) {
  StepRecord s;
  s.instance_id = r.Int(row, 0);
  s.index = static_cast<int>(r.Int(row, 1));
  s.name = r.Text(row, 2);
  s.state = static_cast<StepState>(r.Int(row, 3));
  s.attempts = static_cast<int>(r.Int(row, 4));
  s.error_class = static_cast<ErrorClass>(r.Int(row, 5));
  s.error_message = r.Text(row, 6);
  s.external_id = r.Text(row, 7);
  s.response_json = r.Text(row, 8);
  s.idempotency_key = r.Text(row, 9);
  s.request_hash = r.Text(row, 10);
  s.resolution = static_cast<Resolution>(r.Int(row, 11));
  s.unknowns = static_cast<int>(r.Int(row, 12));
  s.lookups = static_cast<int>(r.Int(row, 13));
  s.compensation_attempts = static_cast<int>(r.Int(row, 14));
  s.next_attempt_at = r.Int(row, 15);
  s.started_at = r.Int(row, 16);
  s.finished_at = r.Int(row, 17);
  s.span_id = r.Text(row, 18);
  s.unknown_since = r.Int(row, 19);
  return s;
}

EventRecord ReadEvent(const PgResult& r, int row) {
  return {r.Int(row, 0), r.Text(row, 1), r.Int(row, 2), r.Text(row, 3),
          r.Text(row, 4), r.Text(row, 5), r.Int(row, 6)};
}

template <typename Read>
auto Rows(const PgResult& r, Read read) -> std::vector<decltype(read(r, 0))> {
  std::vector<decltype(read(r, 0))> out;
  out.reserve(static_cast<size_t>(r.rows()));
  for (int i = 0; i < r.rows(); ++i) out.push_back(read(r, i));
  return out;
}

std::string ReadText0(const PgResult& r, int row) { return r.Text(row, 0); }

absl::Status InsertEvent(PgConnection& c, const EventRecord& e, int64_t instance_id, Millis now) {
  return c.Query("INSERT INTO outbox (event_id, instance_id, tenant, type, payload, created_at) "
                 "VALUES ($1, $2::bigint, $3, $4, $5, $6::bigint)",
                 Params(e.event_id, instance_id, e.tenant, e.type, e.payload_json, now))
      .status();
}

absl::StatusOr<int64_t> InsertAlert(PgConnection& c, const AlertRecord& a, int64_t instance_id,
                                    Millis now) {
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c.Query("INSERT INTO alerts (instance_id, tenant, step_name, kind, state, message, "
              "created_at, updated_at) VALUES ($1::bigint, $2, $3, $4::smallint, $5::smallint, $6, "
              "$7::bigint, $7::bigint) RETURNING id",
              Params(instance_id, a.tenant, a.step, static_cast<int64_t>(a.kind),
                     static_cast<int64_t>(AlertState::kOpen), a.message, now)));
  return r.Int(0, 0);
}

absl::StatusOr<InstanceRecord> LoadInstance(PgConnection& c, int64_t id) {
  WS_ASSIGN_OR_RETURN(PgResult r, c.Query(std::string("SELECT ") + kInstanceColumns +
                                              " FROM instances WHERE id = $1::bigint",
                                          Params(id)));
  if (r.rows() == 0) return absl::NotFoundError("no instance with id " + std::to_string(id));
  return ReadInstance(r, 0);
}

}  // namespace

// A connection on loan from the pool.
class PostgresStore::Lent {
 public:
  Lent(PostgresStore* store, std::unique_ptr<PgConnection> c) : store_(store), c_(std::move(c)) {}
  Lent(Lent&&) = default;
  ~Lent() {
    if (c_) store_->Release(std::move(c_));
  }
  PgConnection& operator*() { return *c_; }
  PgConnection* operator->() { return c_.get(); }

 private:
  PostgresStore* store_;
  std::unique_ptr<PgConnection> c_;
};

PostgresStore::PostgresStore(std::string conninfo, int max_connections)
    : conninfo_(std::move(conninfo)), max_connections_(max_connections) {}

PostgresStore::~PostgresStore() = default;

absl::StatusOr<PostgresStore::Lent> PostgresStore::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      if (!c->broken()) return Lent(this, std::move(c));
    }
    if (std::chrono::steady_clock::now() < next_connect_) {
      return absl::UnavailableError("PostgreSQL unreachable; reconnecting with backoff (" +
                                    std::to_string(connect_backoff_ms_) + "ms)");
    }
  }
  auto c = PgConnection::Connect(conninfo_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!c.ok()) {
    connect_backoff_ms_ = std::clamp<int64_t>(connect_backoff_ms_ * 2, 50, 2000);
    next_connect_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(connect_backoff_ms_);
    return c.status();
  }
  connect_backoff_ms_ = 0;
  return Lent(this, std::move(*c));
}

void PostgresStore::Release(std::unique_ptr<PgConnection> connection) {
  if (connection->broken()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(idle_.size()) < max_connections_) idle_.push_back(std::move(connection));
}

template <typename Body>
absl::Status PostgresStore::InTransaction(Body&& body) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_RETURN_IF_ERROR(c->Exec("BEGIN"));
  absl::Status status = body(*c);
  if (status.ok()) status = c->Exec("COMMIT");
  if (!status.ok()) (void)c->Exec("ROLLBACK");
  return status;
}

absl::StatusOr<std::unique_ptr<PostgresStore>> PostgresStore::Open(const std::string& conninfo,
                                                                   int max_connections) {
  auto store = std::unique_ptr<PostgresStore>(new PostgresStore(conninfo, max_connections));
  WS_RETURN_IF_ERROR(store->Migrate());
  return store;
}

absl::Status PostgresStore::Migrate() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  // A session lock: held across the migration transactions, released below.
  WS_RETURN_IF_ERROR(c->Query("SELECT pg_advisory_lock($1::bigint)", Params(kMigrationLock)).status());
  absl::Status status = [&]() -> absl::Status {
    WS_RETURN_IF_ERROR(c->Exec("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER "
                               "PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"));
    WS_ASSIGN_OR_RETURN(PgResult r,
                        c->Query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"));
    const int current = static_cast<int>(r.Int(0, 0));
    const auto& migrations = postgres_migrations();
    const int newest = migrations.empty() ? 0 : migrations.back().version;
    if (current > newest) {
      return absl::FailedPreconditionError(
          "database schema is version " + std::to_string(current) +
          " but this build knows only up to " + std::to_string(newest) + "; use a newer waystone");
    }
    for (const auto& migration : migrations) {
      if (migration.version <= current) continue;
      WS_RETURN_IF_ERROR(c->Exec("BEGIN"));
      absl::Status applied = c->Exec(std::string(migration.sql));
      if (applied.ok()) {
        applied = c->Query("INSERT INTO schema_migrations VALUES ($1::integer, $2, "
                           "(extract(epoch from now()) * 1000)::bigint)",
                           Params(migration.version, migration.name))
                      .status();
      }
      if (applied.ok()) applied = c->Exec("COMMIT");
      if (!applied.ok()) {
        (void)c->Exec("ROLLBACK");
        return applied;
      }
    }
    return absl::OkStatus();
  }();
  (void)c->Query("SELECT pg_advisory_unlock($1::bigint)", Params(kMigrationLock));
  return status;
}

absl::StatusOr<int> PostgresStore::SchemaVersion() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"));
  return static_cast<int>(r.Int(0, 0));
}

absl::Status PostgresStore::PutDefinition(const std::string& hash, const std::string& workflow,
                                          const std::string& source, const std::string& text,
                                          Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c->Query("INSERT INTO definitions VALUES ($1, $2, $3, $4, $5::bigint) ON CONFLICT DO "
                  "NOTHING",
                  Params(hash, workflow, source, text, now))
      .status();
}

absl::StatusOr<std::string> PostgresStore::GetDefinition(const std::string& hash) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT body FROM definitions WHERE hash = $1", Params(hash)));
  if (r.rows() == 0) return absl::NotFoundError("no definition with hash " + hash);
  return r.Text(0, 0);
}

namespace {

constexpr char kCollectedMeanwhile[] = "collected by a concurrent gc; start again";

constexpr char kTombstoneColumns[] =
    "tenant, workflow, business_key, input_hash, final_state, external_ids, instance_id, "
    "finished_at, collected_at";

TombstoneRecord ReadTombstone(const PgResult& r, int i) {
  return {r.Text(i, 0), r.Text(i, 1), r.Text(i, 2), r.Text(i, 3),
          static_cast<InstanceState>(r.Int(i, 4)), r.Text(i, 5), r.Int(i, 6), r.Int(i, 7),
          r.Int(i, 8)};
}

absl::StatusOr<std::optional<InboxEntry>> ReadInbox(PgConnection& c, const std::string& tenant,
                                                    const std::string& source,
                                                    const std::string& id) {
  WS_ASSIGN_OR_RETURN(PgResult r, c.Query("SELECT data_hash, COALESCE(instance_id, 0), "
                                          "received_at FROM inbox WHERE tenant = $1 AND source = "
                                          "$2 AND event_id = $3",
                                          Params(tenant, source, id)));
  if (r.rows() == 0) return std::optional<InboxEntry>();
  return std::optional<InboxEntry>(InboxEntry{r.Text(0, 0), r.Int(0, 1), r.Int(0, 2)});
}

}  // namespace

absl::StatusOr<StartResult> PostgresStore::StartInstance(const NewInstance& in) {
  StartResult result;
  absl::Status status;
  for (int round = 0; round < 3; ++round) {
    status = StartOnce(in, &result);
    if (!(absl::IsAborted(status) && status.message() == kCollectedMeanwhile)) break;
  }
  if (!status.ok()) return status;
  return result;
}

absl::Status PostgresStore::StartOnce(const NewInstance& in, StartResult* out) {
  StartResult& result = *out;
  return InTransaction([&](PgConnection& c) -> absl::Status {
    result = StartResult{};
    const bool has_event = !in.event_source.empty() && !in.event_id.empty();
    if (has_event) {
      WS_ASSIGN_OR_RETURN(PgResult claim,
                          c.Query("INSERT INTO inbox (tenant, source, event_id, data_hash, "
                                  "received_at) VALUES ($1, $2, $3, $4, $5::bigint) ON CONFLICT "
                                  "DO NOTHING",
                                  Params(in.tenant, in.event_source, in.event_id,
                                         in.event_data_hash, in.now)));
      if (claim.affected() == 0) {
        WS_ASSIGN_OR_RETURN(std::optional<InboxEntry> prior,
                            ReadInbox(c, in.tenant, in.event_source, in.event_id));
        if (!prior) return absl::UnavailableError("inbox claim not visible yet; retry");
        result.outcome = DecideClaimedEvent(*prior, in.event_data_hash);
        result.stored_data_hash = prior->data_hash;
        auto instance = LoadInstance(c, prior->instance_id);
        if (instance.ok()) {
          result.instance = *instance;
        } else if (absl::IsNotFound(instance.status())) {
          WS_ASSIGN_OR_RETURN(PgResult t, c.Query(std::string("SELECT ") + kTombstoneColumns +
                                                      " FROM tombstones WHERE instance_id = "
                                                      "$1::bigint",
                                                  Params(prior->instance_id)));
          if (t.rows() > 0) {
            result.tombstone = ReadTombstone(t, 0);
            result.instance = InstanceFromTombstone(*result.tombstone);
          }
        } else {
          return instance.status();
        }
        if (result.outcome == StartOutcome::kEventConflict) return absl::OkStatus();
        return c.Exec("UPDATE counters SET value = value + 1 WHERE name = 'inbox_duplicates'");
      }
    }
    WS_ASSIGN_OR_RETURN(PgResult buried, c.Query(std::string("SELECT ") + kTombstoneColumns +
                                                     " FROM tombstones WHERE tenant = $1 AND "
                                                     "business_key = $2",
                                                 Params(in.tenant, in.key)));
    if (buried.rows() > 0) {
      result.tombstone = ReadTombstone(buried, 0);
    }
    std::optional<int64_t> created;
    if (!result.tombstone) {
      // ON CONFLICT makes concurrent identical starts wait for each other instead of failing.
      const std::string source_event = has_event ? in.event_source + " " + in.event_id : "";
      WS_ASSIGN_OR_RETURN(
          PgResult inserted,
          c.Query("INSERT INTO instances (tenant, business_key, workflow, definition_hash, "
                  "input_json, input_hash, state, next_run_at, trace_id, source_event, created_at, "
                  "updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7::smallint, $8::bigint, $9, $10, "
                  "$8::bigint, $8::bigint) ON CONFLICT (tenant, business_key) DO NOTHING RETURNING id",
                  Params(in.tenant, in.key, in.workflow, in.definition_hash, in.input_json,
                         in.input_hash, static_cast<int64_t>(InstanceState::kRunning), in.now,
                         in.trace_id, source_event)));
      if (inserted.rows() > 0) created = inserted.Int(0, 0);
      if (created) {
        // The insert may have waited for a gc that removed an instance with this key
        // and buried it meanwhile: a tombstone now visible wins (undo, start over).
        WS_ASSIGN_OR_RETURN(PgResult late, c.Query("SELECT 1 FROM tombstones WHERE tenant = $1 AND "
                                                   "business_key = $2",
                                                   Params(in.tenant, in.key)));
        if (late.rows() > 0) return absl::AbortedError(kCollectedMeanwhile);
      }
    }
    if (created) {
      const int64_t id = *created;
      for (size_t i = 0; i < in.step_names.size(); ++i) {
        WS_RETURN_IF_ERROR(c.Query("INSERT INTO steps (instance_id, step_index, name, state) "
                                   "VALUES ($1::bigint, $2::integer, $3, $4::smallint)",
                                   Params(id, static_cast<int64_t>(i), in.step_names[i],
                                          static_cast<int64_t>(StepState::kPending)))
                               .status());
      }
      WS_RETURN_IF_ERROR(InsertEvent(c, in.started_event, id, in.now));
      // Wakes idle workers when the transaction commits.
      WS_RETURN_IF_ERROR(c.Query("SELECT pg_notify('waystone_work', '')").status());
      result.outcome = StartOutcome::kCreated;
      WS_ASSIGN_OR_RETURN(result.instance, LoadInstance(c, id));
    } else if (result.tombstone) {
      WS_RETURN_IF_ERROR(CheckStartAgainst(result.tombstone->workflow,
                                           result.tombstone->input_hash, in, true));
      result.outcome = StartOutcome::kCollected;
      result.instance = InstanceFromTombstone(*result.tombstone);
    } else {
      WS_ASSIGN_OR_RETURN(PgResult existing,
                          c.Query(std::string("SELECT ") + kInstanceColumns +
                                      " FROM instances WHERE tenant = $1 AND business_key = $2",
                                  Params(in.tenant, in.key)));
      if (existing.rows() == 0) return absl::UnavailableError("instance not visible yet; retry");
      InstanceRecord record = ReadInstance(existing, 0);
      WS_RETURN_IF_ERROR(CheckStartAgainst(record.workflow, record.input_hash, in, false));
      result.outcome = StartOutcome::kExisting;
      result.instance = record;
    }
    if (has_event) {
      WS_RETURN_IF_ERROR(c.Query("UPDATE inbox SET instance_id = $1::bigint WHERE tenant = $2 "
                                 "AND source = $3 AND event_id = $4",
                                 Params(result.instance.id, in.tenant, in.event_source,
                                        in.event_id))
                             .status());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<Lease>> PostgresStore::ClaimRunnable(const std::string& owner,
                                                                Millis now, Millis lease_duration,
                                                                int limit) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("WITH picked AS (SELECT id, lease_owner AS previous FROM instances WHERE state "
               "IN (1, 3) AND next_run_at <= $2::bigint AND lease_expires_at <= $2::bigint ORDER BY "
               "next_run_at LIMIT $4::integer FOR UPDATE SKIP LOCKED) UPDATE instances i SET "
               "lease_owner = $1, lease_expires_at = $2::bigint + $3::bigint, lease_epoch = "
               "i.lease_epoch + 1 FROM picked WHERE i.id = picked.id RETURNING i.id, "
               "i.lease_epoch, picked.previous",
               Params(owner, now, lease_duration, limit)));
  std::vector<Lease> leases;
  int64_t takeovers = 0;
  for (int i = 0; i < r.rows(); ++i) {
    leases.push_back({r.Int(i, 0), r.Int(i, 1), owner});
    if (!r.Text(i, 2).empty()) ++takeovers;
  }
  if (takeovers > 0) {
    // Rare (a worker died or stalled); best effort: the claim already committed.
    (void)c->Query("UPDATE counters SET value = value + $1::bigint WHERE name = 'lease_takeovers'",
                   Params(takeovers));
  }
  return leases;
}

absl::StatusOr<Lease> PostgresStore::ClaimInstance(int64_t instance_id, const std::string& owner,
                                                   Millis now, Millis lease_duration) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("WITH picked AS (SELECT id, lease_owner AS previous FROM instances WHERE id = "
               "$4::bigint AND lease_expires_at <= $2::bigint FOR UPDATE) UPDATE instances i SET "
               "lease_owner = $1, lease_expires_at = $2::bigint + $3::bigint, lease_epoch = "
               "i.lease_epoch + 1 FROM picked WHERE i.id = picked.id AND i.lease_expires_at <= "
               "$2::bigint RETURNING i.id, i.lease_epoch, picked.previous",
               Params(owner, now, lease_duration, instance_id)));
  if (r.rows() == 1) {
    if (!r.Text(0, 2).empty()) {
      (void)c->Query("UPDATE counters SET value = value + 1 WHERE name = 'lease_takeovers'");
    }
    return Lease{r.Int(0, 0), r.Int(0, 1), owner};
  }
  WS_ASSIGN_OR_RETURN(InstanceRecord record, LoadInstance(*c, instance_id));
  return absl::FailedPreconditionError("instance " + record.key + " is leased by " +
                                       record.lease_owner + " until " +
                                       std::to_string(record.lease_expires_at));
}

absl::StatusOr<std::vector<std::string>> PostgresStore::LeaseOwners(Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT DISTINCT lease_owner FROM instances WHERE "
                                           "lease_expires_at > $1::bigint AND lease_owner <> ''",
                                           Params(now)));
  return Rows(r, ReadText0);
}

absl::Status PostgresStore::ExpireLeases(const std::string& owner) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c->Query("UPDATE instances SET lease_expires_at = 0 WHERE lease_owner = $1 AND "
                  "lease_expires_at > 0",
                  Params(owner))
      .status();
}

absl::Status PostgresStore::ApplyChange(PgConnection& c, const Change& ch) {
  WS_ASSIGN_OR_RETURN(
      PgResult fence,
      c.Query("UPDATE instances SET updated_at = $1::bigint, lease_expires_at = $2::bigint, "
              "lease_owner = CASE WHEN $2::bigint = 0 THEN '' ELSE lease_owner END, "
              "state = COALESCE($3::smallint, state), status_reason = COALESCE($4::text, "
              "status_reason), next_run_at = COALESCE($5::bigint, next_run_at) "
              "WHERE id = $6::bigint AND lease_epoch = $7::bigint AND lease_owner = $8",
              Params(ch.now, ch.lease_expires_at,
                     ch.state ? std::optional<int64_t>(static_cast<int64_t>(*ch.state)) : std::nullopt,
                     ch.status_reason, ch.next_run_at, ch.lease.instance_id, ch.lease.epoch,
                     ch.lease.owner)));
  if (fence.affected() != 1) {
    return absl::AbortedError("lease lost on instance " + std::to_string(ch.lease.instance_id) +
                              " (epoch " + std::to_string(ch.lease.epoch) + ")");
  }
  if (ch.lease_expires_at == 0 && ch.next_run_at && *ch.next_run_at <= ch.now &&
      (!ch.state || *ch.state == InstanceState::kRunning ||
       *ch.state == InstanceState::kCompensating)) {
    // Released to run now (a drain, an operator): another worker may take it at once.
    WS_RETURN_IF_ERROR(c.Query("SELECT pg_notify('waystone_work', '')").status());
  }
  if (ch.inbox) {
    WS_ASSIGN_OR_RETURN(PgResult claim,
                        c.Query("INSERT INTO inbox (tenant, source, event_id, data_hash, "
                                "received_at, instance_id) VALUES ($1, $2, $3, $4, $5::bigint, "
                                "$6::bigint) ON CONFLICT DO NOTHING",
                                Params(ch.inbox->tenant, ch.inbox->source, ch.inbox->id,
                                       ch.inbox->data_hash, ch.now, ch.lease.instance_id)));
    if (claim.affected() == 0) {
      return absl::AlreadyExistsError("event " + ch.inbox->source + " " + ch.inbox->id +
                                      " was received before");
    }
  }
  if (ch.resolve_alerts) {
    WS_RETURN_IF_ERROR(c.Query("UPDATE alerts SET state = 3, updated_at = $1::bigint WHERE "
                               "instance_id = $2::bigint AND state IN (1, 2)",
                               Params(ch.now, ch.lease.instance_id))
                           .status());
  }
  if (ch.idempotency) {
    const IdempotencyClaim& claim = *ch.idempotency;
    WS_ASSIGN_OR_RETURN(PgResult got,
                        c.Query("SELECT request_hash, expires_at FROM idempotency_keys WHERE "
                                "tenant = $1 AND key = $2 FOR UPDATE",
                                Params(claim.tenant, claim.key)));
    if (got.rows() == 1 && got.Int(0, 1) > ch.now && got.Text(0, 0) != claim.request_hash) {
      return absl::FailedPreconditionError(
          "idempotency key '" + claim.key + "' was used for request hash " +
          got.Text(0, 0).substr(0, 16) + "; this request has hash " +
          claim.request_hash.substr(0, 16) + " (the request changed under the same key)");
    }
    WS_RETURN_IF_ERROR(c.Query("INSERT INTO idempotency_keys VALUES ($1, $2, $3, $4::bigint, $5, "
                               "$6::bigint, $7::bigint) ON CONFLICT (tenant, key) DO UPDATE SET "
                               "request_hash = excluded.request_hash, expires_at = "
                               "excluded.expires_at",
                               Params(claim.tenant, claim.key, claim.request_hash,
                                      claim.instance_id, claim.step, ch.now, claim.expires_at))
                           .status());
  }
  for (const StepRecord& s : ch.steps) {
    WS_ASSIGN_OR_RETURN(
        PgResult updated,
        c.Query("UPDATE steps SET state = $1::smallint, attempts = $2::integer, error_class = "
                "$3::smallint, error_message = $4, external_id = $5, response_json = $6, "
                "idempotency_key = $7, request_hash = $8, resolution = $9::smallint, unknowns = "
                "$10::integer, lookups = $11::integer, compensation_attempts = $12::integer, "
                "next_attempt_at = $13::bigint, started_at = $14::bigint, finished_at = "
                "$15::bigint, span_id = $16, unknown_since = $17::bigint WHERE instance_id = "
                "$18::bigint AND step_index = $19::integer",
                Params(static_cast<int64_t>(s.state), s.attempts,
                       static_cast<int64_t>(s.error_class), s.error_message, s.external_id,
                       s.response_json, s.idempotency_key, s.request_hash,
                       static_cast<int64_t>(s.resolution), s.unknowns, s.lookups,
                       s.compensation_attempts, s.next_attempt_at, s.started_at, s.finished_at,
                       s.span_id, s.unknown_since, ch.lease.instance_id, s.index)));
    if (updated.affected() != 1) {
      return absl::InternalError("step " + std::to_string(s.index) + " of instance " +
                                 std::to_string(ch.lease.instance_id) + " does not exist");
    }
  }
  for (const AttemptRecord& a : ch.attempts) {
    WS_RETURN_IF_ERROR(
        // The store numbers a step's requests: 1, 2, ... in the order they were recorded
        // (only the lease holder writes them, so MAX + 1 does not race).
        c.Query("INSERT INTO attempts SELECT $1::bigint, $2::integer, COALESCE(MAX(seq), 0) + 1, "
                "$3::smallint, $4::boolean, $5::smallint, $6::integer, $7::smallint, $8, "
                "$9::bigint, $10::bigint FROM attempts WHERE instance_id = $1::bigint AND "
                "step_index = $2::integer",
                Params(ch.lease.instance_id, a.step_index, static_cast<int64_t>(a.phase),
                       a.sent ? "true" : "false", static_cast<int64_t>(a.connection), a.status,
                       static_cast<int64_t>(a.error_class), a.detail, a.started_at,
                       a.finished_at))
            .status());
  }
  for (const EventRecord& e : ch.events) {
    WS_RETURN_IF_ERROR(InsertEvent(c, e, ch.lease.instance_id, ch.now));
  }
  for (const AlertRecord& a : ch.alerts) {
    WS_RETURN_IF_ERROR(InsertAlert(c, a, ch.lease.instance_id, ch.now).status());
  }
  for (const AuditRecord& a : ch.audits) {
    WS_RETURN_IF_ERROR(c.Query("INSERT INTO audit_log (at, actor, tenant, instance_id, action, "
                               "reason, detail) VALUES ($1::bigint, $2, $3, $4::bigint, $5, $6, $7)",
                               Params(ch.now, a.actor, a.tenant, ch.lease.instance_id, a.action,
                                      a.reason, a.detail_json.empty() ? "{}" : a.detail_json))
                           .status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::Status>> PostgresStore::Commit(const std::vector<Change>& changes) {
  std::vector<absl::Status> results;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    results.clear();
    for (const Change& change : changes) {
      WS_RETURN_IF_ERROR(c.Exec("SAVEPOINT change"));
      absl::Status applied = ApplyChange(c, change);
      if (!applied.ok()) {
        WS_RETURN_IF_ERROR(c.Exec("ROLLBACK TO SAVEPOINT change"));
        if (!absl::IsAborted(applied) && !absl::IsFailedPrecondition(applied) &&
            !(absl::IsAlreadyExists(applied) && change.inbox)) {
          return applied;
        }
      }
      WS_RETURN_IF_ERROR(c.Exec("RELEASE SAVEPOINT change"));
      results.push_back(applied);
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return results;
}

absl::StatusOr<InstanceRecord> PostgresStore::GetInstance(int64_t id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return LoadInstance(*c, id);
}

absl::StatusOr<InstanceRecord> PostgresStore::FindInstance(const std::string& tenant,
                                                           const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(std::string("SELECT ") + kInstanceColumns +
                                               " FROM instances WHERE tenant = $1 AND "
                                               "business_key = $2",
                                           Params(tenant, key)));
  if (r.rows() == 0) {
    return absl::NotFoundError("no instance '" + key + "' in tenant '" + tenant + "'");
  }
  return ReadInstance(r, 0);
}

absl::StatusOr<std::vector<StepRecord>> PostgresStore::GetSteps(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(std::string("SELECT ") + kStepColumns +
                                               " FROM steps WHERE instance_id = $1::bigint ORDER "
                                               "BY step_index",
                                           Params(instance_id)));
  return Rows(r, ReadStep);
}

absl::StatusOr<std::vector<AttemptRecord>> PostgresStore::ListAttempts(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT step_index, seq, phase, sent::int, connection, "
                                           "status, error_class, detail, started_at, finished_at "
                                           "FROM attempts WHERE instance_id = $1::bigint ORDER BY "
                                           "step_index, seq",
                                           Params(instance_id)));
  return Rows(r, [](const PgResult& x, int i) {
    return AttemptRecord{static_cast<int>(x.Int(i, 0)), static_cast<int>(x.Int(i, 1)),
                         static_cast<AttemptPhase>(x.Int(i, 2)), x.Int(i, 3) != 0,
                         static_cast<ConnectionUsed>(x.Int(i, 4)), static_cast<int>(x.Int(i, 5)),
                         static_cast<ErrorClass>(x.Int(i, 6)), x.Text(i, 7), x.Int(i, 8),
                         x.Int(i, 9)};
  });
}

absl::StatusOr<TombstoneRecord> PostgresStore::FindTombstone(const std::string& tenant,
                                                             const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(std::string("SELECT ") + kTombstoneColumns +
                                               " FROM tombstones WHERE tenant = $1 AND "
                                               "business_key = $2",
                                           Params(tenant, key)));
  if (r.rows() == 0) {
    return absl::NotFoundError("no tombstone for '" + key + "' in tenant '" + tenant + "'");
  }
  return ReadTombstone(r, 0);
}

absl::StatusOr<std::vector<InstanceRecord>> PostgresStore::ListInstances(
    const InstanceFilter& filter) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query(std::string("SELECT ") + kInstanceColumns +
                   " FROM instances i WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS "
                   "NULL OR workflow = $2) AND ($3::smallint IS NULL OR state = $3) AND id > "
                   "$5::bigint AND created_at >= $6::bigint AND ($7::bigint = 0 OR created_at < "
                   "$7::bigint) AND ($8::smallint IS NULL OR EXISTS (SELECT 1 FROM steps s WHERE "
                   "s.instance_id = i.id AND s.error_class = $8::smallint)) AND ($9::integer = 0 "
                   "OR EXISTS (SELECT 1 FROM alerts a WHERE a.instance_id = i.id AND a.state IN "
                   "(1, 2) AND ($10::smallint = 0 OR a.kind = $10::smallint))) ORDER BY id "
                   "LIMIT $4::integer",
               Params(filter.tenant, filter.workflow,
                      filter.state ? std::optional<int64_t>(static_cast<int64_t>(*filter.state))
                                   : std::nullopt,
                      filter.limit, filter.after_id, filter.created_from, filter.created_to,
                      filter.error_class
                          ? std::optional<int64_t>(static_cast<int64_t>(*filter.error_class))
                          : std::nullopt,
                      static_cast<int64_t>(filter.with_alert || filter.alert_kind ? 1 : 0),
                      static_cast<int64_t>(filter.alert_kind ? static_cast<int64_t>(*filter.alert_kind) : 0))));
  return Rows(r, ReadInstance);
}

absl::StatusOr<std::vector<EventRecord>> PostgresStore::ListEvents(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT seq, event_id, instance_id, tenant, type, payload, "
                               "created_at FROM outbox WHERE instance_id = $1::bigint ORDER BY seq",
                               Params(instance_id)));
  return Rows(r, ReadEvent);
}

absl::StatusOr<std::vector<AlertRecord>> PostgresStore::ListAlerts(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT id, instance_id, tenant, step_name, kind, state, message, "
                               "created_at FROM alerts WHERE ($1::bigint = 0 OR instance_id = "
                               "$1::bigint) ORDER BY id",
                               Params(instance_id)));
  return Rows(r, [](const PgResult& x, int i) {
    return AlertRecord{x.Int(i, 0), x.Int(i, 1), x.Text(i, 2), x.Text(i, 3),
                       static_cast<AlertKind>(x.Int(i, 4)), static_cast<AlertState>(x.Int(i, 5)),
                       x.Text(i, 6), x.Int(i, 7)};
  });
}

absl::StatusOr<std::vector<AuditRecord>> PostgresStore::ListAudit(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT seq, at, actor, tenant, instance_id, action, reason, detail "
                               "FROM audit_log WHERE instance_id = $1::bigint ORDER BY seq",
                               Params(instance_id)));
  return Rows(r, [](const PgResult& x, int i) {
    return AuditRecord{x.Int(i, 0), x.Int(i, 1), x.Text(i, 2), x.Text(i, 3),
                       x.Int(i, 4), x.Text(i, 5), x.Text(i, 6), x.Text(i, 7)};
  });
}

absl::StatusOr<std::optional<IdempotencyClaim>> PostgresStore::GetIdempotencyClaim(
    const std::string& tenant, const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT request_hash, instance_id, step_name, expires_at FROM "
                               "idempotency_keys WHERE tenant = $1 AND key = $2",
                               Params(tenant, key)));
  if (r.rows() == 0) return std::optional<IdempotencyClaim>();
  return std::optional<IdempotencyClaim>(
      IdempotencyClaim{tenant, key, r.Text(0, 0), r.Int(0, 1), r.Text(0, 2), r.Int(0, 3)});
}

absl::StatusOr<StoreSummary> PostgresStore::Summary() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  StoreSummary summary;
  WS_ASSIGN_OR_RETURN(PgResult by_state,
                      c->Query("SELECT state, COUNT(*) FROM instances GROUP BY state ORDER BY state"));
  for (int i = 0; i < by_state.rows(); ++i) {
    summary.instances_by_state.emplace_back(static_cast<InstanceState>(by_state.Int(i, 0)),
                                            by_state.Int(i, 1));
  }
  WS_ASSIGN_OR_RETURN(
      PgResult steps,
      c->Query("SELECT COALESCE(SUM(GREATEST(attempts - 1, 0)), 0), COALESCE(SUM(unknowns), 0), "
               "COUNT(*) FILTER (WHERE resolution = 1), COUNT(*) FILTER (WHERE resolution = 2), "
               "COUNT(*) FILTER (WHERE state = 7), (SELECT COUNT(*) FROM alerts WHERE state = 1), "
               "(SELECT COUNT(*) FROM outbox) FROM steps"));
  summary.retries = steps.Int(0, 0);
  summary.unknown_outcomes = steps.Int(0, 1);
  summary.resolved_by_lookup = steps.Int(0, 2);
  summary.resubmitted_after_lookup = steps.Int(0, 3);
  summary.compensations = steps.Int(0, 4);
  summary.open_alerts = steps.Int(0, 5);
  summary.outbox_events = steps.Int(0, 6);
  WS_ASSIGN_OR_RETURN(
      PgResult more,
      c->Query("SELECT COALESCE(SUM(attempts), 0), COUNT(*) FILTER (WHERE resolution = 3), "
               "COALESCE(SUM(compensation_attempts), 0), COUNT(*) FILTER (WHERE state = 8), "
               "(SELECT value FROM counters WHERE name = 'lease_takeovers'), (SELECT value FROM "
               "counters WHERE name = 'inbox_duplicates') FROM steps"));
  summary.attempts = more.Int(0, 0);
  summary.resolved_by_operator = more.Int(0, 1);
  summary.compensation_attempts = more.Int(0, 2);
  summary.compensation_failures = more.Int(0, 3);
  summary.lease_takeovers = more.Int(0, 4);
  summary.inbox_duplicates = more.Int(0, 5);
  WS_ASSIGN_OR_RETURN(PgResult classes,
                      c->Query("SELECT error_class, COUNT(*) FROM steps WHERE error_class > 0 "
                               "GROUP BY error_class ORDER BY error_class"));
  for (int i = 0; i < classes.rows(); ++i) {
    summary.steps_by_error_class.emplace_back(static_cast<ErrorClass>(classes.Int(i, 0)),
                                              classes.Int(i, 1));
  }
  WS_ASSIGN_OR_RETURN(PgResult states,
                      c->Query("SELECT state, COUNT(*) FROM steps GROUP BY state ORDER BY state"));
  for (int i = 0; i < states.rows(); ++i) {
    summary.steps_by_state.emplace_back(static_cast<StepState>(states.Int(i, 0)),
                                        states.Int(i, 1));
  }
  return summary;
}

absl::StatusOr<std::optional<Millis>> PostgresStore::NextDueTime() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT MIN(GREATEST(next_run_at, lease_expires_at)) "
                                           "FROM instances WHERE state IN (1, 3) AND next_run_at < "
                                           "4000000000000000"));
  if (r.IsNull(0, 0)) return std::optional<Millis>();
  return std::optional<Millis>(r.Int(0, 0));
}

absl::Status PostgresStore::WaitForWork(Millis timeout) {
  std::lock_guard<std::mutex> lock(listen_mu_);
  if (!listener_ || listener_->broken()) {
    listener_.reset();
    WS_ASSIGN_OR_RETURN(listener_, PgConnection::Connect(conninfo_));
    WS_RETURN_IF_ERROR(listener_->Exec("LISTEN waystone_work"));
  }
  if (listener_->DrainNotifications() > 0) return absl::OkStatus();
  pollfd fd{listener_->socket(), POLLIN, 0};
  if (poll(&fd, 1, static_cast<int>(std::max<Millis>(0, timeout))) > 0) {
    if (listener_->DrainNotifications() < 0) listener_.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PostgresStore::OutboxCursor(const std::string& sink) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT last_seq FROM relay_cursors WHERE sink = $1",
                                           Params(sink)));
  return r.rows() == 0 ? 0 : r.Int(0, 0);
}

absl::StatusOr<std::vector<EventRecord>> PostgresStore::ReadOutbox(int64_t after_seq, int limit) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  // Rows are taken in (txid, seq) order and only from transactions older than every
  // one still running: a transaction that commits later can only add rows after them.
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("SELECT seq, event_id, instance_id, tenant, type, payload, created_at FROM outbox "
               "WHERE (txid, seq) > (COALESCE((SELECT txid FROM outbox WHERE seq = $1::bigint), "
               "(SELECT MAX(last_txid) FROM relay_cursors WHERE last_seq = $1::bigint), "
               "'0'::xid8), $1::bigint) AND txid < pg_snapshot_xmin(pg_current_snapshot()) "
               "ORDER BY txid, seq LIMIT $2::integer",
               Params(after_seq, limit)));
  return Rows(r, ReadEvent);
}

absl::Status PostgresStore::AddDeliveries(const std::string& sink, int64_t expected_cursor,
                                          int64_t new_cursor,
                                          const std::vector<std::pair<int64_t, int64_t>>& wanted,
                                          Millis now) {
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(PgResult got, c.Query("SELECT last_seq FROM relay_cursors WHERE sink = $1 "
                                              "FOR UPDATE",
                                              Params(sink)));
    const int64_t cursor = got.rows() == 0 ? 0 : got.Int(0, 0);
    if (cursor != expected_cursor) return absl::AbortedError("outbox cursor of " + sink + " moved");
    for (const auto& [seq, instance_id] : wanted) {
      WS_RETURN_IF_ERROR(c.Query("INSERT INTO deliveries (outbox_seq, sink, instance_id, state, "
                                 "created_at) VALUES ($1::bigint, $2, $3::bigint, 1, $4::bigint) "
                                 "ON CONFLICT DO NOTHING",
                                 Params(seq, sink, instance_id, now))
                             .status());
    }
    return c.Query("INSERT INTO relay_cursors VALUES ($1, (SELECT txid FROM outbox WHERE seq = "
                   "$2::bigint), $2::bigint) ON CONFLICT (sink) DO UPDATE SET last_txid = "
                   "excluded.last_txid, last_seq = excluded.last_seq",
                   Params(sink, new_cursor))
        .status();
  });
}

absl::StatusOr<std::vector<DeliveryClaim>> PostgresStore::ClaimDeliveries(
    const std::string& owner, Millis now, Millis lease_duration, int limit,
    const std::vector<std::string>& sinks) {
  std::string sink_array = "{";
  for (size_t i = 0; i < sinks.size(); ++i) {
    if (i > 0) sink_array += ",";
    sink_array += "\"";
    for (char ch : sinks[i]) {
      if (ch == '"' || ch == '\\') sink_array += '\\';
      sink_array += ch;
    }
    sink_array += "\"";
  }
  sink_array += "}";
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("UPDATE deliveries SET lease_owner = $1, lease_expires_at = $2::bigint + "
               "$3::bigint, lease_epoch = lease_epoch + 1 WHERE id IN (SELECT d.id FROM "
               "deliveries d WHERE d.state = 1 AND d.next_attempt_at <= $2::bigint AND "
               "d.lease_expires_at <= $2::bigint AND d.sink = ANY($5::text[]) AND NOT EXISTS "
               "(SELECT 1 FROM deliveries e WHERE e.sink = d.sink AND e.instance_id = "
               "d.instance_id AND e.state = 1 AND e.outbox_seq < d.outbox_seq) ORDER BY "
               "d.outbox_seq LIMIT $4::integer FOR UPDATE SKIP LOCKED) RETURNING id, lease_epoch, "
               "sink, attempts, outbox_seq",
               Params(owner, now, lease_duration, limit, sink_array)));
  std::vector<DeliveryClaim> claims;
  for (int i = 0; i < r.rows(); ++i) {
    DeliveryClaim claim;
    claim.id = r.Int(i, 0);
    claim.epoch = r.Int(i, 1);
    claim.owner = owner;
    claim.sink = r.Text(i, 2);
    claim.attempts = static_cast<int>(r.Int(i, 3));
    WS_ASSIGN_OR_RETURN(PgResult event,
                        c->Query("SELECT seq, event_id, instance_id, tenant, type, payload, "
                                 "created_at FROM outbox WHERE seq = $1::bigint",
                                 Params(r.Int(i, 4))));
    claim.event = ReadEvent(event, 0);
    claims.push_back(std::move(claim));
  }
  std::sort(claims.begin(), claims.end(),
            [](const DeliveryClaim& a, const DeliveryClaim& b) { return a.event.seq < b.event.seq; });
  return claims;
}

absl::Status PostgresStore::FinishDelivery(const DeliveryClaim& claim, const DeliveryUpdate& u) {
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(
        PgResult finish,
        c.Query("UPDATE deliveries SET state = $1::smallint, attempts = $2::integer, "
                "next_attempt_at = $3::bigint, last_error = $4, delivered_at = CASE WHEN "
                "$1::smallint = 2 THEN $5::bigint ELSE delivered_at END, lease_owner = '', "
                "lease_expires_at = 0 WHERE id = $6::bigint AND lease_epoch = $7::bigint AND "
                "lease_owner = $8",
                Params(static_cast<int64_t>(u.state), u.attempts, u.next_attempt_at, u.error,
                       u.now, claim.id, claim.epoch, claim.owner)));
    if (finish.affected() != 1) {
      return absl::AbortedError("delivery " + std::to_string(claim.id) + " lease lost");
    }
    if (u.state == DeliveryState::kDelivered) {
      WS_RETURN_IF_ERROR(c.Query("UPDATE outbox SET delivered_at = $1::bigint WHERE seq = "
                                 "$2::bigint AND NOT EXISTS (SELECT 1 FROM deliveries WHERE "
                                 "outbox_seq = $2::bigint AND state <> 2)",
                                 Params(u.now, claim.event.seq))
                             .status());
    }
    if (u.alert) WS_RETURN_IF_ERROR(InsertAlert(c, *u.alert, u.alert->instance_id, u.now).status());
    if (u.alert_event) {
      WS_RETURN_IF_ERROR(InsertEvent(c, *u.alert_event, u.alert_event->instance_id, u.now));
    }
    if (u.disable_sink) {
      WS_RETURN_IF_ERROR(c.Query("INSERT INTO relay_sinks VALUES ($1, 1, $2, $3::bigint) ON "
                                 "CONFLICT (sink) DO UPDATE SET disabled = 1, reason = "
                                 "excluded.reason, updated_at = excluded.updated_at",
                                 Params(claim.sink, u.error, u.now))
                             .status());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> PostgresStore::DeliveryLeaseOwners(Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT DISTINCT lease_owner FROM deliveries WHERE "
                                           "lease_expires_at > $1::bigint AND lease_owner <> ''",
                                           Params(now)));
  return Rows(r, ReadText0);
}

absl::Status PostgresStore::ExpireDeliveryLeases(const std::string& owner) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c->Query("UPDATE deliveries SET lease_expires_at = 0 WHERE lease_owner = $1 AND "
                  "lease_expires_at > 0",
                  Params(owner))
      .status();
}

absl::StatusOr<std::vector<std::string>> PostgresStore::DisabledSinks() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT sink FROM relay_sinks WHERE disabled = 1"));
  return Rows(r, ReadText0);
}

absl::Status PostgresStore::EnableSink(const std::string& sink, Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c->Query("UPDATE relay_sinks SET disabled = 0, reason = 'enabled', updated_at = "
                  "$1::bigint WHERE sink = $2",
                  Params(now, sink))
      .status();
}

absl::StatusOr<std::vector<DeliveryRecord>> PostgresStore::ListDeliveries(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("SELECT d.id, d.outbox_seq, d.sink, d.state, d.attempts, d.next_attempt_at, "
               "d.last_error, d.created_at, d.delivered_at, o.event_id, o.type FROM deliveries d "
               "JOIN outbox o ON o.seq = d.outbox_seq WHERE d.instance_id = $1::bigint ORDER BY "
               "d.outbox_seq, d.sink",
               Params(instance_id)));
  return Rows(r, [](const PgResult& x, int i) {
    return DeliveryRecord{x.Int(i, 0), x.Int(i, 1), x.Text(i, 2),
                          static_cast<DeliveryState>(x.Int(i, 3)), static_cast<int>(x.Int(i, 4)),
                          x.Int(i, 5), x.Text(i, 6), x.Int(i, 7), x.Int(i, 8), x.Text(i, 9),
                          x.Text(i, 10)};
  });
}

absl::StatusOr<std::vector<SinkStats>> PostgresStore::DeliveryStats() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("SELECT d.sink, COUNT(*) FILTER (WHERE d.state = 1), COUNT(*) FILTER (WHERE "
               "d.state = 2), COUNT(*) FILTER (WHERE d.state = 3), SUM(d.attempts) - COUNT(*) "
               "FILTER (WHERE d.state = 2), COALESCE(MIN(d.created_at) FILTER (WHERE d.state = "
               "1), 0), COALESCE(MAX(r.disabled), 0) FROM deliveries d LEFT JOIN relay_sinks r "
               "ON r.sink = d.sink GROUP BY d.sink ORDER BY d.sink"));
  return Rows(r, [](const PgResult& x, int i) {
    return SinkStats{x.Text(i, 0), x.Int(i, 1), x.Int(i, 2), x.Int(i, 3),
                     x.Int(i, 4),  x.Int(i, 5), x.Int(i, 6) != 0};
  });
}

absl::StatusOr<std::vector<StaleUnknown>> PostgresStore::StaleUnknownSteps(Millis unknown_before) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query("SELECT s.instance_id, i.tenant, s.name, s.unknown_since FROM steps s JOIN "
               "instances i ON i.id = s.instance_id WHERE s.state = 5 AND s.unknown_since > 0 AND "
               "s.unknown_since <= $1::bigint AND NOT EXISTS (SELECT 1 FROM alerts a WHERE "
               "a.instance_id = s.instance_id AND a.step_name = s.name AND a.kind = 8 AND "
               "a.created_at >= s.unknown_since)",
               Params(unknown_before)));
  return Rows(r, [](const PgResult& x, int i) {
    return StaleUnknown{x.Int(i, 0), x.Text(i, 1), x.Text(i, 2), x.Int(i, 3)};
  });
}

absl::StatusOr<int64_t> PostgresStore::RaiseAlert(const AlertRecord& alert,
                                                  const EventRecord& event) {
  int64_t id = 0;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(id, InsertAlert(c, alert, alert.instance_id, alert.created_at));
    return InsertEvent(c, event, event.instance_id, alert.created_at);
  });
  if (!status.ok()) return status;
  return id;
}

absl::StatusOr<GcReport> PostgresStore::CollectGarbage(Millis finished_before, Millis now,
                                                       Millis protect_before, bool dry_run) {
  GcReport report;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    report = GcReport{};
    WS_RETURN_IF_ERROR(c.Exec("CREATE TEMP TABLE IF NOT EXISTS gc_ids (id BIGINT PRIMARY KEY) "
                              "ON COMMIT DELETE ROWS"));
    WS_RETURN_IF_ERROR(c.Query("INSERT INTO gc_ids SELECT id FROM instances i WHERE state IN "
                               "(2, 4, 5, 7) AND updated_at < $1::bigint AND NOT EXISTS (SELECT 1 "
                               "FROM deliveries d WHERE d.instance_id = i.id AND d.state = 1) FOR "
                               "UPDATE SKIP LOCKED",
                               Params(finished_before))
                           .status());
    // Inbox claims and tombstones are the protection against late redeliveries:
    // they go only past the protection window, and a claim only once its instance
    // is gone too.
    WS_ASSIGN_OR_RETURN(
        PgResult counts,
        c.Query("SELECT (SELECT COUNT(*) FROM deliveries WHERE instance_id IN (SELECT id FROM "
                "gc_ids)), (SELECT COUNT(*) FROM outbox WHERE instance_id IN (SELECT id FROM "
                "gc_ids)), (SELECT COUNT(*) FROM steps WHERE instance_id IN (SELECT id FROM "
                "gc_ids)), (SELECT COUNT(*) FROM alerts WHERE instance_id IN (SELECT id FROM "
                "gc_ids)), (SELECT COUNT(*) FROM gc_ids), (SELECT COUNT(*) FROM "
                "idempotency_keys WHERE expires_at < $1::bigint), (SELECT COUNT(*) FROM inbox "
                "WHERE received_at < $2::bigint AND (instance_id IS NULL OR instance_id IN "
                "(SELECT id FROM gc_ids) OR NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = "
                "inbox.instance_id))), (SELECT COUNT(*) FROM tombstones WHERE collected_at < "
                "$2::bigint)",
                Params(now, protect_before)));
    report.deliveries = counts.Int(0, 0);
    report.events = counts.Int(0, 1);
    report.steps = counts.Int(0, 2);
    report.alerts = counts.Int(0, 3);
    report.instances = counts.Int(0, 4);
    report.tombstones_written = counts.Int(0, 4);
    report.idempotency_keys = counts.Int(0, 5);
    report.inbox_claims = counts.Int(0, 6);
    report.tombstones = counts.Int(0, 7);
    if (dry_run) return absl::OkStatus();
    // Old tombstones go before new ones are written, so a fresh one is never lost.
    WS_RETURN_IF_ERROR(c.Query("DELETE FROM tombstones WHERE collected_at < $1::bigint",
                               Params(protect_before))
                           .status());
    WS_RETURN_IF_ERROR(
        c.Query("INSERT INTO tombstones SELECT tenant, business_key, workflow, input_hash, state, "
                "COALESCE((SELECT json_object_agg(s.name, s.external_id)::text FROM steps s "
                "WHERE s.instance_id = i.id AND s.external_id <> ''), '{}'), id, updated_at, "
                "$1::bigint FROM instances i WHERE id IN (SELECT id FROM gc_ids) ON CONFLICT "
                "(tenant, business_key) DO UPDATE SET workflow = excluded.workflow, input_hash = "
                "excluded.input_hash, final_state = excluded.final_state, external_ids = "
                "excluded.external_ids, instance_id = excluded.instance_id, finished_at = "
                "excluded.finished_at, collected_at = excluded.collected_at",
                Params(now))
            .status());
    for (const char* sql :
         {"DELETE FROM attempts WHERE instance_id IN (SELECT id FROM gc_ids)",
          "DELETE FROM deliveries WHERE instance_id IN (SELECT id FROM gc_ids)",
          "DELETE FROM outbox WHERE instance_id IN (SELECT id FROM gc_ids)",
          "DELETE FROM steps WHERE instance_id IN (SELECT id FROM gc_ids)",
          "DELETE FROM alerts WHERE instance_id IN (SELECT id FROM gc_ids)",
          "DELETE FROM instances WHERE id IN (SELECT id FROM gc_ids)"}) {
      WS_RETURN_IF_ERROR(c.Exec(sql));
    }
    WS_RETURN_IF_ERROR(c.Query("DELETE FROM inbox WHERE received_at < $1::bigint AND "
                               "(instance_id IS NULL OR NOT EXISTS (SELECT 1 FROM instances i "
                               "WHERE i.id = inbox.instance_id))",
                               Params(protect_before))
                           .status());
    WS_RETURN_IF_ERROR(
        c.Query("DELETE FROM idempotency_keys WHERE expires_at < $1::bigint", Params(now)).status());
    return c.Query("DELETE FROM api_requests WHERE expires_at < $1::bigint", Params(now)).status();
  });
  if (!status.ok()) return status;
  return report;
}

absl::Status PostgresStore::PutToken(const TokenRecord& t) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  auto status = c->Query("INSERT INTO api_tokens (token_hash, name, tenant, role, created_at, "
                         "revoked_at, expires_at) VALUES ($1, $2, $3, $4, $5::bigint, $6::bigint, "
                         "$7::bigint)",
                         Params(t.token_hash, t.name, t.tenant, t.role, t.created_at, t.revoked_at,
                                t.expires_at))
                    .status();
  if (absl::IsAlreadyExists(status) ||
      (!status.ok() &&
       std::string(status.message()).find("api_tokens_name") != std::string::npos)) {
    return absl::AlreadyExistsError("a token named '" + t.name + "' exists");
  }
  return status;
}

namespace {
constexpr const char* kPgTokenColumns =
    "SELECT token_hash, name, tenant, role, created_at, revoked_at, expires_at FROM api_tokens ";
TokenRecord PgTokenRow(const PgResult& r, int i) {
  return TokenRecord{r.Text(i, 0), r.Text(i, 1), r.Text(i, 2), r.Text(i, 3),
                     r.Int(i, 4),  r.Int(i, 5),  r.Int(i, 6)};
}
}  // namespace

absl::StatusOr<TokenRecord> PostgresStore::FindToken(const std::string& token_hash) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(std::string(kPgTokenColumns) + "WHERE token_hash = $1",
                                           Params(token_hash)));
  if (r.rows() == 0) return absl::NotFoundError("no such token");
  return PgTokenRow(r, 0);
}

absl::StatusOr<std::vector<TokenRecord>> PostgresStore::ListTokens() {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(std::string(kPgTokenColumns) + "ORDER BY name", Params()));
  std::vector<TokenRecord> out;
  for (int i = 0; i < r.rows(); ++i) out.push_back(PgTokenRow(r, i));
  return out;
}

absl::StatusOr<std::string> PostgresStore::ServerKey(const std::string& name) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT value FROM server_keys WHERE name = $1", Params(name)));
  if (r.rows() == 0) return absl::NotFoundError("no server key '" + name + "'");
  return r.Text(0, 0);
}

absl::Status PostgresStore::RevokeToken(const std::string& name, Millis now) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("UPDATE api_tokens SET revoked_at = $1::bigint WHERE name = $2 "
                               "AND revoked_at = 0 RETURNING name",
                               Params(now, name)));
  if (r.rows() == 1) return absl::OkStatus();
  WS_ASSIGN_OR_RETURN(PgResult exists,
                      c->Query("SELECT 1 FROM api_tokens WHERE name = $1", Params(name)));
  if (exists.rows() == 0) return absl::NotFoundError("no token named '" + name + "'");
  return absl::FailedPreconditionError("token '" + name + "' is revoked already");
}

absl::StatusOr<AlertRecord> PostgresStore::GetAlert(int64_t id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query("SELECT id, instance_id, tenant, step_name, kind, "
                                           "state, message, created_at FROM alerts WHERE id = "
                                           "$1::bigint",
                                           Params(id)));
  if (r.rows() == 0) return absl::NotFoundError("no alert " + std::to_string(id));
  return AlertRecord{r.Int(0, 0), r.Int(0, 1), r.Text(0, 2), r.Text(0, 3),
                     static_cast<AlertKind>(r.Int(0, 4)), static_cast<AlertState>(r.Int(0, 5)),
                     r.Text(0, 6), r.Int(0, 7)};
}

absl::Status PostgresStore::AcknowledgeAlert(int64_t id, const AuditRecord& audit) {
  return InTransaction([&](PgConnection& c) -> absl::Status {
    WS_ASSIGN_OR_RETURN(PgResult ack, c.Query("UPDATE alerts SET state = 2, updated_at = "
                                              "$1::bigint WHERE id = $2::bigint AND state = 1",
                                              Params(audit.at, id)));
    if (ack.affected() != 1) {
      return absl::FailedPreconditionError("the alert is not open");  // no database id: callers show public ones
    }
    return c.Query("INSERT INTO audit_log (at, actor, tenant, instance_id, action, reason, "
                   "detail) VALUES ($1::bigint, $2, $3, $4::bigint, $5, $6, $7)",
                   Params(audit.at, audit.actor, audit.tenant, audit.instance_id, audit.action,
                          audit.reason, audit.detail_json.empty() ? "{}" : audit.detail_json))
        .status();
  });
}

absl::StatusOr<ApiRequestClaim> PostgresStore::BeginApiRequest(const ApiRequestRecord& request,
                                                               Millis stale_before,
                                                               const std::string& dead_owner) {
  ApiRequestClaim claim;
  absl::Status status = InTransaction([&](PgConnection& c) -> absl::Status {
    // A concurrent first claim of the same key waits here for the other to commit.
    WS_RETURN_IF_ERROR(c.Query("INSERT INTO api_requests (tenant, key, request_hash, "
                               "created_at, expires_at) VALUES ($1, $2, '', 0, 0) ON CONFLICT "
                               "DO NOTHING",
                               Params(request.tenant, request.key))
                           .status());
    WS_ASSIGN_OR_RETURN(PgResult got,
                        c.Query("SELECT request_hash, done, status, content_type, body, "
                                "created_at, expires_at, owner FROM api_requests WHERE tenant = "
                                "$1 AND key = $2 FOR UPDATE",
                                Params(request.tenant, request.key)));
    // The placeholder row just inserted has expired at 0: a fresh key decides kNew.
    const ApiRequestRecord stored{request.tenant, request.key, got.Text(0, 0),
                                  got.Text(0, 1) == "t", static_cast<int>(got.Int(0, 2)),
                                  got.Text(0, 3), got.Text(0, 4), got.Int(0, 5), got.Int(0, 6),
                                  got.Text(0, 7)};
    claim = DecideApiRequest(stored, request, stale_before, dead_owner);
    if (claim.outcome != ApiRequestOutcome::kNew) return absl::OkStatus();
    return c.Query("UPDATE api_requests SET request_hash = $3, done = FALSE, status = 0, "
                   "content_type = '', body = '', created_at = $4::bigint, expires_at = "
                   "$5::bigint, owner = $6 WHERE tenant = $1 AND key = $2",
                   Params(request.tenant, request.key, request.request_hash, request.created_at,
                          request.expires_at, request.owner))
        .status();
  });
  if (!status.ok()) return status;
  return claim;
}

absl::Status PostgresStore::FinishApiRequest(const ApiRequestRecord& r) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c->Query("UPDATE api_requests SET done = TRUE, status = $1::integer, content_type = $2, "
                  "body = $3 WHERE tenant = $4 AND key = $5 AND request_hash = $6",
                  Params(r.status, r.content_type, r.body, r.tenant, r.key, r.request_hash))
      .status();
}

absl::Status PostgresStore::AbandonApiRequest(const std::string& tenant, const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c->Query("DELETE FROM api_requests WHERE tenant = $1 AND key = $2 AND NOT done",
                  Params(tenant, key))
      .status();
}

absl::StatusOr<std::optional<InboxEntry>> PostgresStore::LookupInbox(const std::string& tenant,
                                                                     const std::string& source,
                                                                     const std::string& id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return ReadInbox(*c, tenant, source, id);
}

absl::Status PostgresStore::AddToCounter(const std::string& name, int64_t delta) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return c->Query("UPDATE counters SET value = value + $1::bigint WHERE name = $2",
                  Params(delta, name))
      .status();
}

}  // namespace waystone
