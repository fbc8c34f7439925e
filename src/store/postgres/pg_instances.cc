// PostgresStore: definitions, starts and the reads of instances (InstanceStore,
// DefinitionStore).

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "store/postgres/pg_rows.h"
#include "store/sql_values.h"
#include "store/start_decision.h"

namespace waystone {
namespace {

// The SQL of a start; the algorithm is StartInstanceWith. The writes that answer
// only a status (steps, event, notification, inbox link) wait and go out in one
// pipeline with the next statement whose answer the algorithm needs (or with
// Flush), so a created start costs one round trip: the insert with the tombstone
// check after it (which also finds a concurrent burial). A write that failed fails
// that next statement: never a FailedPrecondition, so the whole batch, as it would
// have at once.
class PgStartSql final : public StartSql {
 public:
  explicit PgStartSql(PgConnection& c) : c_(c) {}

  absl::Status Savepoint() override {
    WS_RETURN_IF_ERROR(Flush());
    signalled_at_savepoint_ = signalled_;
    return c_.Exec("SAVEPOINT start");
  }
  absl::Status RollbackToSavepoint() override {
    deferred_.clear();  // written after the savepoint: undone with it
    signalled_ = signalled_at_savepoint_;
    inserted_.reset();
    return c_.Exec("ROLLBACK TO SAVEPOINT start");
  }
  absl::Status ReleaseSavepoint() override {
    WS_RETURN_IF_ERROR(Flush());
    return c_.Exec("RELEASE SAVEPOINT start");
  }

  absl::StatusOr<bool> ClaimStartEvent(const NewInstance& in) override {
    static const std::string kClaim =
        "INSERT INTO inbox (tenant, source, event_id, data_hash, received_at) VALUES ($1, $2, "
        "$3, $4, $5::bigint) ON CONFLICT DO NOTHING";
    WS_ASSIGN_OR_RETURN(std::vector<PgResult> claim,
                        Run({{&kClaim, Params(in.tenant, in.event_source, in.event_id,
                                              in.event_data_hash, in.now)}}));
    return claim[0].affected() == 1;
  }
  absl::StatusOr<std::optional<InboxEntry>> ReadInbox(const std::string& tenant,
                                                      const std::string& source,
                                                      const std::string& id) override {
    WS_RETURN_IF_ERROR(Flush());
    return PgInboxEntry(c_, tenant, source, id);
  }
  // The row just inserted is read from the insert's RETURNING: one statement fewer.
  absl::StatusOr<std::optional<InstanceRecord>> InstanceById(int64_t id) override {
    if (inserted_ && inserted_->id == id) return inserted_;
    WS_RETURN_IF_ERROR(Flush());
    return PgInstanceById(c_, id);
  }
  absl::StatusOr<std::optional<InstanceRecord>> InstanceByKey(const std::string& tenant,
                                                              const std::string& key) override {
    WS_RETURN_IF_ERROR(Flush());
    return PgInstanceByKey(c_, tenant, key);
  }
  absl::StatusOr<std::optional<TombstoneRecord>> TombstoneOfInstance(int64_t id) override {
    WS_RETURN_IF_ERROR(Flush());
    return PgTombstoneOfInstance(c_, id);
  }
  // One round trip: the insert, unless a tombstone holds the key (ON CONFLICT makes
  // concurrent identical starts wait for each other instead of failing), then the
  // key's tombstone, read by a statement after the insert so that it sees what a gc
  // committed while the insert waited.
  absl::StatusOr<Insertion> InsertInstance(const NewInstance& in,
                                           const std::string& source_event) override {
    static const std::string kInsert = absl::StrCat(
        "INSERT INTO instances (tenant, business_key, workflow, definition_hash, input_json, "
        "input_hash, state, next_run_at, trace_id, source_event, created_at, updated_at, "
        "lease_owner, lease_expires_at, lease_epoch, started_by) SELECT $1, $2, $3, $4, $5, $6, ",
        SqlValue(InstanceState::kRunning),
        ", $7::bigint, $8, $9, $7::bigint, $7::bigint, $10, $11::bigint, CASE WHEN $10 = '' "
        "THEN 0 ELSE 1 END, $12 WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE tenant = $1 AND "
        "business_key = $2) ON CONFLICT (tenant, business_key) DO NOTHING RETURNING ",
        kInstanceColumns);
    WS_ASSIGN_OR_RETURN(
        std::vector<PgResult> r,
        Run({{&kInsert, Params(in.tenant, in.key, in.workflow, in.definition_hash, in.input_json,
                               in.input_hash, in.now, in.trace_id, source_event, in.lease_owner,
                               in.lease_expires_at, in.started_by)},
             PgTombstoneOfKeyStatement(in.tenant, in.key)}));
    inserted_ = PgFirstRow(r[0], ReadInstance<PgRow>);
    Insertion insertion;
    if (inserted_) insertion.created = inserted_->id;
    insertion.tombstone = PgFirstRow(r[1], ReadTombstone<PgRow>);
    return insertion;
  }
  // One statement for all the steps: their names as one text[].
  absl::Status InsertPendingSteps(int64_t id, const std::vector<std::string>& names) override {
    static const std::string kInsert = absl::StrCat(
        "INSERT INTO steps (instance_id, step_index, name, state) SELECT $1::bigint, "
        "ordinality - 1, name, ",
        SqlValue(StepState::kPending), " FROM unnest($2::text[]) WITH ORDINALITY AS t(name)");
    if (names.empty()) return absl::OkStatus();
    return Defer({&kInsert, Params(id, absl::StrCat("{", QuoteEach(names), "}"))});
  }
  absl::Status InsertEvent(const EventRecord& event, int64_t instance_id, Millis now) override {
    return Defer(PgInsertEventStatement(event, instance_id, now));
  }
  // Once per transaction: PostgreSQL delivers one notification of a channel and
  // payload per transaction however often it was sent.
  absl::Status SignalWork() override {
    if (signalled_) return absl::OkStatus();
    signalled_ = true;
    return Defer(PgSignalWorkStatement());
  }
  absl::Status LinkInbox(const NewInstance& in, int64_t instance_id) override {
    static const std::string kLink =
        "UPDATE inbox SET instance_id = $1::bigint WHERE tenant = $2 AND source = $3 AND "
        "event_id = $4";
    return Defer({&kLink, Params(instance_id, in.tenant, in.event_source, in.event_id)});
  }
  absl::Status AddToCounter(const std::string& name, int64_t delta) override {
    WS_RETURN_IF_ERROR(Flush());
    return PgAddToCounter(c_, name, delta);
  }

