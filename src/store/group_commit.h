#pragma once

// Store-internal: a group commit, written once for both dialects. Each change that
// can fail alone after writing is applied under its own savepoint in the transaction
// the dialect opened (one that can only lose its lease fails before writing), in one
// order: the fence first (nothing is written unless the lease holds), then the
// inbox claim, a kept event kept or taken, the revised input, alert resolution,
// idempotency key, sql steps' statements, added steps, a code workflow's
// transaction work, steps, attempts (then the oldest of their steps beyond the
// bound go), events, alerts and audit records. A dialect supplies only the SQL of each step
// (ChangeSql).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/records.h"
#include "store/savepoints.h"

namespace waystone {

// What the idempotency_keys table holds for one (tenant, key).
// SQL (SQLite and PostgreSQL alike): the idempotency_keys row's step gave up: failed
// (4) or skipped (9), never with an unknown outcome; or the row is a delivery reserved
// and never sent (no request hash) by an instance that ended without sending it
// (compensated 4, failed 5, closed 7) (StoredIdempotencyKey).
inline constexpr char kOwnerGaveUp[] =
    "(SELECT 1 FROM steps s WHERE s.instance_id = idempotency_keys.instance_id AND "
    "s.name = idempotency_keys.step_name AND ((s.state IN (4, 9) AND s.unknowns = 0) OR "
    "(idempotency_keys.request_hash = '' AND EXISTS (SELECT 1 FROM instances i WHERE "
    "i.id = idempotency_keys.instance_id AND i.state IN (4, 5, 7)))))";

struct StoredIdempotencyKey {
  std::string request_hash;
  Millis expires_at = 0;
  int64_t instance_id = 0;  // who claimed it last
  std::string step;
  // That step failed or was skipped without ever having an unknown outcome: it sent
  // nothing that arrived, so an exclusive claim may pass to another instance step.
  bool owner_gave_up = false;
};

// The statements of one change, inside an open transaction. Not thread-safe:
// used by the one thread that holds the transaction.
class ChangeSql : public SavepointSql {
 public:
  // Applies the instance columns of `change` where its lease still holds; returns
  // false (nothing written) when it does not.
  virtual absl::StatusOr<bool> Fence(const Change& change) = 0;
  // Wakes idle workers once the transaction commits; a dialect without such a
  // signal does nothing.
  virtual absl::Status SignalWork() = 0;
  // Claims `claim` in the inbox for the instance; false when it was claimed before.
  virtual absl::StatusOr<bool> ClaimInbox(const InboxClaim& claim, int64_t instance_id,
                                          Millis now) = 0;
  // Keeps `event` for the instance's function, numbered after its last kept event.
  virtual absl::Status KeepEvent(int64_t instance_id, const KeptEvent& event) = 0;
  // Marks the kept event taken; false when it was taken before (or never kept).
  virtual absl::StatusOr<bool> TakeKeptEvent(int64_t instance_id, const KeptEventTake& take,
                                             Millis now) = 0;
  // Resolves the instance's open and acknowledged alerts.
  virtual absl::Status ResolveAlerts(int64_t instance_id, Millis now) = 0;
  // Replaces the instance's input (a revision).
  virtual absl::Status ReviseInput(int64_t instance_id, const std::string& input_json) = 0;
  // Reads (and where the dialect needs it, locks) the stored idempotency key.
  virtual absl::StatusOr<std::optional<StoredIdempotencyKey>> ReadIdempotencyKey(
      const std::string& tenant, const std::string& key) = 0;
  // Inserts the key or replaces its request hash and expiry.
  virtual absl::Status PutIdempotencyKey(const IdempotencyClaim& claim, Millis now) = 0;
  // Inserts a reserved delivery identity (Change::reservations) where the key is free,
  // expired or its owner gave up; otherwise leaves the row as it is.
  virtual absl::Status ReserveIdempotencyKey(const IdempotencyClaim& claim, Millis now) = 0;
  // Runs a sql step's statement; returns its result ({"rows": [...], "count": n}).
  // An error of the statement itself is a StatementFailure (business_statement.h).
  virtual absl::StatusOr<std::string> RunStatement(const BusinessStatement& statement) = 0;
  // Inserts one step row (Change::added_steps).
  virtual absl::Status InsertStep(int64_t instance_id, const StepRecord& step) = 0;
  // Updates one step row; false when the instance has no such step.
  virtual absl::StatusOr<bool> UpdateStep(int64_t instance_id, const StepRecord& step) = 0;
  // Inserts an attempt numbered after the step's last one.
  virtual absl::Status InsertAttempt(int64_t instance_id, const AttemptRecord& attempt) = 0;
  // Deletes the step's attempts older than its newest `keep`.
  virtual absl::Status DropOldAttempts(int64_t instance_id, int step_index, int keep) = 0;
  virtual absl::Status InsertEvent(const EventRecord& event, int64_t instance_id, Millis now) = 0;
  virtual absl::Status InsertAlert(const AlertRecord& alert, int64_t instance_id, Millis now) = 0;
  virtual absl::Status InsertAudit(const AuditRecord& audit, int64_t instance_id, Millis at) = 0;
};

// Returns FailedPrecondition when `stored` holds the claim's key, unexpired at
// `now`, for another request hash; AlreadyExists when the claim is exclusive (a
// delivery identity) and another instance step holds it for the same request, or
// reserved it (no request hash yet: Change::reservations), unless that step gave up
// without an unknown outcome (nothing of it arrived). Its owner's claim fills a
// reservation in.
absl::Status CheckIdempotencyKey(const IdempotencyClaim& claim,
                                 const std::optional<StoredIdempotencyKey>& stored, Millis now);

// Whether `change` is applied under a savepoint of its own: only where it can fail
// alone after its fence wrote (an event received before, a kept event taken before,
// a key conflict, a sql step's or a code workflow's statement). A change that can
// only lose its lease fails at the fence, before writing anything, and needs none.
bool TakesSavepoint(const Change& change);

// Returns true when a change of `change`'s kind that ended with `applied` undoes
// only itself (a lost lease, a key conflict, an event received before); anything
// else (I/O, busy, a bug) fails the whole group so that every caller retries.
bool UndoesOnlyItself(const absl::Status& applied, const Change& change);

// Applies one change (the order above), keeping at most `attempts_per_step`
// attempts of each step it adds attempts to. Aborted when the lease is lost.
absl::Status ApplyChange(ChangeSql& sql, const Change& change, int attempts_per_step);

// Applies each change, under its own savepoint where it can fail alone after
// writing, and returns one status per change (see Store::Commit); a non-OK return
// fails the whole transaction.
absl::StatusOr<std::vector<absl::Status>> CommitChanges(ChangeSql& sql,
                                                        const std::vector<Change>& changes,
                                                        int attempts_per_step);

}  // namespace waystone
