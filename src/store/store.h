#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/records.h"
#include "store/business_work.h"

namespace waystone {

// The store is the one place that speaks SQL. This header holds its interface,
// split by concern into slices (the records they pass are in records.h); sqlite/
// and postgres/ implement all of them with the same semantics, which
// tests/conformance/store pins.

// The definitions of workflows, each kept under the hash of its exact text, so a
// started instance resumes with the definition it started with.
// One slice of Store (below); thread-safe like it.
class DefinitionStore {
 public:
  virtual ~DefinitionStore() = default;

  // Saves a definition's exact text under its hash (no-op when present).
  virtual absl::Status PutDefinition(const std::string& hash, const std::string& workflow,
                                     const std::string& source, const std::string& text,
                                     Millis now) = 0;

  // Returns the text stored under `hash`; NotFound when absent.
  virtual absl::StatusOr<std::string> GetDefinition(const std::string& hash) = 0;
};

// Who may drive which instance: claims under leases (the lease epoch is the fencing
// token every commit checks), the leases of dead owners, and when work is due.
// One slice of Store (below); thread-safe like it.
class LeaseStore {
 public:
  virtual ~LeaseStore() = default;

  // Claims up to `limit` runnable instances (running or compensating, due, lease
  // free or expired), bumping each lease epoch.
  virtual absl::StatusOr<std::vector<Lease>> ClaimRunnable(const std::string& owner, Millis now,
                                                           Millis lease_duration, int limit) = 0;

  // Claims one instance if it is runnable or its lease has expired (its due time is
  // not checked); NotFound when absent, FailedPrecondition when leased by another.
  virtual absl::StatusOr<Lease> ClaimInstance(int64_t instance_id, const std::string& owner,
                                              Millis now, Millis lease_duration) = 0;

  // Returns the distinct owners of unexpired leases on instances a worker drives
  // (running or compensating) or that need attention. An operator's lease on an
  // instance in another state is left to expire: it is held for one action.
  virtual absl::StatusOr<std::vector<std::string>> LeaseOwners(Millis now) = 0;

  // Ends every lease held by `owner` (an owner known to be dead).
  virtual absl::Status ExpireLeases(const std::string& owner) = 0;

  // Returns the earliest next_run_at of a runnable instance, if any.
  virtual absl::StatusOr<std::optional<Millis>> NextDueTime() = 0;

  // Blocks up to `timeout` until the store signals that an instance became
  // runnable (started, or released to run now) — or returns Unimplemented at once
  // when the store has no such signal (callers then poll). Early returns are allowed.
  virtual absl::Status WaitForWork(Millis timeout) {
    (void)timeout;
    return absl::UnimplementedError("no work notifications");
  }
};

// Instances and their checkpoints: starts, group commits of changes made under a
// lease, and the reads of one instance's steps, attempts, events and audit log.
// One slice of Store (below); thread-safe like it.
class InstanceStore {
 public:
  virtual ~InstanceStore() = default;

  // Creates the instance with its pending steps and `started_event`, or returns the
  // existing one for the same tenant and key (kCollected with the tombstone when gc
  // removed it). A business key is unique per tenant: the same key with another
  // input hash, or held by another workflow, is FailedPrecondition naming both.
  virtual absl::StatusOr<StartResult> StartInstance(const NewInstance& instance) = 0;

  // Starts several instances in one shared transaction (group commit), each exactly as
  // StartInstance would and under its own savepoint: one result per start, in order
  // (a start later in the batch sees the ones before it). A non-OK return means the
  // transaction as a whole failed and nothing was written: each start may run again
  // on its own.
  virtual absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> StartInstances(
      const std::vector<NewInstance>& starts) = 0;

  // Applies each change in one shared transaction (group commit); each change is
  // all-or-nothing on its own. Returns one status per change: OK, Aborted (lease
  // lost), FailedPrecondition (idempotency key reused with another request) or
  // AlreadyExists (the change's inbox event was received before).
  // A non-OK return means the transaction as a whole failed and nothing was applied.
  virtual absl::StatusOr<std::vector<absl::Status>> Commit(const std::vector<Change>& changes) = 0;

