#include "store/relay_rules.h"

#include <algorithm>
#include <map>
#include <set>

#include "base/status_macros.h"
#include "store/claims.h"

namespace waystone {

absl::Status CompleteClaims(DeliverySql& sql, std::vector<DeliveryClaim>* claims) {
  if (claims->empty()) return absl::OkStatus();
  std::vector<int64_t> seqs;
  seqs.reserve(claims->size());
  for (const DeliveryClaim& claim : *claims) seqs.push_back(claim.event.seq);
  WS_ASSIGN_OR_RETURN(std::vector<EventRecord> rows, sql.ReadEvents(seqs));
  std::map<int64_t, EventRecord*> by_seq;
  for (EventRecord& row : rows) by_seq[row.seq] = &row;
  for (DeliveryClaim& claim : *claims) {
    auto found = by_seq.find(claim.event.seq);
    if (found == by_seq.end()) {
      return absl::DataLossError("delivery of missing outbox row " +
                                 std::to_string(claim.event.seq));
    }
    claim.event = *found->second;  // a copy: two sinks may claim the same row
  }
  std::sort(claims->begin(), claims->end(), [](const DeliveryClaim& a, const DeliveryClaim& b) {
    return a.event.seq < b.event.seq;
  });
  return absl::OkStatus();
}

absl::Status FinishDeliveryWith(DeliverySql& sql, const DeliveryClaim& claim,
                                const DeliveryUpdate& u) {
  WS_ASSIGN_OR_RETURN(bool held, sql.FinishClaimed(claim, u));
  if (!held) return LeaseLostError("delivery " + std::to_string(claim.id) + " lease lost");
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
  std::set<std::string> disabled;  // sinks this batch has disabled (and alerted) already
  for (const FinishedDelivery& f : finished) {
    // One alert per sink disabled: the first disable actually written carries it (an
    // earlier one whose lease was lost wrote nothing, alert included).
    DeliveryUpdate update = f.update;
    if (update.disable_sink && disabled.contains(f.claim.sink)) {
      update.alert.reset();
      update.alert_event.reset();
    }
    // A lost lease writes nothing (FinishClaimed changed no row), so the batch goes on;
    // anything else fails it (a lock timeout, Aborted too, as Unavailable: no lease
    // was lost).
    absl::Status status = FinishDeliveryWith(sql, f.claim, update);
    if (absl::IsAborted(status) && !IsLeaseLost(status)) {
      return absl::UnavailableError(status.message());
    }
    if (!status.ok() && !IsLeaseLost(status)) return status;
    if (status.ok() && update.disable_sink) disabled.insert(f.claim.sink);
    results.push_back(std::move(status));
  }
  return results;
}

}  // namespace waystone
