// The public Status, and the translation from the absl::Status used inside.

#include "api/translate.h"

namespace waystone::api {

std::string Status::ToString() const {
  const char* name = "UNKNOWN";
  switch (code_) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      name = "INVALID_ARGUMENT";
      break;
    case Code::kNotFound:
      name = "NOT_FOUND";
      break;
    case Code::kAlreadyExists:
      name = "ALREADY_EXISTS";
      break;
    case Code::kFailedPrecondition:
      name = "FAILED_PRECONDITION";
      break;
    case Code::kUnavailable:
      name = "UNAVAILABLE";
      break;
    case Code::kDeadlineExceeded:
      name = "DEADLINE_EXCEEDED";
      break;
    case Code::kInternal:
      name = "INTERNAL";
      break;
    case Code::kAborted:
      name = "ABORTED";
      break;
  }
  return std::string(name) + ": " + message_;
}

Status FromAbsl(const absl::Status& status) {
  if (status.ok()) return Status();
  Status::Code code = Status::Code::kInternal;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      code = Status::Code::kInvalidArgument;
      break;
    case absl::StatusCode::kNotFound:
      code = Status::Code::kNotFound;
      break;
    case absl::StatusCode::kAlreadyExists:
      code = Status::Code::kAlreadyExists;
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
      code = Status::Code::kFailedPrecondition;
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      code = Status::Code::kUnavailable;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      code = Status::Code::kDeadlineExceeded;
      break;
    default:
      break;
  }
  return Status(code, std::string(status.message()));
}

}  // namespace waystone::api
