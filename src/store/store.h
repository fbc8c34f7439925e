#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "model/classify.h"
#include "model/states.h"

namespace waystone {

// The store is the one place that speaks SQL. This header holds its records (plain
// values) and the narrow interface the engine, CLI and server use; sqlite/ and (later)
// postgres/ implement it with the same semantics.

// next_run_at of an instance that waits for an event with no deadline: never due.
inline constexpr Millis kNoDueTime = 4'000'000'000'000'000;

struct InstanceRecord {
  int64_t id = 0;
  std::string tenant;
  std::string key;              // business key, unique per tenant
  std::string workflow;
  std::string definition_hash;  // pinned: a resume uses this definition, never a newer one
  std::string input_json;
  std::string input_hash;
  InstanceState state = InstanceState::kRunning;
  std::string status_reason;    // why it stopped where it did, for operators
  Millis next_run_at = 0;
  std::string lease_owner;
  Millis lease_expires_at = 0;
  int64_t lease_epoch = 0;
  std::string trace_id;
  std::string source_event;     // "source id" of the event that started it, if any
  Millis created_at = 0;
  Millis updated_at = 0;
};

// One checkpoint: the latest state of one step of one instance.
struct StepRecord {
  int64_t instance_id = 0;
  int index = 0;
  std::string name;
  StepState state = StepState::kPending;
  int attempts = 0;                 // submissions of the step's request
  ErrorClass error_class = ErrorClass::kNone;  // of the last failed attempt
  std::string error_message;
  std::string external_id;          // order number, object location, message id
  std::string response_json;        // the response body (or a transform's output)
  std::string idempotency_key;
  std::string request_hash;
  Resolution resolution = Resolution::kNone;
  int unknowns = 0;                 // times an attempt ended with an unknown outcome
  int lookups = 0;                  // lookups made
  int compensation_attempts = 0;
  Millis next_attempt_at = 0;
  Millis started_at = 0;
  Millis finished_at = 0;
  std::string span_id;              // W3C trace-context parent id of the last call
  Millis unknown_since = 0;         // when the outcome became unknown; 0 when it is not
};

// One request sent for a step (its call, a lookup or its compensation): whether it
// left, on which connection, and what came back. One row per request the engine
// decided to send; nothing below the engine sends one without a row.
struct AttemptRecord {
  int step_index = 0;
  int seq = 0;  // 1, 2, ... per step over all phases; assigned by the store on commit
  AttemptPhase phase = AttemptPhase::kCall;
  bool sent = false;
  ConnectionUsed connection = ConnectionUsed::kNone;
  int status = 0;  // HTTP status; 0 when no complete response arrived
  ErrorClass error_class = ErrorClass::kNone;
  std::string detail;  // transport error or a short description of the answer
  Millis started_at = 0;
  Millis finished_at = 0;
};

// An event claimed in the inbox: per tenant, with a hash of its data so that the
// same id with other data is a conflict, never a silent duplicate.
struct InboxClaim {
  std::string tenant;
  std::string source;
  std::string id;
  std::string data_hash;
};

// What the inbox holds for one (tenant, source, id).
struct InboxEntry {
  std::string data_hash;
  int64_t instance_id = 0;
  Millis received_at = 0;
};

// What remains of an instance removed by gc: enough to answer a late start or
// start event for its key as existing, and to show what it did.
struct TombstoneRecord {
  std::string tenant;
  std::string workflow;
  std::string key;
  std::string input_hash;
  InstanceState final_state = InstanceState::kCompleted;
  std::string external_ids_json;  // {"step": "external id", ...}
  int64_t instance_id = 0;
  Millis finished_at = 0;
  Millis collected_at = 0;
};

// An outbox row: an event that leaves only once its transaction commits.
struct EventRecord {
  int64_t seq = 0;
  std::string event_id;
  int64_t instance_id = 0;
  std::string tenant;
  std::string type;         // e.g. waystone.step.completed
  std::string payload_json;
  Millis created_at = 0;
};

struct AlertRecord {
  int64_t id = 0;
  int64_t instance_id = 0;
  std::string tenant;
  std::string step;
  AlertKind kind = AlertKind::kNeedsOperator;
  AlertState state = AlertState::kOpen;
  std::string message;
  Millis created_at = 0;
};

struct AuditRecord {
  int64_t seq = 0;
  Millis at = 0;
  std::string actor;
  std::string tenant;
  int64_t instance_id = 0;
  std::string action;
  std::string reason;
  std::string detail_json;
};

// A claim of an idempotency key for a request hash. Committed with the step's
// `running` checkpoint: a second claim with another hash is a conflict.
struct IdempotencyClaim {
  std::string tenant;
  std::string key;
  std::string request_hash;
  int64_t instance_id = 0;
  std::string step;
  Millis expires_at = 0;
};

// The right to change one instance: valid while the stored epoch and owner match.
struct Lease {
  int64_t instance_id = 0;
  int64_t epoch = 0;
  std::string owner;
  bool operator==(const Lease&) const = default;
};

// Everything one worker commits for one instance at once. Applied all-or-nothing,
// and only while `lease` still holds (fencing).
struct Change {
  Lease lease;
  Millis now = 0;
  std::optional<InstanceState> state;
  std::optional<std::string> status_reason;
  std::optional<Millis> next_run_at;
  Millis lease_expires_at = 0;  // renewal; 0 releases the lease
  std::vector<StepRecord> steps;
  std::vector<EventRecord> events;
  std::vector<AlertRecord> alerts;
  std::vector<AuditRecord> audits;
  std::optional<IdempotencyClaim> idempotency;
  // Requests sent since the last change, recorded with their outcome.
  std::vector<AttemptRecord> attempts;
  // Resolves the instance's open and acknowledged alerts (an operator acted).
  bool resolve_alerts = false;
  // An event claimed in the inbox with this change; the change is refused with
  // AlreadyExists when (tenant, source, id) was claimed before.
  std::optional<InboxClaim> inbox;
};

// A delivery of one outbox event to one sink, claimed by a relay under a lease.
struct DeliveryClaim {
  int64_t id = 0;
  int64_t epoch = 0;
  std::string owner;
  std::string sink;
  int attempts = 0;
  EventRecord event;
};

// How a delivery attempt ended; applied with the claim as fencing token.
struct DeliveryUpdate {
  Millis now = 0;
  DeliveryState state = DeliveryState::kPending;
  int attempts = 0;
  Millis next_attempt_at = 0;
  std::string error;
  std::optional<AlertRecord> alert;        // raised with its event in the same transaction
  std::optional<EventRecord> alert_event;
  bool disable_sink = false;
};

struct DeliveryRecord {
  int64_t id = 0;
  int64_t outbox_seq = 0;
  std::string sink;
  DeliveryState state = DeliveryState::kPending;
  int attempts = 0;
  Millis next_attempt_at = 0;
  std::string last_error;
  Millis created_at = 0;
  Millis delivered_at = 0;
  std::string event_id;
  std::string event_type;
};

struct SinkStats {
  std::string sink;
  int64_t pending = 0;
  int64_t delivered = 0;
  int64_t parked = 0;
  int64_t failed_attempts = 0;
  Millis oldest_pending_at = 0;  // 0 when nothing is pending
  bool disabled = false;
};

// A step whose outcome has been unknown since `unknown_since`, with no alert yet.
struct StaleUnknown {
  int64_t instance_id = 0;
  std::string tenant;
  std::string step;
  Millis unknown_since = 0;
};

// An API token as stored: its hash, never the token itself.
struct TokenRecord {
  std::string token_hash;
  std::string name;
  std::string tenant;  // "*" for every tenant
  std::string role;    // viewer | operator | admin
  Millis created_at = 0;
  Millis revoked_at = 0;
  Millis expires_at = 0;  // 0 = never
};

// What garbage collection removed (or, in a dry run, would remove).
struct GcReport {
  int64_t instances = 0;
  int64_t steps = 0;
  int64_t events = 0;
  int64_t deliveries = 0;
  int64_t alerts = 0;
  int64_t idempotency_keys = 0;
  int64_t tombstones_written = 0;  // one per instance removed
  int64_t inbox_claims = 0;        // claims past the protection window, removed
  int64_t tombstones = 0;          // tombstones past the protection window, removed
};

struct NewInstance {
  std::string tenant;
  std::string key;
  std::string workflow;
  std::string definition_hash;
  std::string input_json;
  std::string input_hash;
  std::string trace_id;
  std::string event_source;  // with event_id: claimed in the inbox in the same transaction
  std::string event_id;
  std::string event_data_hash;
  std::vector<std::string> step_names;
  EventRecord started_event;
  Millis now = 0;
};

enum class StartOutcome : uint8_t {
  kCreated = 1,
  kExisting = 2,        // same key and same input: the existing instance
  kDuplicateEvent = 3,  // the event was already claimed: no second effect
  kEventConflict = 4,   // the event id was claimed before with other data: nothing done
  kCollected = 5,       // the key belonged to an instance gc removed: `tombstone`, nothing done
};

struct StartResult {
  StartOutcome outcome = StartOutcome::kCreated;
  InstanceRecord instance;  // for kCollected (or an event whose instance was
                            // collected): key, workflow, state from the tombstone
  std::optional<TombstoneRecord> tombstone;
  std::string stored_data_hash;  // kEventConflict: the hash the inbox holds
};

struct InstanceFilter {
  std::optional<std::string> tenant;
  std::optional<std::string> workflow;
  std::optional<InstanceState> state;
  int limit = 100;
  std::optional<ErrorClass> error_class;  // some step's last error has this class
  bool with_alert = false;                // has an open or acknowledged alert ...
  std::optional<AlertKind> alert_kind;    // ... of this kind (implies with_alert)
  Millis created_from = 0;                // created_at >= created_from
  Millis created_to = 0;                  // created_at < created_to; 0: no bound
  int64_t after_id = 0;                   // cursor: only ids above this, in id order
};

// A request made with an HTTP Idempotency-Key, and once finished its response
// (draft-ietf-httpapi-idempotency-key-header).
struct ApiRequestRecord {
  std::string tenant;
  std::string key;
  std::string request_hash;
  bool done = false;
  int status = 0;
  std::string content_type;
  std::string body;
  Millis created_at = 0;
  Millis expires_at = 0;
  std::string owner;  // the server process handling it ("<host>/<pid>/<nonce>")
};

enum class ApiRequestOutcome : uint8_t {
  kNew = 1,       // claimed: go ahead, then FinishApiRequest
  kInFlight = 2,  // the same key is being processed now
  kMismatch = 3,  // the key was used with another request
  kReplay = 4,    // finished before: send `stored`
};

struct ApiRequestClaim {
  ApiRequestOutcome outcome = ApiRequestOutcome::kNew;
  ApiRequestRecord stored;
};

// Decides a claim of `request` against the record stored under its key, if any:
// kNew when there is none, it expired, or it is in flight since before
// `stale_before` or by `dead_owner`; else what the stored record says. Pure: each
// store applies it inside its transaction and writes the claim when kNew.
ApiRequestClaim DecideApiRequest(const std::optional<ApiRequestRecord>& stored,
                                 const ApiRequestRecord& request, Millis stale_before,
                                 const std::string& dead_owner);

// Counters kept in the database, so every process adds to the same series.
inline constexpr char kCounterLeaseTakeovers[] = "lease_takeovers";
inline constexpr char kCounterInboxDuplicates[] = "inbox_duplicates";

struct StoreSummary {
  std::vector<std::pair<InstanceState, int64_t>> instances_by_state;
  int64_t retries = 0;                 // attempts beyond the first, over all steps
  int64_t unknown_outcomes = 0;
  int64_t resolved_by_lookup = 0;
  int64_t resubmitted_after_lookup = 0;
  int64_t compensations = 0;           // steps compensated
  int64_t open_alerts = 0;
  int64_t outbox_events = 0;
  int64_t attempts = 0;                // step submissions, over all steps
  int64_t resolved_by_operator = 0;
  int64_t compensation_attempts = 0;
  int64_t compensation_failures = 0;   // steps whose compensation failed
  std::vector<std::pair<ErrorClass, int64_t>> steps_by_error_class;  // last error of each step
  std::vector<std::pair<StepState, int64_t>> steps_by_state;
  int64_t lease_takeovers = 0;         // expired leases taken over by another owner
  int64_t inbox_duplicates = 0;        // events received again and not applied
};

// Store is the durable state of Waystone. Implementations are thread-safe; every
// method is one transaction. Statuses: Aborted = lease lost (fencing), retry after
// re-claiming; FailedPrecondition = a conflict that retrying will not fix;
// Unavailable = the database is busy or unreachable, retry with backoff.
class Store {
 public:
  virtual ~Store() = default;

