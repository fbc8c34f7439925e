#include "store/claims.h"

#include "absl/strings/cord.h"

namespace waystone {
namespace {

constexpr char kOwned[] = "waystone/delivery-owned";
constexpr char kLeaseLost[] = "waystone/lease-lost";

}  // namespace

absl::Status DeliveryOwnedError(const std::string& message) {
  absl::Status status = absl::AlreadyExistsError(message);
  status.SetPayload(kOwned, absl::Cord("1"));
  return status;
}

bool IsDeliveryOwned(const absl::Status& status) {
  return absl::IsAlreadyExists(status) && status.GetPayload(kOwned).has_value();
}

absl::Status LeaseLostError(const std::string& message) {
  absl::Status status = absl::AbortedError(message);
  status.SetPayload(kLeaseLost, absl::Cord("1"));
  return status;
}

bool IsLeaseLost(const absl::Status& status) {
  return absl::IsAborted(status) && status.GetPayload(kLeaseLost).has_value();
}

}  // namespace waystone
