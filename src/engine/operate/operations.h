#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/random.h"
#include "engine/operate/operator_plan.h"
#include "store/store.h"

namespace waystone {

class DefinitionCatalog;
class TemplateEnvironment;
struct Decision;  // rules/approvals.h
struct Revision;  // rules/approvals.h

// What an applied (or previewed) operator action did.
struct ActionResult {
  ActionPlan plan;
  InstanceRecord instance;  // after the action (unchanged for a dry run)
  bool applied = false;
};

// How a signal (an event for a waiting step) ended.
enum class SignalOutcome : uint8_t {
  kApplied = 1,    // the waiting step completed with the event's data
  kDuplicate = 2,  // (tenant, source, id) was received before with the same data: no effect
  kConflict = 3,   // ... with other data: no effect, an inbox_conflict alert is raised
  kKept = 4,       // a code workflow's function does not wait for its type yet: kept for
                   // its next WaitEvent of that type
};

struct SignalResult {
  SignalOutcome outcome = SignalOutcome::kApplied;
  std::string data_hash;         // of this event's data
  std::string stored_data_hash;  // kConflict: of the data received first
};

// What a taken decision did (or, replayed, the decision that stood already).
struct DecisionResult {
  InstanceRecord instance;  // after it
  StepRecord step;          // the approval step after it
  bool replayed = false;    // the same decision by the same actor stood already: nothing done
  bool duplicate = false;   // its event was received before: nothing done
};

// What a revision did (rules/approvals.h, Revise).
struct RevisionResult {
  InstanceRecord instance;  // after it
  bool unchanged = false;   // the input was this already: nothing done
  bool duplicate = false;   // its event was received before: nothing done
  std::vector<std::string> material, cancelled, reopened, reruns;
  std::string input_hash;
};

// Returns the message of an inbox_conflict alert and problem: the event, both hashes.
std::string InboxConflictMessage(const std::string& source, const std::string& id,
                                 const std::string& stored_hash, const std::string& new_hash);

// Raises the inbox_conflict alert (with its outbox event) about `instance` (whose
// id may name one gc removed) for event (source, id) received again with other data.
absl::Status RaiseInboxConflict(Store& store, Random& random, const InstanceRecord& instance,
                                const std::string& source, const std::string& id,
                                const std::string& stored_hash, const std::string& new_hash,
                                Millis now);

// Returns the hash the inbox keeps of an event's data: SHA-256 of its canonical JSON
// (keys sorted), or of the text itself when it is not JSON.
std::string EventDataHash(const std::string& data_json);

struct Signal {
  std::string tenant;
  std::string key;         // the business key of the instance
  std::string event_type;  // matched against the wait steps' `event`
  std::string source;      // with id: claimed in the inbox with the effect
  std::string id;
  std::string data_json;  // becomes the step's response
  std::string actor;
};

// Operations applies operator actions and signals to instances outside the
// worker pool: it takes the instance's lease (so no worker is mid-step), applies
// one fenced change with its audit record and events, and releases the instance
// to run. Thread-safe; the pointers outlive it.
class Operations {
 public:
  Operations(Store* store, DefinitionCatalog* catalog, const TemplateEnvironment* environment,
             const Clock* clock, Random* random, std::string owner, Millis lease_duration,
             Millis idempotency_retention = 7LL * 24 * 3600 * 1000);

  // Plans `request` on instance `key` of `tenant` and, unless it is a dry run,
  // applies it. NotFound for no such instance; FailedPrecondition when the state
  // refuses it; Aborted when a worker holds the instance (try again shortly).
  absl::StatusOr<ActionResult> Apply(const std::string& tenant, const std::string& key,
                                     const OperatorRequest& request);

  // Acknowledges alert `id` of `tenant` with an audit record. NotFound when the
  // alert is absent or another tenant's; FailedPrecondition when it is not open.
  absl::StatusOr<AlertRecord> AcknowledgeAlert(const std::string& tenant, int64_t id,
                                               const std::string& actor, const std::string& reason,
                                               bool dry_run);

  // Completes the step of instance `signal.key` waiting for `signal.event_type`
  // with the event's data, claiming (tenant, source, id) with the data's hash in the
  // inbox in the same transaction. NotFound for no such instance; FailedPrecondition when no step
  // waits for this type; Aborted when a worker holds the instance.
  absl::StatusOr<SignalResult> Deliver(const Signal& signal);

  // Applies `decision` to the approval step it names on instance `key` of
  // `tenant`, with its effect and audit record in one transaction. NotFound for no
  // such instance or no approval step of that name; Aborted when a worker holds the
  // instance. A refused decision commits its audit record (and a contradiction's
  // alert, and its event's inbox claim) and returns why: PermissionDenied (the actor
  // may not decide it) or FailedPrecondition (decided already, superseded, closed,
  // or other data; or its event id was received before with other data).
  absl::StatusOr<DecisionResult> Decide(const std::string& tenant, const std::string& key,
                                        const Decision& decision);

  // Revises the input of instance `key` of `tenant` (approvals.h, Revise), with its
  // audit record, in one transaction. NotFound, Aborted as above; FailedPrecondition
  // (nothing changed) when the instance's state or a decided approval refuses it.
  absl::StatusOr<RevisionResult> Revise(const std::string& tenant, const std::string& key,
                                        const Revision& revision);

 private:
  // An instance held under this engine's lease for one action, decision, revision or
  // event: the one way they commit, and the lease released on every other way out.
  class Held;
  // Takes the instance's lease, waiting a moment for a worker to let it go.
  absl::StatusOr<Held> Hold(int64_t instance_id);
  // Returns kDuplicate or kConflict (raising its alert) when the inbox holds the
  // signal's event; NotFound when it does not.
  absl::StatusOr<SignalResult> SeenBefore(const Signal& signal, const std::string& data_hash);
  // Releases a lease with nothing else committed.
  absl::Status Release(const Lease& lease);
  // Whether the event that carries a decision or revision (none: false) is in the
  // inbox with the same data; with other data it raises inbox_conflict and returns
  // why (FailedPrecondition): the same event id is never a duplicate of another.
  absl::StatusOr<bool> ReceivedBefore(const std::optional<InboxClaim>& event,
                                      const InstanceRecord& instance);
  // A decision whose event was received before: the step as it stands, nothing done.
  absl::StatusOr<DecisionResult> Received(const InstanceRecord& instance, int index);

  Store* store_;
  DefinitionCatalog* catalog_;
  const TemplateEnvironment* environment_;
  const Clock* clock_;
  Random* random_;
  std::string owner_;
  Millis lease_duration_;
  Millis idempotency_retention_;  // of a delivery an action makes owed (OwedDeliveries)
};

}  // namespace waystone
