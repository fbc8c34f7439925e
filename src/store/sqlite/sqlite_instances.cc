// SqliteStore: definitions, starts and the reads of instances (InstanceStore,
// DefinitionStore).

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "store/sql_values.h"
#include "store/sqlite/sqlite_rows.h"
#include "store/sqlite/sqlite_store.h"
#include "store/start_decision.h"

namespace waystone {
namespace {

// The SQL of a start; the algorithm is StartInstanceWith.
class SqliteStartSql final : public StartSql {
 public:
  explicit SqliteStartSql(SqliteDb& db) : db_(db) {}

  absl::Status Savepoint() override { return db_.Run("SAVEPOINT start"); }
  absl::Status RollbackToSavepoint() override { return db_.Run("ROLLBACK TO SAVEPOINT start"); }
  absl::Status ReleaseSavepoint() override { return db_.Run("RELEASE SAVEPOINT start"); }

  absl::StatusOr<bool> ClaimStartEvent(const NewInstance& in) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * claim,
                        db_.Prepare("INSERT OR IGNORE INTO inbox (tenant, source, event_id, "
                                    "data_hash, received_at) VALUES (?, ?, ?, ?, ?)"));
    WS_RETURN_IF_ERROR(
        claim->BindAll(in.tenant, in.event_source, in.event_id, in.event_data_hash, in.now).Run());
    return db_.Changes() == 1;
  }
  absl::StatusOr<std::optional<InboxEntry>> ReadInbox(const std::string& tenant,
                                                      const std::string& source,
                                                      const std::string& id) override {
    return SqliteInboxEntry(db_, tenant, source, id);
  }
  absl::StatusOr<std::optional<InstanceRecord>> InstanceById(int64_t id) override {
    return SqliteInstanceById(db_, id);
  }
  absl::StatusOr<std::optional<InstanceRecord>> InstanceByKey(const std::string& tenant,
                                                              const std::string& key) override {
    return SqliteInstanceByKey(db_, tenant, key);
  }
  absl::StatusOr<std::optional<TombstoneRecord>> TombstoneOfInstance(int64_t id) override {
    return SqliteTombstoneOfInstance(db_, id);
  }
  // BEGIN IMMEDIATE: no gc runs between the tombstone's read and the insert, so
  // the insert is tried only where there is none.
  absl::StatusOr<Insertion> InsertInstance(const NewInstance& in,
                                           const std::string& source_event) override {
    static const std::string kInsert = absl::StrCat(
        "INSERT INTO instances (tenant, business_key, workflow, definition_hash, input_json, "
        "input_hash, state, next_run_at, trace_id, source_event, created_at, updated_at, "
        "lease_owner, lease_expires_at, lease_epoch, started_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ",
        SqlValue(InstanceState::kRunning),
        ", ?7, ?8, ?9, ?7, ?7, ?10, ?11, CASE WHEN ?10 = '' THEN 0 ELSE 1 END, ?12) ON CONFLICT "
        "(tenant, business_key) DO NOTHING");
    Insertion insertion;
    WS_ASSIGN_OR_RETURN(insertion.tombstone, SqliteTombstoneOfKey(db_, in.tenant, in.key));
    if (insertion.tombstone) return insertion;
    WS_ASSIGN_OR_RETURN(SqliteStatement * insert, db_.Prepare(kInsert));
    WS_RETURN_IF_ERROR(insert
                           ->BindAll(in.tenant, in.key, in.workflow, in.definition_hash,
                                     in.input_json, in.input_hash, in.now, in.trace_id,
                                     source_event, in.lease_owner, in.lease_expires_at,
                                     in.started_by)
                           .Run());
    if (db_.Changes() > 0) insertion.created = db_.LastInsertRowId();
    return insertion;
  }
  absl::Status InsertPendingSteps(int64_t id, const std::vector<std::string>& names) override {
    static const std::string kInsert =
        absl::StrCat("INSERT INTO steps (instance_id, step_index, name, state) VALUES (?, ?, ?, ",
                     SqlValue(StepState::kPending), ")");
    WS_ASSIGN_OR_RETURN(SqliteStatement * step, db_.Prepare(kInsert));
    for (size_t i = 0; i < names.size(); ++i) {
      WS_RETURN_IF_ERROR(step->BindAll(id, static_cast<int64_t>(i), names[i]).Run());
      step->Reset();
    }
    return absl::OkStatus();
  }
  absl::Status InsertEvent(const EventRecord& event, int64_t instance_id, Millis now) override {
    return SqliteInsertEvent(db_, event, instance_id, now);
  }
  absl::Status SignalWork() override { return absl::OkStatus(); }  // workers poll
  absl::Status LinkInbox(const NewInstance& in, int64_t instance_id) override {
    WS_ASSIGN_OR_RETURN(SqliteStatement * link,
                        db_.Prepare("UPDATE inbox SET instance_id = ? WHERE tenant = ? AND "
                                    "source = ? AND event_id = ?"));
    return link->BindAll(instance_id, in.tenant, in.event_source, in.event_id).Run();
  }
  absl::Status AddToCounter(const std::string& name, int64_t delta) override {
    return SqliteAddToCounter(db_, name, delta);
  }

