#include "store/lease_claims.h"

namespace waystone {

std::vector<Lease> LeasesOf(const std::vector<ClaimedRow>& rows, const std::string& owner,
                            int64_t* takeovers) {
  std::vector<Lease> leases;
  leases.reserve(rows.size());
  for (const ClaimedRow& row : rows) {
    leases.push_back({row.instance_id, row.epoch, owner});
    if (!row.previous_owner.empty()) ++*takeovers;
  }
  return leases;
}

absl::Status LeasedByAnother(const InstanceRecord& instance) {
  return absl::FailedPreconditionError("instance " + instance.key + " is leased by " +
                                       instance.lease_owner + " until " +
                                       std::to_string(instance.lease_expires_at));
}

}  // namespace waystone
