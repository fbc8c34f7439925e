#include "store/relay_rules.h"

#include <algorithm>

#include "base/status_macros.h"

namespace waystone {

absl::Status CompleteClaims(DeliverySql& sql, std::vector<DeliveryClaim>* claims) {
  for (DeliveryClaim& claim : *claims) {
    WS_ASSIGN_OR_RETURN(std::optional<EventRecord> event, sql.ReadEvent(claim.event.seq));
    if (!event) {
      return absl::DataLossError("delivery of missing outbox row " +
                                 std::to_string(claim.event.seq));
    }
    claim.event = *std::move(event);
  }
  std::sort(claims->begin(), claims->end(), [](const DeliveryClaim& a, const DeliveryClaim& b) {
    return a.event.seq < b.event.seq;
  });
  return absl::OkStatus();
}

absl::Status FinishDeliveryWith(DeliverySql& sql, const DeliveryClaim& claim,
                                const DeliveryUpdate& u) {
  WS_ASSIGN_OR_RETURN(bool held, sql.FinishClaimed(claim, u));
  if (!held) return absl::AbortedError("delivery " + std::to_string(claim.id) + " lease lost");
  if (u.state == DeliveryState::kDelivered) {
    WS_RETURN_IF_ERROR(sql.MarkEventDelivered(claim.event.seq, u.now));
  }
  if (u.alert) WS_RETURN_IF_ERROR(sql.InsertAlert(*u.alert, u.now));
  if (u.alert_event) WS_RETURN_IF_ERROR(sql.InsertEvent(*u.alert_event, u.now));
  if (u.disable_sink) WS_RETURN_IF_ERROR(sql.DisableSink(claim.sink, u.error, u.now));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::Status>> FinishDeliveriesWith(
    DeliverySql& sql, const std::vector<FinishedDelivery>& finished) {
  std::vector<absl::Status> results;
  results.reserve(finished.size());
  for (const FinishedDelivery& f : finished) {
    // A lost lease writes nothing (FinishClaimed changed no row), so the batch goes on.
    absl::Status status = FinishDeliveryWith(sql, f.claim, f.update);
    if (!status.ok() && !absl::IsAborted(status)) return status;
    results.push_back(std::move(status));
  }
  return results;
}

}  // namespace waystone