 private:
  SqliteDb& db_;
};

}  // namespace

absl::Status SqliteStore::PutDefinition(const std::string& hash, const std::string& workflow,
                                        const std::string& source, const std::string& text,
                                        Millis now) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("INSERT OR IGNORE INTO definitions VALUES (?, ?, ?, ?, ?)"));
  return s->BindAll(hash, workflow, source, text, now).Run();
}

absl::StatusOr<std::string> SqliteStore::GetDefinition(const std::string& hash) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT body FROM definitions WHERE hash = ?"));
  s->BindAll(hash);
  WS_ASSIGN_OR_RETURN(std::optional<std::string> body, FirstRow(s, ReadText0<SqliteStatement>));
  if (!body) return absl::NotFoundError("no definition with hash " + hash);
  return *body;
}

absl::StatusOr<StartResult> SqliteStore::StartInstance(const NewInstance& in) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransactionFor(db, [&] {
    SqliteStartSql sql(db);
    return StartInstanceWith(sql, in);
  });
}

absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> SqliteStore::StartInstances(
    const std::vector<NewInstance>& starts) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  return InWriteTransactionFor(db, [&] { return SqliteStartInstances(db, starts); });
}

absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> SqliteStartInstances(
    SqliteDb& db, const std::vector<NewInstance>& starts) {
  SqliteStartSql sql(db);
  return StartInstancesWith(sql, starts);
}

absl::StatusOr<InstanceRecord> SqliteStore::GetInstance(int64_t id) {
  WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> instance,
                      Reading([&](SqliteDb& db) { return SqliteInstanceById(db, id); }));
  if (!instance) return absl::NotFoundError("no instance with id " + std::to_string(id));
  return *instance;
}

absl::StatusOr<InstanceRecord> SqliteStore::FindInstance(const std::string& tenant,
                                                         const std::string& key) {
  WS_ASSIGN_OR_RETURN(std::optional<InstanceRecord> instance,
                      Reading([&](SqliteDb& db) { return SqliteInstanceByKey(db, tenant, key); }));
  if (!instance) return absl::NotFoundError("no instance '" + key + "' in tenant '" + tenant + "'");
  return *instance;
}

absl::StatusOr<std::vector<StepRecord>> SqliteStore::GetSteps(int64_t instance_id) {
  static const std::string kSteps = absl::StrCat(
      "SELECT ", kStepColumns, " FROM steps WHERE instance_id = ? ORDER BY step_index");
  return Reading([&](SqliteDb& db) -> absl::StatusOr<std::vector<StepRecord>> {
    WS_ASSIGN_OR_RETURN(SqliteStatement * s, db.Prepare(kSteps));
    s->BindAll(instance_id);
    return CollectRows(s, ReadStep<SqliteStatement>);
  });
}

