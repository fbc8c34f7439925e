#pragma once

// Store-internal: garbage collection in one order for both dialects
// (see MaintenanceStore::CollectGarbage). A dialect supplies the SQL of each step
// (GcSql); the order, which is what keeps a late redelivery from starting a
// collected key again, is written here once:
//   1. pick the collectable instances (finished before the cutoff, every event
//      delivered) into the temporary table gc_ids, and count what would go;
//   2. drop tombstones past the protection window, then bury each picked
//      instance (its tombstone reads its steps, so before they go);
//   3. delete the picked instances' attempts, deliveries, events, steps, alerts,
//      then the instances (children before parents);
//   4. drop inbox claims past the window whose instance is gone, expired
//      idempotency keys and expired API requests.

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/records.h"

namespace waystone {

// The statements of a gc, inside one open transaction. Not thread-safe.
class GcSql {
 public:
  virtual ~GcSql() = default;

  // Fills gc_ids with the instances to collect.
  virtual absl::Status PickCollectable(Millis finished_before) = 0;
  // Counts what a gc would remove (tombstones_written is set from instances).
  virtual absl::StatusOr<GcReport> CountGarbage(Millis now, Millis protect_before) = 0;
  virtual absl::Status DeleteTombstonesBefore(Millis protect_before) = 0;
  // Writes a tombstone of each picked instance, collected at `now`.
  virtual absl::Status BuryPicked(Millis now) = 0;
  // Runs a statement without parameters (the deletes of step 3, the same text in
  // both dialects).
  virtual absl::Status Exec(std::string_view sql) = 0;
  virtual absl::Status DeleteInboxClaimsBefore(Millis protect_before) = 0;
  virtual absl::Status DeleteIdempotencyKeysBefore(Millis now) = 0;
  virtual absl::Status DeleteApiRequestsBefore(Millis now) = 0;
};

// Runs a gc (with `dry_run`, steps 1 only) and returns what it removed.
absl::StatusOr<GcReport> CollectGarbageWith(GcSql& sql, Millis finished_before, Millis now,
                                            Millis protect_before, bool dry_run);

}  // namespace waystone