  // Saves a definition's exact text under its hash (no-op when present).
  virtual absl::Status PutDefinition(const std::string& hash, const std::string& workflow,
                                     const std::string& source, const std::string& text,
                                     Millis now) = 0;
  // Returns the text stored under `hash`; NotFound when absent.
  virtual absl::StatusOr<std::string> GetDefinition(const std::string& hash) = 0;

  // Creates the instance with its pending steps and `started_event`, or returns the
  // existing one for the same tenant and key (kCollected with the tombstone when gc
  // removed it). A business key is unique per tenant: the same key with another
  // input hash, or held by another workflow, is FailedPrecondition naming both.
  virtual absl::StatusOr<StartResult> StartInstance(const NewInstance& instance) = 0;

  // Claims up to `limit` runnable instances (running or compensating, due, lease
  // free or expired), bumping each lease epoch.
  virtual absl::StatusOr<std::vector<Lease>> ClaimRunnable(const std::string& owner, Millis now,
                                                           Millis lease_duration, int limit) = 0;
  // Claims one instance if it is runnable or its lease has expired (its due time is
  // not checked); NotFound when absent, FailedPrecondition when leased by another.
  virtual absl::StatusOr<Lease> ClaimInstance(int64_t instance_id, const std::string& owner,
                                              Millis now, Millis lease_duration) = 0;
  // Returns the distinct owners of unexpired leases.
  virtual absl::StatusOr<std::vector<std::string>> LeaseOwners(Millis now) = 0;
  // Ends every lease held by `owner` (an owner known to be dead).
  virtual absl::Status ExpireLeases(const std::string& owner) = 0;