absl::StatusOr<std::vector<KeptEvent>> SqliteStore::GetKeptEvents(int64_t instance_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare("SELECT seq, event_type, source, event_id, data_json, "
                                   "received_at FROM kept_events WHERE instance_id = ? AND "
                                   "taken_by IS NULL ORDER BY seq"));
  s->BindAll(instance_id);
  return CollectRows(s, ReadKeptEvent<SqliteStatement>);
}

absl::StatusOr<std::vector<AttemptRecord>> SqliteStore::ListAttempts(int64_t instance_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("SELECT ", kAttemptColumns,
                                                " FROM attempts WHERE instance_id = ? ORDER BY "
                                                "step_index, seq")));
  s->BindAll(instance_id);
  return CollectRows(s, ReadAttempt<SqliteStatement>);
}

absl::StatusOr<std::vector<AttemptRecord>> SqliteStore::ListAttemptPage(const AttemptQuery& q) {
  // One step by the primary key, every step by attempts_newest: the cursor's row
  // value is the index's order, so a page is a range read from where it left off.
  static const std::string kOfStep =
      absl::StrCat("SELECT ", kAttemptColumns,
                   " FROM attempts WHERE instance_id = ?1 AND step_index = ?2 AND seq < ?4 "
                   "ORDER BY seq DESC LIMIT ?5");
  static const std::string kOfAll =
      absl::StrCat("SELECT ", kAttemptColumns,
                   " FROM attempts WHERE instance_id = ?1 AND (started_at, step_index, seq) < "
                   "(?6, ?3, ?4) ORDER BY started_at DESC, step_index DESC, seq DESC LIMIT ?5");
  const AttemptCursor after = q.after.value_or(kNewestAttempt);
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare(q.step_index ? kOfStep : kOfAll));
  s->Bind(1, q.instance_id).Bind(2, q.step_index.value_or(0)).Bind(3, after.step_index);
  s->Bind(4, after.seq).Bind(5, q.limit);
  if (!q.step_index) s->Bind(6, after.started_at);
  return CollectRows(s, ReadAttempt<SqliteStatement>);
}

absl::StatusOr<std::vector<StepAttemptCounts>> SqliteStore::CountAttempts(int64_t instance_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare(kCountAttempts));
  s->BindAll(instance_id);
  WS_ASSIGN_OR_RETURN(std::vector<StepAttemptCounts> counts,
                      CollectRows(s, ReadAttemptCounts<SqliteStatement>));
  return WithAttempts(std::move(counts));
}

absl::StatusOr<TombstoneRecord> SqliteStore::FindTombstone(const std::string& tenant,
                                                           const std::string& key) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(std::optional<TombstoneRecord> t, SqliteTombstoneOfKey(*db_, tenant, key));
  if (!t) return absl::NotFoundError("no tombstone for '" + key + "' in tenant '" + tenant + "'");
  return *t;
}

