#include "store/claims.h"

#include "store/marked_status.h"

namespace waystone {
namespace {

constexpr char kOwned[] = "waystone/delivery-owned";
constexpr char kLeaseLost[] = "waystone/lease-lost";

}  // namespace

absl::Status DeliveryOwnedError(const std::string& message) {
  return MarkedStatus(absl::StatusCode::kAlreadyExists, message, kOwned);
}

bool IsDeliveryOwned(const absl::Status& status) {
  return HasMark(status, absl::StatusCode::kAlreadyExists, kOwned);
}

absl::Status LeaseLostError(const std::string& message) {
  return MarkedStatus(absl::StatusCode::kAborted, message, kLeaseLost);
}

bool IsLeaseLost(const absl::Status& status) {
  return HasMark(status, absl::StatusCode::kAborted, kLeaseLost);
}

}  // namespace waystone