  // Applies each change in one shared transaction (group commit); each change is
  // all-or-nothing on its own. Returns one status per change: OK, Aborted (lease
  // lost), FailedPrecondition (idempotency key reused with another request) or
  // AlreadyExists (the change's inbox event was received before).
  // A non-OK return means the transaction as a whole failed and nothing was applied.
  virtual absl::StatusOr<std::vector<absl::Status>> Commit(const std::vector<Change>& changes) = 0;

  virtual absl::StatusOr<InstanceRecord> GetInstance(int64_t id) = 0;
  virtual absl::StatusOr<InstanceRecord> FindInstance(const std::string& tenant,
                                                      const std::string& key) = 0;
  virtual absl::StatusOr<std::vector<StepRecord>> GetSteps(int64_t instance_id) = 0;
  // Returns the attempt records of an instance in (step, seq) order.
  virtual absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t instance_id) = 0;
  // Returns the tombstone of a collected key; NotFound when there is none.
  virtual absl::StatusOr<TombstoneRecord> FindTombstone(const std::string& tenant,
                                                        const std::string& key) = 0;
  virtual absl::StatusOr<std::vector<InstanceRecord>> ListInstances(
      const InstanceFilter& filter) = 0;
  virtual absl::StatusOr<std::vector<EventRecord>> ListEvents(int64_t instance_id) = 0;
  virtual absl::StatusOr<std::vector<AlertRecord>> ListAlerts(int64_t instance_id) = 0;
  virtual absl::StatusOr<std::vector<AuditRecord>> ListAudit(int64_t instance_id) = 0;
  virtual absl::StatusOr<std::optional<IdempotencyClaim>> GetIdempotencyClaim(
      const std::string& tenant, const std::string& key) = 0;
  virtual absl::StatusOr<StoreSummary> Summary() = 0;
  // Returns the earliest next_run_at of a runnable instance, if any.
  virtual absl::StatusOr<std::optional<Millis>> NextDueTime() = 0;