absl::StatusOr<std::vector<InstanceRecord>> SqliteStore::ListInstances(
    const InstanceFilter& filter) {
  static const std::string kList = absl::StrCat(
      "SELECT ", kInstanceColumns,
      " FROM instances i WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR workflow = ?2) AND "
      "(?3 IS NULL OR state = ?3) AND id > ?5 AND created_at >= ?6 AND (?7 = 0 OR created_at < "
      "?7) AND (?8 IS NULL OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = i.id AND "
      "s.error_class = ?8)) AND (?9 = 0 OR EXISTS (SELECT 1 FROM alerts a WHERE a.instance_id = "
      "i.id AND a.state IN ",
      SqlLiveAlertStates(),
      " AND (?10 = 0 OR a.kind = ?10))) AND updated_at >= ?11 AND (?12 = 0 OR updated_at < ?12) "
      "AND (?13 IS NULL OR substr(definition_hash, 1, length(?13)) = ?13) AND ((?14 IS NULL AND "
      "?15 IS NULL) OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = i.id AND (?14 IS NULL "
      "OR s.name = ?14) AND (?15 IS NULL OR s.state = ?15))) AND (?16 = 0 OR EXISTS (SELECT 1 "
      "FROM attempts t WHERE t.instance_id = i.id AND t.status = ?16 AND (?14 IS NULL OR "
      "t.step_index IN (SELECT s.step_index FROM steps s WHERE s.instance_id = i.id AND s.name = "
      "?14)))) AND (?17 IS NULL OR i.id "
      "IN (SELECT instance_id FROM steps WHERE external_id = ?17 AND external_id <> '')) AND "
      "(?18 IS NULL OR substr(business_key, 1, length(?18)) = ?18) ORDER BY id LIMIT ?4");
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare(kList));
  auto bind_text = [s](int at, const std::optional<std::string>& value) {
    if (value)
      s->Bind(at, std::string_view(*value));
    else
      s->BindNull(at);
  };
  auto bind_number = [s](int at, std::optional<int64_t> value) {
    if (value)
      s->Bind(at, *value);
    else
      s->BindNull(at);
  };
  auto number = [](auto value) { return std::optional<int64_t>(static_cast<int64_t>(value)); };
  bind_text(1, filter.tenant);
  bind_text(2, filter.workflow);
  bind_number(3, filter.state ? number(*filter.state) : std::nullopt);
  s->Bind(4, static_cast<int64_t>(filter.limit));
  s->Bind(5, filter.after_id).Bind(6, filter.created_from).Bind(7, filter.created_to);
  bind_number(8, filter.error_class ? number(*filter.error_class) : std::nullopt);
  s->Bind(9, static_cast<int64_t>(filter.with_alert || filter.alert_kind ? 1 : 0));
  s->Bind(10,
          static_cast<int64_t>(filter.alert_kind ? static_cast<int64_t>(*filter.alert_kind) : 0));
  s->Bind(11, filter.updated_from).Bind(12, filter.updated_to);
  bind_text(13, filter.definition_prefix);
  bind_text(14, filter.step);
  bind_number(15, filter.step_state ? number(*filter.step_state) : std::nullopt);
  s->Bind(16, static_cast<int64_t>(filter.http_status));
  bind_text(17, filter.external_id);
  bind_text(18, filter.key_prefix);
  return CollectRows(s, ReadInstance<SqliteStatement>);
}

absl::StatusOr<std::vector<EventRecord>> SqliteStore::ListEvents(int64_t instance_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s, db_->Prepare(absl::StrCat(
                                               "SELECT ", kEventColumns,
                                               " FROM outbox WHERE instance_id = ? ORDER BY seq")));
  s->BindAll(instance_id);
  return CollectRows(s, ReadEvent<SqliteStatement>);
}

absl::StatusOr<std::vector<AuditRecord>> SqliteStore::ListAudit(int64_t instance_id) {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db_->Prepare(absl::StrCat("SELECT ", kAuditColumns,
                                                " FROM audit_log WHERE instance_id = ? ORDER BY "
                                                "seq")));
  s->BindAll(instance_id);
  return CollectRows(s, ReadAudit<SqliteStatement>);
}

absl::StatusOr<std::optional<IdempotencyClaim>> SqliteStore::GetIdempotencyClaim(
    const std::string& tenant, const std::string& key) {
  MutexLock lock(mu_);
  SqliteDb& db = *db_;  // the lambdas below run with the lock held
  WS_ASSIGN_OR_RETURN(SqliteStatement * s,
                      db.Prepare("SELECT request_hash, instance_id, step_name, expires_at FROM "
                                 "idempotency_keys WHERE tenant = ? AND key = ?"));
  s->BindAll(tenant, key);
  return FirstRow(s, [&](const SqliteStatement& r) {
    return IdempotencyClaim{tenant, key, r.Text(0), r.Int(1), r.Text(2), r.Int(3)};
  });
}

absl::StatusOr<std::optional<InboxEntry>> SqliteStore::LookupInbox(const std::string& tenant,
                                                                   const std::string& source,
                                                                   const std::string& id) {
  MutexLock lock(mu_);
  return SqliteInboxEntry(*db_, tenant, source, id);
}

}  // namespace waystone
