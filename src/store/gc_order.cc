#include "store/gc_order.h"

#include "base/status_macros.h"

namespace waystone {

absl::StatusOr<GcReport> CollectGarbageWith(GcSql& sql, Millis finished_before, Millis now,
                                            Millis protect_before, bool dry_run) {
  WS_RETURN_IF_ERROR(sql.PickCollectable(finished_before));
  WS_ASSIGN_OR_RETURN(GcReport report, sql.CountGarbage(now, protect_before));
  report.tombstones_written = report.instances;  // one per instance removed
  if (dry_run) return report;
  // Old tombstones go before new ones are written, so a fresh one is never lost.
  WS_RETURN_IF_ERROR(sql.DeleteTombstonesBefore(protect_before));
  WS_RETURN_IF_ERROR(sql.BuryPicked(now));
  for (const char* remove : {
           "DELETE FROM attempts WHERE instance_id IN (SELECT id FROM gc_ids)",
           "DELETE FROM deliveries WHERE instance_id IN (SELECT id FROM gc_ids)",
           "DELETE FROM outbox WHERE instance_id IN (SELECT id FROM gc_ids)",
           "DELETE FROM steps WHERE instance_id IN (SELECT id FROM gc_ids)",
           "DELETE FROM kept_events WHERE instance_id IN (SELECT id FROM gc_ids)",
           "DELETE FROM alerts WHERE instance_id IN (SELECT id FROM gc_ids)",
           "DELETE FROM instances WHERE id IN (SELECT id FROM gc_ids)",
       }) {
    WS_RETURN_IF_ERROR(sql.Exec(remove));
  }
  // Inbox claims are the protection against late redeliveries: they go only past
  // the window, and only once their instance is gone too.
  WS_RETURN_IF_ERROR(sql.DeleteInboxClaimsBefore(protect_before));
  WS_RETURN_IF_ERROR(sql.DeleteIdempotencyKeysBefore(now));
  WS_RETURN_IF_ERROR(sql.DeleteApiRequestsBefore(now));
  return report;
}

}  // namespace waystone