  // Blocks up to `timeout` until the store signals that an instance became
  // runnable (started, or released to run now) — or returns Unimplemented at once
  // when the store has no such signal (callers then poll). Early returns are allowed.
  virtual absl::Status WaitForWork(Millis timeout) {
    (void)timeout;
    return absl::UnimplementedError("no work notifications");
  }

  // --- Outbox delivery (the relay) ---

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
  virtual absl::Status FinishDelivery(const DeliveryClaim& claim,
                                      const DeliveryUpdate& update) = 0;
  // Returns the owners of unexpired delivery leases; ends those of one owner.
  virtual absl::StatusOr<std::vector<std::string>> DeliveryLeaseOwners(Millis now) = 0;
  virtual absl::Status ExpireDeliveryLeases(const std::string& owner) = 0;
  virtual absl::StatusOr<std::vector<std::string>> DisabledSinks() = 0;
  virtual absl::Status EnableSink(const std::string& sink, Millis now) = 0;
  virtual absl::StatusOr<std::vector<DeliveryRecord>> ListDeliveries(int64_t instance_id) = 0;
  virtual absl::StatusOr<std::vector<SinkStats>> DeliveryStats() = 0;
  // Returns unknown steps unknown since before `unknown_before` without an
  // unknown_unresolved alert raised since.
  virtual absl::StatusOr<std::vector<StaleUnknown>> StaleUnknownSteps(Millis unknown_before) = 0;
  // Removes instances finished (completed, compensated, failed, closed) before
  // `finished_before` whose events are all delivered, with their steps, attempts,
  // events, deliveries and alerts (the audit log is kept), leaving a tombstone of
  // each; idempotency records expired by `now`; and inbox claims and tombstones
  // older than `protect_before` (the protection against late redeliveries lives
  // that long). With `dry_run` only counts. One transaction.
  virtual absl::StatusOr<GcReport> CollectGarbage(Millis finished_before, Millis now,
                                                  Millis protect_before, bool dry_run) = 0;
  // Stores a token record (AlreadyExists for a hash or a name already present).
  virtual absl::Status PutToken(const TokenRecord& token) = 0;
  // Returns the token with `token_hash`; NotFound when absent.
  virtual absl::StatusOr<TokenRecord> FindToken(const std::string& token_hash) = 0;
  // The server key `name` (made by the migrations, e.g. "public_ids"); NotFound
  // when there is none.
  virtual absl::StatusOr<std::string> ServerKey(const std::string& name) = 0;
  // Every token, by name (their hashes included: they are not the tokens).
  virtual absl::StatusOr<std::vector<TokenRecord>> ListTokens() = 0;
  // Revokes the token named `name` at `now`; NotFound when there is none,
  // FailedPrecondition when it is revoked already.
  virtual absl::Status RevokeToken(const std::string& name, Millis now) = 0;
  // Raises an alert outside any instance lease, with its outbox event.
  virtual absl::StatusOr<int64_t> RaiseAlert(const AlertRecord& alert,
                                             const EventRecord& event) = 0;
  // Returns one alert; NotFound when absent.
  virtual absl::StatusOr<AlertRecord> GetAlert(int64_t id) = 0;
  // Moves an open alert to acknowledged with `audit`, in one transaction;
  // FailedPrecondition when it is not open.
  virtual absl::Status AcknowledgeAlert(int64_t id, const AuditRecord& audit) = 0;

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
  // Returns what the inbox holds for (tenant, source, id), if anything.
  virtual absl::StatusOr<std::optional<InboxEntry>> LookupInbox(const std::string& tenant,
                                                                const std::string& source,
                                                                const std::string& id) = 0;
  // Adds `delta` to a database counter (kCounter...).
  virtual absl::Status AddToCounter(const std::string& name, int64_t delta) = 0;
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
};

// Opens (creating and migrating) the store named by `options.path`.
absl::StatusOr<std::unique_ptr<Store>> OpenStore(const StoreOptions& options);

}  // namespace waystone
