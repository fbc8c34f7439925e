#include "store/claims.h"

#include "absl/strings/cord.h"

namespace waystone {
namespace {

constexpr char kOwned[] = "waystone/delivery-owned";

}  // namespace

absl::Status DeliveryOwnedError(const std::string& message) {
  absl::Status status = absl::AlreadyExistsError(message);
  status.SetPayload(kOwned, absl::Cord("1"));
  return status;
}

bool IsDeliveryOwned(const absl::Status& status) {
  return absl::IsAlreadyExists(status) && status.GetPayload(kOwned).has_value();
}

}  // namespace waystone
