#include "http/problem.h"

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "model/json_text.h"

namespace waystone {
namespace {

struct KindSpec {
  ProblemKind kind;
  int status;
  const char* slug;  // urn:waystone:problem:<slug>
  const char* title;
};

constexpr KindSpec kKinds[] = {
    {ProblemKind::kBadRequest, 400, "bad-request", "The request is not valid"},
    {ProblemKind::kUnauthenticated, 401, "unauthenticated", "Missing or invalid token"},
    {ProblemKind::kForbidden, 403, "forbidden", "The token's role does not allow this"},
    {ProblemKind::kNotFound, 404, "not-found", "Not found"},
    {ProblemKind::kMethodNotAllowed, 405, "method-not-allowed", "Method not allowed"},
    {ProblemKind::kConflict, 409, "conflict", "Conflict"},
    {ProblemKind::kStateConflict, 409, "state-conflict", "Not allowed in the current state"},
    {ProblemKind::kBusinessKeyConflict, 409, "business-key-conflict",
     "The business key is held with other input or by another workflow"},
    {ProblemKind::kInboxConflict, 409, "inbox-conflict",
     "This event id was received before with other data"},
    {ProblemKind::kIdempotencyKeyInFlight, 409, "idempotency-key-in-flight",
     "A request with this Idempotency-Key is being processed"},
    {ProblemKind::kPayloadTooLarge, 413, "payload-too-large", "Request body too large"},
    {ProblemKind::kUnsupportedMediaType, 415, "unsupported-media-type", "Unsupported media type"},
    {ProblemKind::kUnknownWorkflow, 422, "unknown-workflow", "Unknown workflow"},
    {ProblemKind::kUnroutedEvent, 422, "unrouted-event", "No route for this event type"},
    {ProblemKind::kFilterTooBroad, 422, "filter-too-broad",
     "The filter matches more instances than one batch takes"},
    {ProblemKind::kIdempotencyKeyReused, 422, "idempotency-key-reused",
     "Idempotency-Key reused with another request"},
    {ProblemKind::kHeaderFieldsTooLarge, 431, "header-fields-too-large",
     "Request header fields too large"},
    {ProblemKind::kInternal, 500, "internal", "Internal error"},
    {ProblemKind::kUnavailable, 503, "unavailable", "Temporarily unavailable"},
    {ProblemKind::kHttpVersionNotSupported, 505, "http-version-not-supported",
     "HTTP version not supported"},
};

}  // namespace

std::string Problem::ToJson(const std::string& instance) const {
  return JsonText(nlohmann::json{{"type", type},
                                 {"title", title},
                                 {"status", status},
                                 {"detail", detail},
                                 {"instance", instance}});
}

Problem MakeProblem(ProblemKind kind, const std::string& detail) {
  for (const KindSpec& spec : kKinds) {
    if (spec.kind == kind) {
      return {spec.status, std::string("urn:waystone:problem:") + spec.slug, spec.title, detail};
    }
  }
  return {500, "urn:waystone:problem:internal", "Internal error", "an internal error occurred"};
}

Problem Unauthenticated(const std::string& detail) {
  return MakeProblem(ProblemKind::kUnauthenticated, detail);
}
Problem Forbidden(const std::string& detail) {
  return MakeProblem(ProblemKind::kForbidden, detail);
}
Problem NotFound(const std::string& detail) { return MakeProblem(ProblemKind::kNotFound, detail); }
Problem BadRequest(const std::string& detail) {
  return MakeProblem(ProblemKind::kBadRequest, detail);
}
Problem InternalProblem() {
  return MakeProblem(ProblemKind::kInternal, "an internal error occurred");
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
      return MakeProblem(ProblemKind::kConflict, detail);
    case absl::StatusCode::kFailedPrecondition:
      return MakeProblem(ProblemKind::kStateConflict, detail);
    case absl::StatusCode::kUnauthenticated:
      return Unauthenticated(detail);
    case absl::StatusCode::kPermissionDenied:
      return Forbidden(detail);
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
      return MakeProblem(ProblemKind::kUnavailable, "retry later");
    default:
      // Internal details stay in the logs.
      Log(LogLevel::kWarning, "internal error answered with 500: " + status.ToString());
      return InternalProblem();
  }
}

}  // namespace waystone
