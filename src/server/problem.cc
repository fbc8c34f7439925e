#include "server/problem.h"

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "model/json_text.h"

namespace waystone {
namespace {

Problem Make(int status, const std::string& kind, const std::string& title,
             const std::string& detail) {
  return {status, "urn:waystone:problem:" + kind, title, detail};
}

}  // namespace

std::string Problem::ToJson(const std::string& instance) const {
  return JsonText(nlohmann::json{{"type", type}, {"title", title}, {"status", status},
                                 {"detail", detail}, {"instance", instance}});
}

Problem Unauthenticated(const std::string& detail) {
  return Make(401, "unauthenticated", "Missing or invalid token", detail);
}
Problem Forbidden(const std::string& detail) {
  return Make(403, "forbidden", "The token's role does not allow this", detail);
}
Problem NotFound(const std::string& detail) { return Make(404, "not-found", "Not found", detail); }
Problem BadRequest(const std::string& detail) {
  return Make(400, "bad-request", "The request is not valid", detail);
}

Problem Unprocessable(const std::string& kind, const std::string& title,
                      const std::string& detail) {
  return Make(422, kind, title, detail);
}

Problem ProblemFromStatus(const absl::Status& status) {
  const std::string detail(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return BadRequest(detail);
    case absl::StatusCode::kNotFound:
      return NotFound(detail);
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return Make(409, "conflict", "Conflict", detail);
    case absl::StatusCode::kFailedPrecondition:
      return Make(409, "state-conflict", "Not allowed in the current state", detail);
    case absl::StatusCode::kUnauthenticated:
      return Unauthenticated(detail);
    case absl::StatusCode::kPermissionDenied:
      return Forbidden(detail);
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
      return Make(503, "unavailable", "Temporarily unavailable", "retry later");
    default:
      // Internal details stay in the logs.
      Log(LogLevel::kWarning, "internal error answered with 500: " + status.ToString());
      return Make(500, "internal", "Internal error", "an internal error occurred");
  }
}

}  // namespace waystone
