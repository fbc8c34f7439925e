#pragma once

// Store-internal: what a relay's claim and the end of a delivery attempt mean,
// written once for both dialects; a dialect supplies the SQL (DeliverySql).

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/records.h"

namespace waystone {

// The statements of a delivery's end, inside one open transaction (and the read
// of a claimed event). Not thread-safe.
class DeliverySql {
 public:
  virtual ~DeliverySql() = default;

  // Returns the outbox rows of `seqs` that exist, in any order (one statement for a
  // whole claim).
  virtual absl::StatusOr<std::vector<EventRecord>> ReadEvents(const std::vector<int64_t>& seqs) = 0;
  // Records the attempt's outcome and releases the claim where the claim (id,
  // epoch, owner) still holds; false when another relay owns the delivery now.
  virtual absl::StatusOr<bool> FinishClaimed(const DeliveryClaim& claim,
                                             const DeliveryUpdate& update) = 0;
  // Marks the outbox row delivered once every delivery of it is.
  virtual absl::Status MarkEventDelivered(int64_t seq, Millis now) = 0;
  virtual absl::Status InsertAlert(const AlertRecord& alert, Millis now) = 0;
  virtual absl::Status InsertEvent(const EventRecord& event, Millis now) = 0;
  // Switches `sink` off with `reason` (its deliveries wait).
  virtual absl::Status DisableSink(const std::string& sink, const std::string& reason,
                                   Millis now) = 0;
};

// Fills in the event of each claim (whose event.seq the claim statement set),
// DataLoss when one is missing, and sorts the claims in outbox order (a claim
// statement's RETURNING order is not guaranteed).
absl::Status CompleteClaims(DeliverySql& sql, std::vector<DeliveryClaim>* claims);

// Ends a delivery attempt (see RelayStore::FinishDelivery): Aborted when the
// lease was lost; else the outcome, the outbox row's delivered mark, the alert
// with its event, and the sink switched off, as `update` says.
absl::Status FinishDeliveryWith(DeliverySql& sql, const DeliveryClaim& claim,
                                const DeliveryUpdate& update);

// Ends several attempts in one transaction (see RelayStore::FinishDeliveries): one
// status per attempt, Aborted where the lease was lost; any other error ends the
// whole batch (the caller rolls the transaction back).
absl::StatusOr<std::vector<absl::Status>> FinishDeliveriesWith(
    DeliverySql& sql, const std::vector<FinishedDelivery>& finished);

}  // namespace waystone
