#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "model/classify.h"
#include "model/sql_statement.h"
#include "model/states.h"
#include "model/target_gate.h"

namespace waystone {

// The store's records: plain values that the store reads and writes, and that the
// engine, relay, server and CLI pass around. No behaviour, no SQL; the tables that
// hold them are described in docs/storage-format.md.
// next_run_at of an instance that waits for an event with no deadline: never due.
inline constexpr Millis kNoDueTime = 4'000'000'000'000'000;

struct InstanceRecord {
  int64_t id = 0;
  std::string tenant;
  std::string key;  // business key, unique per tenant
  std::string workflow;
  std::string definition_hash;  // pinned: a resume uses this definition, never a newer one
  std::string input_json;
  std::string input_hash;
  InstanceState state = InstanceState::kRunning;
  std::string status_reason;  // why it stopped where it did, for operators
  Millis next_run_at = 0;
  std::string lease_owner;
  Millis lease_expires_at = 0;
  int64_t lease_epoch = 0;
  std::string trace_id;
  std::string source_event;  // "source id" of the event that started it, if any
  std::string started_by;    // the token that started it; empty from the CLI or code
  Millis created_at = 0;
  Millis updated_at = 0;
  bool operator==(const InstanceRecord&) const = default;
};

// One checkpoint: the latest state of one step of one instance.
struct StepRecord {
  int64_t instance_id = 0;
  int index = 0;
  std::string name;
  StepState state = StepState::kPending;
  int attempts = 0;                            // submissions of the step's request
  ErrorClass error_class = ErrorClass::kNone;  // of the last failed attempt
  std::string error_message;
  std::string external_id;    // order number, object location, message id
  std::string response_json;  // the response body (or a transform's output)
  std::string idempotency_key;
  std::string request_hash;
  Resolution resolution = Resolution::kNone;
  int unknowns = 0;  // times an attempt ended with an unknown outcome
  int lookups = 0;   // lookups made
  int compensation_attempts = 0;
  Millis next_attempt_at = 0;
  Millis started_at = 0;
  Millis finished_at = 0;
  std::string span_id;       // W3C trace-context parent id of the last call
  Millis unknown_since = 0;  // when the outcome became unknown; 0 when it is not
  bool operator==(const StepRecord&) const = default;
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
  // The lease under which the request was sent: its owner (the engine's worker
  // identity) and epoch. Empty and 0 when not known (the record of a call a stopped
  // worker left running, written by the worker that found it).
  std::string worker;
  int64_t lease_epoch = 0;
};

// Where a page of attempts goes on: the last attempt of the page before.
struct AttemptCursor {
  Millis started_at = 0;
  int step_index = 0;
  int seq = 0;
  bool operator==(const AttemptCursor&) const = default;
};

// One page of an instance's attempts, newest first: of one step by seq, or of all
// steps by start time, then step, then seq.
struct AttemptQuery {
  int64_t instance_id = 0;
  std::optional<int> step_index;       // one step's attempts; all steps when absent
  std::optional<AttemptCursor> after;  // only attempts older than this one
  int limit = 100;
};

// How many requests one step recorded, and how many of them the store still holds
// (the newest; the others were dropped by StoreOptions::attempts_per_step).
struct StepAttemptCounts {
  int step_index = 0;
  int64_t recorded = 0;
  int64_t kept = 0;
  bool operator==(const StepAttemptCounts&) const = default;
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

// An event delivered to a code workflow's instance while its function did not wait
// for the event's type: kept, in arrival order, until a WaitEvent for that type
// takes it (the oldest first) in the transaction that records the wait.
struct KeptEvent {
  int64_t seq = 0;  // per instance, 1, 2, ... in arrival order (the store numbers it)
  std::string event_type;
  std::string source;
  std::string event_id;
  std::string data_json;
  Millis received_at = 0;
};

// The kept event `seq` taken by the wait step at `step_index`.
struct KeptEventTake {
  int64_t seq = 0;
  int step_index = 0;
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
  std::string type;  // e.g. waystone.step.completed
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
  // A notification's delivery identity: only the instance step that claimed it first
  // sends under it (another one is refused with AlreadyExists), while it is kept.
  bool exclusive = false;
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
// A `sql` step's statement (or its compensation's), run by the store inside the
// change's transaction right after the fence, so it commits with the step's
// checkpoint and events or not at all. Its rows become the step's result.
struct BusinessStatement {
  int step_index = -1;
  std::string sqlite;            // ?N placeholders
  std::string postgres;          // $N placeholders
  std::vector<SqlParam> values;  // values[N - 1]
  // The step's result (its response_json) becomes {"rows": [...], "count": n}; false
  // for a compensation, which leaves the step's result as it was.
  bool records_result = true;
};

class BusinessWork;

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
  // Deliveries this change makes owed: the delivery identities of the notification
  // channels reporting a step it completes, each an exclusive claim with no request
  // hash yet (the message is rendered when it is sent, and the channel's own claim
  // then fills it in). Each is inserted where its identity is free, expired or given
  // up, else left to its owner; never an error.
  std::vector<IdempotencyClaim> reservations;
  // Requests sent since the last change, recorded with their outcome.
  std::vector<AttemptRecord> attempts;
  // Resolves the instance's open and acknowledged alerts (an operator acted).
  bool resolve_alerts = false;
  // An event claimed in the inbox with this change; the change is refused with
  // AlreadyExists when (tenant, source, id) was claimed before.
  std::optional<InboxClaim> inbox;
  // An event kept for the instance's function (its seq is the store's), and a kept
  // event a wait step takes: the change is refused (FailedPrecondition) when it was
  // taken before.
  std::optional<KeptEvent> keep;
  std::optional<KeptEventTake> take;
  // Statements of sql steps, run after the fence and before the step rows.
  std::vector<BusinessStatement> statements;
  // Step rows this change appends (a code workflow's steps are added as its
  // function asks for them): inserted whole, after the statements and `work` (a
  // row at the work's index gets its result), before `steps` are updated. The
  // instance must not have a row at their index.
  std::vector<StepRecord> added_steps;
  // A code workflow's transaction step (store.h): run after the fence and the
  // statements, before the step rows; its result becomes its step's response_json.
  std::shared_ptr<const BusinessWork> work;
  // A revision: the instance's input from now on. Its input_hash stays the start's
  // (what a start with the same key is compared with).
  std::optional<std::string> input_json;
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
  std::optional<AlertRecord> alert;  // raised with its event in the same transaction
  std::optional<EventRecord> alert_event;
  bool disable_sink = false;
};

// One ended attempt with its claim (RelayStore::FinishDeliveries).
struct FinishedDelivery {
  DeliveryClaim claim;
  DeliveryUpdate update;
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

// A call to a protected target, asked to be admitted under its shared control.
struct TargetCallAsk {
  std::string tenant;
  std::string target;
  TargetLimits limits;
  Millis now = 0;
  Millis horizon = 0;     // rate slots are taken at most this far ahead
  Millis call_lease = 0;  // the permit (and a probe's hold) expires after this
  std::string permit;     // names the call's permit when admitted
};

// An admitted call's end: its permit goes, its health goes into the circuit.
struct TargetCallSettle {
  std::string tenant;
  std::string target;
  TargetLimits limits;
  std::string permit;
  bool probe = false;
  CallHealth health = CallHealth::kUntold;
  Millis now = 0;
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
  std::string started_by;    // the token that starts it (InstanceRecord::started_by)
  std::string event_source;  // with event_id: claimed in the inbox in the same transaction
  std::string event_id;
  std::string event_data_hash;
  std::vector<std::string> step_names;
  EventRecord started_event;
  Millis now = 0;
  // Created already leased (epoch 1) to this owner until lease_expires_at, for a
  // worker of its own that is free: no claim follows, and no other worker is woken.
  // Empty: created for whichever worker claims it first.
  std::string lease_owner;
  Millis lease_expires_at = 0;
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
  std::optional<ErrorClass> error_class;         // some step's last error has this class
  bool with_alert = false;                       // has an open or acknowledged alert ...
  std::optional<AlertKind> alert_kind;           // ... of this kind (implies with_alert)
  Millis created_from = 0;                       // created_at >= created_from
  Millis created_to = 0;                         // created_at < created_to; 0: no bound
  Millis updated_from = 0;                       // updated_at >= updated_from
  Millis updated_to = 0;                         // updated_at < updated_to; 0: no bound
  std::optional<std::string> definition_prefix;  // definition_hash starts with it
  std::optional<std::string> step;               // has a step of this name ...
  std::optional<StepState> step_state;           // ... in this state (either alone too)
  int http_status = 0;                     // some request (of `step`, if given) got this; 0: any
  std::optional<std::string> external_id;  // some step's external id is exactly this
  std::optional<std::string> key_prefix;   // the business key starts with it
  int64_t after_id = 0;                    // cursor: only ids above this, in id order
};

// A batch: one operator action, with its reason, over the instances a filter
// matched when it was created (its items; the set never grows).
struct BatchRecord {
  int64_t id = 0;
  std::string public_id;  // what the API shows; random, unique
  std::string tenant;
  std::string actor;
  std::string reason;
  std::string action;       // retry | confirm | compensate | skip | close
  std::string action_json;  // the action's fields: {"step": ..., "happened": ...}
  std::string filter_json;  // the filter as given, for the record
  BatchState state = BatchState::kRunning;
  Millis created_at = 0;
  Millis updated_at = 0;
  // Items by state (every state, zeros included, in enum order); filled by reads.
  std::vector<std::pair<BatchItemState, int64_t>> counts;
  int64_t total = 0;
};

// One instance of a batch and how the action went on it.
struct BatchItemRecord {
  int64_t id = 0;
  int64_t batch_id = 0;
  int64_t instance_id = 0;
  std::string instance_key;
  BatchItemState state = BatchItemState::kPending;
  std::string result_state;  // the instance's state when judged (an instance state's name)
  std::string message;       // why refused or failed; the instance's reason when stopped
  std::string owner;         // the runner holding a kApplying claim
  Millis claim_expires_at = 0;
  int tries = 0;  // times taken (a worker held the instance: taken again)
  Millis applied_at = 0;
  Millis finished_at = 0;
  Millis updated_at = 0;
};

// A batch to create, with its items.
struct NewBatch {
  BatchRecord batch;
  std::vector<std::pair<int64_t, std::string>> items;  // (instance id, key)
  Millis now = 0;
};

// Moves an item from `from` (held by `owner` when from is kApplying) to `to`.
struct BatchItemUpdate {
  int64_t item_id = 0;
  BatchItemState from = BatchItemState::kApplying;
  std::string owner;
  BatchItemState to = BatchItemState::kApplied;
  std::string result_state;
  std::string message;
  Millis now = 0;
};

struct BatchFilter {
  std::optional<std::string> tenant;
  int limit = 50;
  int64_t before_id = 0;  // cursor: only ids below this, newest first; 0: from the newest
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

// Counters kept in the database, so every process adds to the same series.
inline constexpr char kCounterLeaseTakeovers[] = "lease_takeovers";
inline constexpr char kCounterInboxDuplicates[] = "inbox_duplicates";

struct StoreSummary {
  std::vector<std::pair<InstanceState, int64_t>> instances_by_state;
  int64_t retries = 0;  // attempts beyond the first, over all steps
  int64_t unknown_outcomes = 0;
  int64_t resolved_by_lookup = 0;
  int64_t resubmitted_after_lookup = 0;
  int64_t compensations = 0;  // steps compensated
  int64_t open_alerts = 0;
  int64_t outbox_events = 0;
  int64_t attempts = 0;  // step submissions, over all steps
  int64_t resolved_by_operator = 0;
  int64_t compensation_attempts = 0;
  int64_t compensation_failures = 0;  // steps whose compensation failed
  std::vector<std::pair<ErrorClass, int64_t>> steps_by_error_class;  // last error of each step
  std::vector<std::pair<StepState, int64_t>> steps_by_state;
  int64_t lease_takeovers = 0;   // expired leases taken over by another owner
  int64_t inbox_duplicates = 0;  // events received again and not applied
};

}  // namespace waystone