  // Whether a batch of starts and a batch of changes are best committed together
  // (StartAndCommit): true where write transactions run one at a time anyway (one
  // writer), so two of them would only wait for each other and cost two syncs.
  virtual bool OneWriter() const { return false; }

  // What one shared transaction of starts and changes answered, each in order.
  struct Committed {
    std::vector<absl::StatusOr<StartResult>> started;
    std::vector<absl::Status> applied;
  };
  // Starts `starts` as StartInstances does, then applies `changes` as Commit does,
  // in one transaction. A non-OK return means nothing was written: each start may
  // run again on its own. Unimplemented where OneWriter() is false.
  virtual absl::StatusOr<Committed> StartAndCommit(const std::vector<NewInstance>& starts,
                                                   const std::vector<Change>& changes) {
    (void)starts;
    (void)changes;
    return absl::UnimplementedError("starts and changes commit apart");
  }

  virtual absl::StatusOr<InstanceRecord> GetInstance(int64_t id) = 0;

  virtual absl::StatusOr<InstanceRecord> FindInstance(const std::string& tenant,
                                                      const std::string& key) = 0;

  virtual absl::StatusOr<std::vector<StepRecord>> GetSteps(int64_t instance_id) = 0;

  // Returns the events kept for the instance's function that no wait took yet, in
  // arrival order (Change::keep).
  virtual absl::StatusOr<std::vector<KeptEvent>> GetKeptEvents(int64_t instance_id) = 0;

  // Returns the attempt records of an instance in (step, seq) order.
  virtual absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t instance_id) = 0;

  // Returns up to `query.limit` attempts of an instance (or of one step), newest
  // first, older than `query.after`; read through an index, never every row.
  virtual absl::StatusOr<std::vector<AttemptRecord>> ListAttemptPage(const AttemptQuery& query) = 0;

  // Returns, for each step of an instance that recorded a request, how many it
  // recorded and how many are kept, in step order.
  virtual absl::StatusOr<std::vector<StepAttemptCounts>> CountAttempts(int64_t instance_id) = 0;

  // Returns the tombstone of a collected key; NotFound when there is none.
  virtual absl::StatusOr<TombstoneRecord> FindTombstone(const std::string& tenant,
                                                        const std::string& key) = 0;

  virtual absl::StatusOr<std::vector<InstanceRecord>> ListInstances(
      const InstanceFilter& filter) = 0;

  virtual absl::StatusOr<std::vector<EventRecord>> ListEvents(int64_t instance_id) = 0;

  virtual absl::StatusOr<std::vector<AuditRecord>> ListAudit(int64_t instance_id) = 0;

  virtual absl::StatusOr<std::optional<IdempotencyClaim>> GetIdempotencyClaim(
      const std::string& tenant, const std::string& key) = 0;

  // Returns what the inbox holds for (tenant, source, id), if anything.
  virtual absl::StatusOr<std::optional<InboxEntry>> LookupInbox(const std::string& tenant,
                                                                const std::string& source,
                                                                const std::string& id) = 0;
};

// Outbox delivery (the relay): cursors per sink, deliveries claimed under leases,
// disabled sinks and delivery statistics.
// One slice of Store (below); thread-safe like it.
class RelayStore {
 public:
  virtual ~RelayStore() = default;

  // Returns the last outbox seq expanded for `sink` (0 when none).
  virtual absl::StatusOr<int64_t> OutboxCursor(const std::string& sink) = 0;

  // Returns up to `limit` outbox rows with seq > `after_seq`, in seq order.
  virtual absl::StatusOr<std::vector<EventRecord>> ReadOutbox(int64_t after_seq, int limit) = 0;

