#pragma once

// Store-internal: the dialect-neutral rules of a start, and the one algorithm both
// stores run in their transaction (StartInstanceWith); a dialect supplies only the
// SQL of each step (StartSql).

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/records.h"
#include "store/savepoints.h"

namespace waystone {

// Checks a start against what already holds its business key (a live instance or
// a tombstone): OK when it is the same workflow with the same input, else
// FailedPrecondition naming both sides. A business key is unique per tenant.
absl::Status CheckStartAgainst(const std::string& held_by_workflow,
                               const std::string& held_input_hash, const NewInstance& start,
                               bool collected);

// Returns kDuplicateEvent when the inbox holds the event with the same data (or a
// claim made before data hashes were kept), kEventConflict otherwise.
StartOutcome DecideClaimedEvent(const InboxEntry& stored, const std::string& data_hash);

// Returns what an answer about a collected instance shows of it.
InstanceRecord InstanceFromTombstone(const TombstoneRecord& tombstone);

// The statements of a start, inside one open transaction. Not thread-safe.
// Each start of a batch runs under its own savepoint (SavepointSql).
class StartSql : public SavepointSql {
 public:
  // Claims the start's event in the inbox (no instance yet); false when it was
  // claimed before.
  virtual absl::StatusOr<bool> ClaimStartEvent(const NewInstance& start) = 0;
  virtual absl::StatusOr<std::optional<InboxEntry>> ReadInbox(const std::string& tenant,
                                                              const std::string& source,
                                                              const std::string& id) = 0;
  virtual absl::StatusOr<std::optional<InstanceRecord>> InstanceById(int64_t id) = 0;
  virtual absl::StatusOr<std::optional<InstanceRecord>> InstanceByKey(const std::string& tenant,
                                                                      const std::string& key) = 0;
  virtual absl::StatusOr<std::optional<TombstoneRecord>> TombstoneOfInstance(
      int64_t instance_id) = 0;
  // What InsertInstance did and found.
  struct Insertion {
    std::optional<int64_t> created;            // the new row's id; nullopt when the key is held
    std::optional<TombstoneRecord> tombstone;  // the key's, as read after the insert
  };
  // Inserts the instance row (state running, due now) unless an instance or a
  // tombstone holds its key, then reads the key's tombstone. A tombstone beside a
  // created row means a gc buried the key while the insert waited for it (a dialect
  // whose writers are serialized never sees one).
  virtual absl::StatusOr<Insertion> InsertInstance(const NewInstance& start,
                                                   const std::string& source_event) = 0;
  // Inserts one pending row per step name, indexed from 0.
  virtual absl::Status InsertPendingSteps(int64_t instance_id,
                                          const std::vector<std::string>& names) = 0;
  virtual absl::Status InsertEvent(const EventRecord& event, int64_t instance_id, Millis now) = 0;
  // Wakes idle workers once the transaction commits (or does nothing).
  virtual absl::Status SignalWork() = 0;
  // Records which instance the start's event led to.
  virtual absl::Status LinkInbox(const NewInstance& start, int64_t instance_id) = 0;
  virtual absl::Status AddToCounter(const std::string& name, int64_t delta) = 0;
};

// Aborted with this message: a concurrent gc buried the key; the start runs again
// in a new transaction.
inline constexpr char kCollectedMeanwhile[] = "collected by a concurrent gc; start again";

// Runs one start in the open transaction (see InstanceStore::StartInstance): claims
// the event, returns what an event claimed before led to, answers from a tombstone
// or the existing instance, or creates the instance with its pending steps and
// started event.
absl::StatusOr<StartResult> StartInstanceWith(StartSql& sql, const NewInstance& start);

// Runs several starts in the open transaction (see InstanceStore::StartInstances):
// a start refused for its business key (FailedPrecondition) undoes only itself; any
// other error fails the whole batch. A start with an event runs under its own
// savepoint (its inbox claim is written before the refusal); one without needs
// none, since it is refused before it writes anything.
absl::StatusOr<std::vector<absl::StatusOr<StartResult>>> StartInstancesWith(
    StartSql& sql, const std::vector<NewInstance>& starts);

// Returns true when `status` asks for the start to run again (kCollectedMeanwhile).
bool StartAgain(const absl::Status& status);

}  // namespace waystone
