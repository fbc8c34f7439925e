#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/mutex.h"
#include "store/store.h"

namespace waystone {

class PgConnection;
struct PgAssumedBatch;

// Store on PostgreSQL, for many worker processes on many hosts. Claims use
// FOR UPDATE SKIP LOCKED; every commit checks the lease epoch. Holds a small pool
// of connections; a broken connection is dropped and replaced on next use, and
// the operation that saw it fails with Unavailable so the caller retries.
// Thread-safe. Its methods live in files named by concern (pg_instances,
// pg_leases, pg_commit, pg_relay, pg_alerts, pg_access, pg_maintenance; the same
// names as in sqlite/), which hold only SQL: the rules they follow are the
// dialect-neutral ones in store/.
class PostgresStore final : public Store {
 public:
  // Connects, applies pending migrations under an
  // advisory lock (safe from several processes at once), and refuses a database
  // whose schema is newer than this build.
  // `options.path` is a libpq URI.
  static absl::StatusOr<std::unique_ptr<PostgresStore>> Open(const StoreOptions& options);
  ~PostgresStore() override;

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
  // LISTENs on channel waystone_work on a connection of its own.
  absl::Status WaitForWork(Millis timeout) override;
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
  absl::StatusOr<GcReport> CollectGarbage(Millis finished_before, Millis now, Millis protect_before,
                                          bool dry_run) override;

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
  PostgresStore(std::string conninfo, int max_connections, int attempts_per_step);

  // A pooled connection, returned to the pool when destroyed (dropped if broken).
  class Lent;
  absl::StatusOr<Lent> Acquire();
  void Release(std::unique_ptr<PgConnection> connection);

  // Runs `body` on one connection inside BEGIN ... COMMIT (rolled back on error);
  // defined in pg_rows.h.
  template <typename Body>
  absl::Status InTransaction(Body&& body);
  // Runs `batch` (BEGIN first) as one pipeline, two round trips in all, and commits
  // when every result shows the rows assumed of it. False when one does not, or a
  // statement failed: rolled back, for the caller to apply the batch again one
  // statement at a time, each with its own answer. A lost connection, or a failed
  // COMMIT or ROLLBACK, is an error.
  absl::StatusOr<bool> CommitAsAssumed(const PgAssumedBatch& batch);

  absl::Status Migrate();

  std::string conninfo_;
  int max_connections_;
  const int attempts_per_step_;
  Mutex mu_;
  std::vector<std::unique_ptr<PgConnection>> idle_ ABSL_GUARDED_BY(mu_);
  // After a failed connect, new connects wait this long (doubling up to 2 s), so an
  // outage does not turn every caller into a reconnect storm.
  int64_t connect_backoff_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point next_connect_ ABSL_GUARDED_BY(mu_);
  // The definitions this store put or found: content-addressed and never removed,
  // so a start of a known one needs no statement.
  Mutex definitions_mu_;
  std::unordered_set<std::string> stored_definitions_ ABSL_GUARDED_BY(definitions_mu_);
  Mutex listen_mu_;
  std::unique_ptr<PgConnection> listener_ ABSL_GUARDED_BY(listen_mu_);
};

}  // namespace waystone