  // Creates a pending delivery to `sink` for each (seq, instance id) in `wanted`
  // and moves the sink's cursor from `expected_cursor` to `new_cursor`, in one
  // transaction; Aborted when another relay moved the cursor first.
  virtual absl::Status AddDeliveries(const std::string& sink, int64_t expected_cursor,
                                     int64_t new_cursor,
                                     const std::vector<std::pair<int64_t, int64_t>>& wanted,
                                     Millis now) = 0;

  // Claims up to `limit` due deliveries to `sinks`: only the oldest pending
  // delivery of each instance per sink (order per instance), lease free or expired.
  virtual absl::StatusOr<std::vector<DeliveryClaim>> ClaimDeliveries(
      const std::string& owner, Millis now, Millis lease_duration, int limit,
      const std::vector<std::string>& sinks) = 0;

  // Records an attempt's outcome and releases the claim; Aborted when the lease
  // was lost (another relay owns the delivery now).
  virtual absl::Status FinishDelivery(const DeliveryClaim& claim, const DeliveryUpdate& update) = 0;

  // Records several attempts' outcomes in one transaction, each as FinishDelivery
  // would; returns one status per attempt, in order: OK, or Aborted where that
  // lease was lost (nothing of that one is recorded; the others are). An error
  // records none of them.
  virtual absl::StatusOr<std::vector<absl::Status>> FinishDeliveries(
      const std::vector<FinishedDelivery>& finished) = 0;

  // Returns the owners of unexpired leases on pending deliveries; ends those of one
  // owner.
  virtual absl::StatusOr<std::vector<std::string>> DeliveryLeaseOwners(Millis now) = 0;

  virtual absl::Status ExpireDeliveryLeases(const std::string& owner) = 0;

  virtual absl::StatusOr<std::vector<std::string>> DisabledSinks() = 0;

  virtual absl::Status EnableSink(const std::string& sink, Millis now) = 0;

  virtual absl::StatusOr<std::vector<DeliveryRecord>> ListDeliveries(int64_t instance_id) = 0;

  virtual absl::StatusOr<std::vector<SinkStats>> DeliveryStats() = 0;
};

// Alerts raised outside an instance lease, read and acknowledged by operators, and
// the unknown outcomes that have waited long enough to need one.
// One slice of Store (below); thread-safe like it.
class AlertStore {
 public:
  virtual ~AlertStore() = default;

  // Raises an alert outside any instance lease, with its outbox event.
  virtual absl::StatusOr<int64_t> RaiseAlert(const AlertRecord& alert,
                                             const EventRecord& event) = 0;

  // Returns one alert; NotFound when absent.
  virtual absl::StatusOr<AlertRecord> GetAlert(int64_t id) = 0;

  // Moves an open alert to acknowledged with `audit`, in one transaction;
  // FailedPrecondition when it is not open.
  virtual absl::Status AcknowledgeAlert(int64_t id, const AuditRecord& audit) = 0;

  virtual absl::StatusOr<std::vector<AlertRecord>> ListAlerts(int64_t instance_id) = 0;

  // Returns unknown steps unknown since before `unknown_before` without an
  // unknown_unresolved alert raised since.
  virtual absl::StatusOr<std::vector<StaleUnknown>> StaleUnknownSteps(Millis unknown_before) = 0;
};

// Access to the HTTP API: hashed tokens, server keys, and requests made with an
// Idempotency-Key.
// One slice of Store (below); thread-safe like it.
class AccessStore {
 public:
  virtual ~AccessStore() = default;

  // Stores a token record (AlreadyExists for a hash or a name already present).
  virtual absl::Status PutToken(const TokenRecord& token) = 0;

  // Returns the token with `token_hash`; NotFound when absent.
  virtual absl::StatusOr<TokenRecord> FindToken(const std::string& token_hash) = 0;

  // Every token, by name (their hashes included: they are not the tokens).
  virtual absl::StatusOr<std::vector<TokenRecord>> ListTokens() = 0;