  // Sends the writes still waiting; the transaction commits only after this.
  absl::Status Flush() { return Run({}).status(); }

 private:
  absl::Status Defer(PgStatement statement) {
    deferred_.push_back(std::move(statement));
    return absl::OkStatus();
  }
  // Runs the waiting writes, then `statements`, in one pipeline; returns the
  // results of `statements`.
  absl::StatusOr<std::vector<PgResult>> Run(std::vector<PgStatement> statements) {
    if (deferred_.empty() && statements.empty()) return std::vector<PgResult>();
    const size_t waiting = deferred_.size();
    std::vector<PgStatement> all = std::move(deferred_);
    deferred_.clear();
    all.insert(all.end(), std::make_move_iterator(statements.begin()),
               std::make_move_iterator(statements.end()));
    WS_ASSIGN_OR_RETURN(std::vector<PgResult> results, c_.Pipeline(all));
    results.erase(results.begin(), results.begin() + static_cast<std::ptrdiff_t>(waiting));
    return results;
  }

  PgConnection& c_;
  std::vector<PgStatement> deferred_;  // writes not sent yet, in order
  bool signalled_ = false;
  bool signalled_at_savepoint_ = false;
  std::optional<InstanceRecord> inserted_;  // by the last InsertInstance
};

}  // namespace

absl::Status PostgresStore::PutDefinition(const std::string& hash, const std::string& workflow,
                                          const std::string& source, const std::string& text,
                                          Millis now) {
  {
    MutexLock lock(definitions_mu_);
    if (stored_definitions_.contains(hash)) return absl::OkStatus();
  }
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_RETURN_IF_ERROR(c->Query("INSERT INTO definitions VALUES ($1, $2, $3, $4, $5::bigint) ON "
                              "CONFLICT DO NOTHING",
                              Params(hash, workflow, source, text, now))
                         .status());
  MutexLock lock(definitions_mu_);
  stored_definitions_.insert(hash);
  return absl::OkStatus();
}

absl::StatusOr<std::string> PostgresStore::GetDefinition(const std::string& hash) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT body FROM definitions WHERE hash = $1", Params(hash)));
  if (r.rows() == 0) return absl::NotFoundError("no definition with hash " + hash);
  return r.Text(0, 0);
}

