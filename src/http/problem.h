#pragma once

#include <string>

#include "absl/status/status.h"

namespace waystone {

// An RFC 9457 problem: a stable type per kind of problem, the HTTP status, a
// title and a detail for this occurrence. Never carries stack traces.
struct Problem {
  int status = 500;
  std::string type;  // "urn:waystone:problem:<kind>"
  std::string title;
  std::string detail;

  // Returns the application/problem+json document, with `instance` (the path).
  std::string ToJson(const std::string& instance) const;
};

// Every kind of problem the HTTP front and the API answer with. Its status, type
// and title are in one table (problem.cc); only the detail varies.
enum class ProblemKind {
  kBadRequest,               // 400 bad-request
  kUnauthenticated,          // 401 unauthenticated
  kForbidden,                // 403 forbidden
  kNotFound,                 // 404 not-found
  kMethodNotAllowed,         // 405 method-not-allowed
  kConflict,                 // 409 conflict
  kStateConflict,            // 409 state-conflict
  kBusinessKeyConflict,      // 409 business-key-conflict
  kInboxConflict,            // 409 inbox-conflict
  kIdempotencyKeyInFlight,   // 409 idempotency-key-in-flight
  kPayloadTooLarge,          // 413 payload-too-large
  kUnsupportedMediaType,     // 415 unsupported-media-type
  kUnknownWorkflow,          // 422 unknown-workflow
  kUnroutedEvent,            // 422 unrouted-event
  kIdempotencyKeyReused,     // 422 idempotency-key-reused
  kFilterTooBroad,           // 422 filter-too-broad (a batch over more instances than allowed)
  kHeaderFieldsTooLarge,     // 431 header-fields-too-large
  kInternal,                 // 500 internal
  kUnavailable,              // 503 unavailable
  kHttpVersionNotSupported,  // 505 http-version-not-supported
};

// The problem of `kind` with this occurrence's `detail`.
Problem MakeProblem(ProblemKind kind, const std::string& detail);

// The one table from status codes to HTTP problems.
Problem ProblemFromStatus(const absl::Status& status);

Problem Unauthenticated(const std::string& detail);
Problem Forbidden(const std::string& detail);
Problem NotFound(const std::string& detail);
Problem BadRequest(const std::string& detail);
// The 500 answered for anything internal: its details stay in the logs.
Problem InternalProblem();

}  // namespace waystone