  // Revokes the token named `name` at `audit.at` and appends `audit` (its
  // instance_id 0: about no instance), in one transaction; NotFound when there is
  // none, FailedPrecondition when it is revoked already.
  virtual absl::Status RevokeToken(const std::string& name, const AuditRecord& audit) = 0;

  // The server key `name` (made by the migrations, e.g. "public_ids"); NotFound
  // when there is none.
  virtual absl::StatusOr<std::string> ServerKey(const std::string& name) = 0;

  // Claims `request.key` for `request.request_hash` (one transaction): kNew when
  // free or expired, or in flight since before `stale_before` or by `dead_owner`
  // (its server died), else what the stored record says.
  virtual absl::StatusOr<ApiRequestClaim> BeginApiRequest(const ApiRequestRecord& request,
                                                          Millis stale_before,
                                                          const std::string& dead_owner) = 0;

  // Stores the response of a claimed request.
  virtual absl::Status FinishApiRequest(const ApiRequestRecord& finished) = 0;

  // Frees a claimed key without a stored response (the request could not be served).
  virtual absl::Status AbandonApiRequest(const std::string& tenant, const std::string& key) = 0;
};

// Housekeeping and figures: garbage collection, the summary behind metrics and
// `waystone stats`, and counters kept in the database.
// One slice of Store (below); thread-safe like it.
class MaintenanceStore {
 public:
  virtual ~MaintenanceStore() = default;

  virtual absl::StatusOr<StoreSummary> Summary() = 0;

  // Removes instances finished (completed, compensated, failed, closed) before
  // `finished_before` whose events are all delivered, with their steps, attempts,
  // events, deliveries and alerts (the audit log is kept), leaving a tombstone of
  // each; idempotency records expired by `now`; and inbox claims and tombstones
  // older than `protect_before` (the protection against late redeliveries lives
  // that long). With `dry_run` only counts. One transaction.
  virtual absl::StatusOr<GcReport> CollectGarbage(Millis finished_before, Millis now,
                                                  Millis protect_before, bool dry_run) = 0;

  // Adds `delta` to a database counter (kCounter...).
  virtual absl::Status AddToCounter(const std::string& name, int64_t delta) = 0;
};
// Batches of operator actions over a filter's instances, and the claims their
// runners take on items (so one item is applied by one runner, and a runner that
// died leaves its claims to expire).
// One slice of Store (below); thread-safe like it.
class BatchStore {
 public:
  virtual ~BatchStore() = default;

  // Creates the batch (state running) with its pending items, in one transaction;
  // returns it with its id.
  virtual absl::StatusOr<BatchRecord> CreateBatch(const NewBatch& batch) = 0;

  // Returns the batch with its counts; NotFound when absent.
  virtual absl::StatusOr<BatchRecord> GetBatch(int64_t id) = 0;
  virtual absl::StatusOr<BatchRecord> FindBatch(const std::string& public_id) = 0;

  // Returns batches newest first, with their counts.
  virtual absl::StatusOr<std::vector<BatchRecord>> ListBatches(const BatchFilter& filter) = 0;

  // Returns up to `limit` items of a batch with ids above `after_id`, in id order.
  virtual absl::StatusOr<std::vector<BatchItemRecord>> ListBatchItems(int64_t batch_id,
                                                                      int64_t after_id,
                                                                      int limit) = 0;

  // Moves the batch from one of `from` to `to`, in one transaction: to kCancelled
  // also cancels its pending items; to kRunning finishes it when no item is open
  // (pending, applying, applied). FailedPrecondition when its state is not in `from`.
  virtual absl::Status ChangeBatchState(int64_t id, const std::vector<BatchState>& from,
                                        BatchState to, Millis now) = 0;

  // Claims up to `limit` items for `owner` until now + claim_duration: pending items
  // of running batches, and applying items whose claim expired; oldest batch first.
  // Each claim counts a try. Concurrent claimers never get the same item.
  virtual absl::StatusOr<std::vector<BatchItemRecord>> ClaimBatchItems(const std::string& owner,
                                                                       Millis now,
                                                                       Millis claim_duration,
                                                                       int limit) = 0;