absl::StatusOr<StartResult> PostgresStore::StartInstance(const NewInstance& in) {
  StartResult result;
  absl::Status status;
  for (int round = 0; round < 3; ++round) {
    status = InTransaction([&](PgConnection& c) -> absl::Status {
      PgStartSql sql(c);
      WS_ASSIGN_OR_RETURN(result, StartInstanceWith(sql, in));
      return sql.Flush();
    });
    if (!StartAgain(status)) break;
  }
  if (!status.ok()) return status;
  return result;
}

absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> PostgresStore::StartInstances(
    const std::vector<NewInstance>& starts) {
  std::vector<absl::StatusOr<StartResult>> results;
  // A concurrent gc that buried a key fails the batch (kCollectedMeanwhile): each
  // start then runs again on its own, where StartInstance retries it.
  WS_RETURN_IF_ERROR(InTransaction([&](PgConnection& c) -> absl::Status {
    PgStartSql sql(c);
    WS_ASSIGN_OR_RETURN(results, StartInstancesWith(sql, starts));
    return sql.Flush();
  }));
  return results;
}

absl::StatusOr<InstanceRecord> PostgresStore::GetInstance(int64_t id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> instance, PgInstanceById(*c, id));
  if (!instance) return absl::NotFoundError("no instance with id " + std::to_string(id));
  return *instance;
}

absl::StatusOr<InstanceRecord> PostgresStore::FindInstance(const std::string& tenant,
                                                           const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> instance, PgInstanceByKey(*c, tenant, key));
  if (!instance) return absl::NotFoundError("no instance '" + key + "' in tenant '" + tenant + "'");
  return *instance;
}

absl::StatusOr<std::vector<StepRecord>> PostgresStore::GetSteps(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kStepColumns,
                                                        " FROM steps WHERE instance_id = "
                                                        "$1::bigint ORDER BY step_index"),
                                           Params(instance_id)));
  return PgRows(r, ReadStep<PgRow>);
}

absl::StatusOr<std::vector<KeptEvent>> PostgresStore::GetKeptEvents(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT seq, event_type, source, event_id, data_json, received_at "
                               "FROM kept_events WHERE instance_id = $1::bigint AND taken_by IS "
                               "NULL ORDER BY seq",
                               Params(instance_id)));
  return PgRows(r, ReadKeptEvent<PgRow>);
}

absl::StatusOr<std::vector<AttemptRecord>> PostgresStore::ListAttempts(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kPgAttemptColumns,
                                                        " FROM attempts WHERE instance_id = "
                                                        "$1::bigint ORDER BY step_index, seq"),
                                           Params(instance_id)));
  return PgRows(r, ReadAttempt<PgRow>);
}

absl::StatusOr<std::vector<AttemptRecord>> PostgresStore::ListAttemptPage(const AttemptQuery& q) {
  // One step by the primary key, every step by attempts_newest: the cursor's row
  // value is the index's order, so a page is a range read from where it left off.
  static const std::string kOfStep =
      absl::StrCat("SELECT ", kPgAttemptColumns,
                   " FROM attempts WHERE instance_id = $1::bigint AND step_index = $2::integer "
                   "AND seq < $3::integer ORDER BY seq DESC LIMIT $4::integer");
  static const std::string kOfAll = absl::StrCat(
      "SELECT ", kPgAttemptColumns,
      " FROM attempts WHERE instance_id = $1::bigint AND (started_at, step_index, seq) < "
      "($2::bigint, $3::integer, $4::integer) ORDER BY started_at DESC, step_index DESC, seq "
      "DESC LIMIT $5::integer");
  const AttemptCursor after = q.after.value_or(kNewestAttempt);
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r, q.step_index
                      ? c->Query(kOfStep, Params(q.instance_id, *q.step_index, after.seq, q.limit))
                      : c->Query(kOfAll, Params(q.instance_id, after.started_at, after.step_index,
                                                after.seq, q.limit)));
  return PgRows(r, ReadAttempt<PgRow>);
}

absl::StatusOr<std::vector<StepAttemptCounts>> PostgresStore::CountAttempts(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(kCountAttempts, Params(instance_id)));
  return WithAttempts(PgRows(r, ReadAttemptCounts<PgRow>));
}

absl::StatusOr<TombstoneRecord> PostgresStore::FindTombstone(const std::string& tenant,
                                                             const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(std::optional<TombstoneRecord> t, PgTombstoneOfKey(*c, tenant, key));
  if (!t) return absl::NotFoundError("no tombstone for '" + key + "' in tenant '" + tenant + "'");
  return *t;
}

