#pragma once

#include <memory>
#include <utility>

#include "base/mutex.h"
#include "store/store.h"

namespace waystone {

class SqliteDb;

// Store on one SQLite file in WAL mode. Several processes may open the same file;
// SQLite's write lock serializes their transactions. Thread-safe: one connection
// for writes and reads, guarded by a mutex; one for the most frequent reads (Reading)
// and one for reports that scan whole tables (Reporting), each guarded by a mutex of
// its own. Its methods live in files named by concern (sqlite_instances,
// sqlite_leases, sqlite_commit, sqlite_relay, sqlite_alerts, sqlite_access,
// sqlite_maintenance; the same names as in postgres/), which hold only SQL: the
// rules they follow are the dialect-neutral ones in store/.
class SqliteStore final : public Store {
 public:
  // Opens or creates the database, applies pending migrations, and refuses a file
  // whose schema is newer than this build (FailedPrecondition).
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const StoreOptions& options);
  ~SqliteStore() override;

  absl::Status PutDefinition(const std::string& hash, const std::string& workflow,
                             const std::string& source, const std::string& text,
                             Millis now) override;
  absl::StatusOr<std::string> GetDefinition(const std::string& hash) override;
  absl::StatusOr<StartResult> StartInstance(const NewInstance& instance) override;
  absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> StartInstances(
      const std::vector<NewInstance>& starts) override;
  absl::StatusOr<std::vector<Lease>> ClaimRunnable(const std::string& owner, Millis now,
                                                   Millis lease_duration, int limit) override;
  absl::StatusOr<Lease> ClaimInstance(int64_t instance_id, const std::string& owner, Millis now,
                                      Millis lease_duration) override;
  absl::StatusOr<std::vector<std::string>> LeaseOwners(Millis now) override;
  absl::Status ExpireLeases(const std::string& owner) override;
  absl::StatusOr<std::vector<absl::Status>> Commit(const std::vector<Change>& changes) override;
  // SQLite has one writer at a time: a start batch and a change batch in one
  // transaction cost one sync instead of two in a row.
  bool OneWriter() const override { return true; }
  absl::StatusOr<Committed> StartAndCommit(const std::vector<NewInstance>& starts,
                                           const std::vector<Change>& changes) override;
  absl::StatusOr<InstanceRecord> GetInstance(int64_t id) override;
  absl::StatusOr<InstanceRecord> FindInstance(const std::string& tenant,
                                              const std::string& key) override;
  absl::StatusOr<std::vector<StepRecord>> GetSteps(int64_t instance_id) override;
  absl::StatusOr<std::vector<KeptEvent>> GetKeptEvents(int64_t instance_id) override;
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t instance_id) override;
  absl::StatusOr<std::vector<AttemptRecord>> ListAttemptPage(const AttemptQuery& query) override;
  absl::StatusOr<std::vector<StepAttemptCounts>> CountAttempts(int64_t instance_id) override;
  absl::StatusOr<TombstoneRecord> FindTombstone(const std::string& tenant,
                                                const std::string& key) override;
  absl::StatusOr<std::vector<InstanceRecord>> ListInstances(const InstanceFilter& filter) override;
  absl::StatusOr<std::vector<EventRecord>> ListEvents(int64_t instance_id) override;
  absl::StatusOr<std::vector<AlertRecord>> ListAlerts(int64_t instance_id) override;
  absl::StatusOr<std::vector<AuditRecord>> ListAudit(int64_t instance_id) override;
  absl::StatusOr<std::optional<IdempotencyClaim>> GetIdempotencyClaim(
      const std::string& tenant, const std::string& key) override;
  absl::StatusOr<StoreSummary> Summary() override;
  absl::StatusOr<std::optional<Millis>> NextDueTime() override;
  absl::StatusOr<int64_t> OutboxCursor(const std::string& sink) override;
  absl::StatusOr<std::vector<EventRecord>> ReadOutbox(int64_t after_seq, int limit) override;
  absl::Status AddDeliveries(const std::string& sink, int64_t expected_cursor, int64_t new_cursor,
                             const std::vector<std::pair<int64_t, int64_t>>& wanted,
                             Millis now) override;
  absl::StatusOr<std::vector<DeliveryClaim>> ClaimDeliveries(
      const std::string& owner, Millis now, Millis lease_duration, int limit,
      const std::vector<std::string>& sinks) override;
  absl::Status FinishDelivery(const DeliveryClaim& claim, const DeliveryUpdate& update) override;
  absl::StatusOr<std::vector<absl::Status>> FinishDeliveries(
      const std::vector<FinishedDelivery>& finished) override;
  absl::StatusOr<std::vector<std::string>> DeliveryLeaseOwners(Millis now) override;
  absl::Status ExpireDeliveryLeases(const std::string& owner) override;
  absl::StatusOr<std::vector<std::string>> DisabledSinks() override;
  absl::Status EnableSink(const std::string& sink, Millis now) override;
  absl::StatusOr<std::vector<DeliveryRecord>> ListDeliveries(int64_t instance_id) override;
  absl::StatusOr<std::vector<SinkStats>> DeliveryStats() override;
  absl::StatusOr<std::vector<StaleUnknown>> StaleUnknownSteps(Millis unknown_before) override;
  // TargetStore
  absl::StatusOr<Admission> AdmitTargetCall(const TargetCallAsk& ask) override;
  absl::StatusOr<Millis> RetakeRateSlot(const TargetCallAsk& ask) override;
  absl::Status SettleTargetCall(const TargetCallSettle& settle) override;
  absl::StatusOr<TargetControl> PauseTarget(const std::string& tenant, const std::string& target,
                                            bool pause, const AuditRecord& audit) override;
  absl::StatusOr<std::vector<TargetControl>> ListTargetControls(const std::string& tenant,
                                                                Millis now) override;
  absl::StatusOr<int64_t> RaiseAlert(const AlertRecord& alert, const EventRecord& event) override;
  absl::Status PutToken(const TokenRecord& token) override;
  absl::StatusOr<TokenRecord> FindToken(const std::string& token_hash) override;
  absl::StatusOr<std::vector<TokenRecord>> ListTokens() override;
  absl::StatusOr<std::string> ServerKey(const std::string& name) override;
  absl::Status RevokeToken(const std::string& name, const AuditRecord& audit) override;
  absl::StatusOr<GcReport> CollectGarbage(Millis finished_before, Millis now, Millis protect_before,
                                          bool dry_run) override;
  absl::StatusOr<AlertRecord> GetAlert(int64_t id) override;
  absl::Status AcknowledgeAlert(int64_t id, const AuditRecord& audit) override;
  absl::StatusOr<ApiRequestClaim> BeginApiRequest(const ApiRequestRecord& request,
                                                  Millis stale_before,
                                                  const std::string& dead_owner) override;
  absl::Status FinishApiRequest(const ApiRequestRecord& finished) override;
  absl::Status AbandonApiRequest(const std::string& tenant, const std::string& key) override;
  absl::StatusOr<std::optional<InboxEntry>> LookupInbox(const std::string& tenant,
                                                        const std::string& source,
                                                        const std::string& id) override;
  absl::Status AddToCounter(const std::string& name, int64_t delta) override;

  absl::StatusOr<BatchRecord> CreateBatch(const NewBatch& batch) override;
  absl::StatusOr<BatchRecord> GetBatch(int64_t id) override;
  absl::StatusOr<BatchRecord> FindBatch(const std::string& public_id) override;
  absl::StatusOr<std::vector<BatchRecord>> ListBatches(const BatchFilter& filter) override;
  absl::StatusOr<std::vector<BatchItemRecord>> ListBatchItems(int64_t batch_id, int64_t after_id,
                                                              int limit) override;
  absl::Status ChangeBatchState(int64_t id, const std::vector<BatchState>& from, BatchState to,
                                Millis now) override;
  absl::StatusOr<std::vector<BatchItemRecord>> ClaimBatchItems(const std::string& owner, Millis now,
                                                               Millis claim_duration,
                                                               int limit) override;
  absl::StatusOr<std::vector<BatchItemRecord>> AppliedBatchItems(int limit) override;
  absl::Status UpdateBatchItem(const BatchItemUpdate& update) override;

  // Returns the schema version (the highest applied migration).
  absl::StatusOr<int> SchemaVersion();

 private:
  SqliteStore(std::unique_ptr<SqliteDb> db, int attempts_per_step);
  absl::Status Migrate();

  // A read-only connection of its own (WAL mode: it reads the last commit while the
  // writer's next transaction, fsync included, holds mu_).
  struct ReadConnection {
    Mutex mu;
    std::unique_ptr<SqliteDb> db ABSL_GUARDED_BY(mu);  // set by Open
  };

  // Runs `read` (given a connection) on `connection`, or on the writer's when there is
  // none (an in-memory database is one connection's alone).
  template <typename Read>
  auto ReadingOn(ReadConnection& connection, Read&& read)
      -> decltype(read(std::declval<SqliteDb&>())) {
    {
      MutexLock lock(connection.mu);
      if (connection.db != nullptr) return read(*connection.db);
    }
    MutexLock lock(mu_);
    return read(*db_);
  }
  // The reads workers and waiting callers make most (an instance, its steps, when work
  // is next due).
  template <typename Read>
  auto Reading(Read&& read) -> decltype(read(std::declval<SqliteDb&>())) {
    return ReadingOn(reader_, std::forward<Read>(read));
  }
  // Reports that read whole tables (metrics, delivery counts): they hold neither the
  // writer nor the workers' reader while they scan.
  template <typename Read>
  auto Reporting(Read&& read) -> decltype(read(std::declval<SqliteDb&>())) {
    return ReadingOn(reporter_, std::forward<Read>(read));
  }

  const int attempts_per_step_;
  Mutex mu_;
  std::unique_ptr<SqliteDb> db_ ABSL_GUARDED_BY(mu_);
  // (A pool of four for the frequent reads, picked by thread, measured the same as
  // one on two cores.)
  ReadConnection reader_;
  ReadConnection reporter_;
};

}  // namespace waystone