  // Returns up to `limit` applied items (of any batch), oldest applied first.
  virtual absl::StatusOr<std::vector<BatchItemRecord>> AppliedBatchItems(int limit) = 0;

  // Applies `update` when the item is still in `update.from` (and held by
  // `update.owner` when that is kApplying), then finishes its batch if it is
  // running and no item is open, in one transaction. FailedPrecondition when the
  // item moved on (another runner took it).
  virtual absl::Status UpdateBatchItem(const BatchItemUpdate& update) = 0;
};

// The shared control of protected targets (model/target_gate.h): an operator's
// pause, the rate limit, the concurrency cap and the circuit breaker, kept per
// (tenant, target) so that every worker process on the database obeys them.
// One slice of Store (below); thread-safe like it.
class TargetStore {
 public:
  virtual ~TargetStore() = default;

  // Asks Admit whether the call may go, in one transaction with the target's row
  // locked (created when absent); the calls under way are its unexpired permits.
  // Admitted: the row's new state and the call's permit (expiring at now +
  // call_lease) are stored.
  virtual absl::StatusOr<Admission> AdmitTargetCall(const TargetCallAsk& ask) = 0;

  // Gives an admitted call whose rate slot passed before it could leave the next free
  // slot (RetakeSlot), in one transaction with the row locked: when it leaves. Only
  // ask's tenant, target, limits and now are read; its permit stays as it is.
  virtual absl::StatusOr<Millis> RetakeRateSlot(const TargetCallAsk& ask) = 0;

  // Removes the call's permit and records its health in the circuit (Settle), in
  // one transaction.
  virtual absl::Status SettleTargetCall(const TargetCallSettle& settle) = 0;

  // Pauses (`pause`) or resumes the target, appending `audit`, in one transaction;
  // returns the control after. FailedPrecondition when it is paused (resumed) already.
  virtual absl::StatusOr<TargetControl> PauseTarget(const std::string& tenant,
                                                    const std::string& target, bool pause,
                                                    const AuditRecord& audit) = 0;

  // The controls of `tenant` ("" = every tenant's), by tenant and target, with the
  // calls under way at `now`.
  virtual absl::StatusOr<std::vector<TargetControl>> ListTargetControls(const std::string& tenant,
                                                                        Millis now) = 0;
};

// Store is the durable state of Waystone: every slice above, as one object that
// OpenStore returns. A component takes the slice (or slices) it uses, so a fake of
// one is small. Implementations are thread-safe; every method is one transaction.
// Statuses: Aborted = lease lost (fencing), retry after re-claiming;
// FailedPrecondition = a conflict that retrying will not fix; Unavailable = the
// database is busy or unreachable, retry with backoff.
class Store : public DefinitionStore,
              public LeaseStore,
              public InstanceStore,
              public RelayStore,
              public AlertStore,
              public AccessStore,
              public MaintenanceStore,
              public BatchStore,
              public TargetStore {
 public:
  ~Store() override = default;
};

struct StoreOptions {
  // A SQLite file path (created when absent), or a postgresql:// URI.
  std::string path = "waystone.db";
  // PostgreSQL: connections kept open for reuse.
  int max_connections = 8;
  // SQLite synchronous mode: FULL (default) makes every commit durable on power loss.
  std::string synchronous = "FULL";
  // How long to wait for another process's write lock before Unavailable.
  Millis busy_timeout = 10'000;
  // Most attempt records kept per step (at least 1): a commit that adds more deletes
  // the step's oldest in the same transaction (the counts stay: CountAttempts).
  int attempts_per_step = 1000;
};

// Opens (creating and migrating) the store named by `options.path`.
absl::StatusOr<std::unique_ptr<Store>> OpenStore(const StoreOptions& options);

}  // namespace waystone
