#include "store/api_requests.h"

namespace waystone {

ApiRequestClaim DecideApiRequest(const std::optional<ApiRequestRecord>& stored,
                                 const ApiRequestRecord& request, Millis stale_before,
                                 const std::string& dead_owner) {
  if (stored) {
    const bool abandoned =
        stored->created_at < stale_before || (!dead_owner.empty() && stored->owner == dead_owner);
    const bool live = stored->expires_at > request.created_at && (stored->done || !abandoned);
    if (live) {
      const ApiRequestOutcome outcome = stored->request_hash != request.request_hash
                                            ? ApiRequestOutcome::kMismatch
                                        : stored->done ? ApiRequestOutcome::kReplay
                                                       : ApiRequestOutcome::kInFlight;
      return {outcome, *stored};
    }
  }
  return {ApiRequestOutcome::kNew, request};
}

}  // namespace waystone