absl::StatusOr<std::vector<InstanceRecord>> PostgresStore::ListInstances(
    const InstanceFilter& filter) {
  static const std::string kList = absl::StrCat(
      "SELECT ", kInstanceColumns,
      " FROM instances i WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR "
      "workflow = $2) AND ($3::smallint IS NULL OR state = $3) AND id > $5::bigint AND "
      "created_at >= $6::bigint AND ($7::bigint = 0 OR created_at < $7::bigint) AND "
      "($8::smallint IS NULL OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = i.id AND "
      "s.error_class = $8::smallint)) AND ($9::integer = 0 OR EXISTS (SELECT 1 FROM alerts a "
      "WHERE a.instance_id = i.id AND a.state IN ",
      SqlLiveAlertStates(),
      " AND ($10::smallint = 0 OR a.kind = $10::smallint))) AND updated_at >= $11::bigint AND "
      "($12::bigint = 0 OR updated_at < $12::bigint) AND ($13::text IS NULL OR "
      "left(definition_hash, length($13)) = $13) AND (($14::text IS NULL AND $15::smallint IS "
      "NULL) OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = i.id AND ($14::text IS NULL "
      "OR s.name = $14) AND ($15::smallint IS NULL OR s.state = $15))) AND ($16::integer = 0 OR "
      "EXISTS (SELECT 1 FROM attempts t WHERE t.instance_id = i.id AND t.status = "
      "$16::integer AND ($14::text IS NULL OR t.step_index IN (SELECT s.step_index FROM steps s "
      "WHERE s.instance_id = i.id AND s.name = $14)))) AND ($17::text IS NULL OR i.id IN (SELECT "
      "instance_id FROM steps WHERE "
      "external_id = $17 AND external_id <> '')) AND ($18::text IS NULL OR left(business_key, "
      "length($18)) = $18) ORDER BY id LIMIT $4::integer");
  auto number = [](auto value) { return std::optional<int64_t>(static_cast<int64_t>(value)); };
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(
      PgResult r,
      c->Query(
          kList,
          Params(filter.tenant, filter.workflow,
                 filter.state ? number(*filter.state) : std::nullopt, filter.limit, filter.after_id,
                 filter.created_from, filter.created_to,
                 filter.error_class ? number(*filter.error_class) : std::nullopt,
                 static_cast<int64_t>(filter.with_alert || filter.alert_kind ? 1 : 0),
                 static_cast<int64_t>(filter.alert_kind ? static_cast<int64_t>(*filter.alert_kind)
                                                        : 0),
                 filter.updated_from, filter.updated_to, filter.definition_prefix, filter.step,
                 filter.step_state ? number(*filter.step_state) : std::nullopt,
                 static_cast<int64_t>(filter.http_status), filter.external_id, filter.key_prefix)));
  return PgRows(r, ReadInstance<PgRow>);
}

absl::StatusOr<std::vector<EventRecord>> PostgresStore::ListEvents(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kEventColumns,
                                                        " FROM outbox WHERE instance_id = "
                                                        "$1::bigint ORDER BY seq"),
                                           Params(instance_id)));
  return PgRows(r, ReadEvent<PgRow>);
}

absl::StatusOr<std::vector<AuditRecord>> PostgresStore::ListAudit(int64_t instance_id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r, c->Query(absl::StrCat("SELECT ", kAuditColumns,
                                                        " FROM audit_log WHERE instance_id = "
                                                        "$1::bigint ORDER BY seq"),
                                           Params(instance_id)));
  return PgRows(r, ReadAudit<PgRow>);
}

absl::StatusOr<std::optional<IdempotencyClaim>> PostgresStore::GetIdempotencyClaim(
    const std::string& tenant, const std::string& key) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  WS_ASSIGN_OR_RETURN(PgResult r,
                      c->Query("SELECT request_hash, instance_id, step_name, expires_at FROM "
                               "idempotency_keys WHERE tenant = $1 AND key = $2",
                               Params(tenant, key)));
  return PgFirstRow(r, [&](const PgRow& row) {
    return IdempotencyClaim{tenant, key, row.Text(0), row.Int(1), row.Text(2), row.Int(3)};
  });
}

absl::StatusOr<std::optional<InboxEntry>> PostgresStore::LookupInbox(const std::string& tenant,
                                                                     const std::string& source,
                                                                     const std::string& id) {
  WS_ASSIGN_OR_RETURN(Lent c, Acquire());
  return PgInboxEntry(*c, tenant, source, id);
}

}  // namespace waystone
