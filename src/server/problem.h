#pragma once

#include <string>

#include "absl/status/status.h"

namespace waystone {

// An RFC 9457 problem: a stable type per kind of problem, the HTTP status, a
// title and a detail for this occurrence. Never carries stack traces.
struct Problem {
  int status = 500;
  std::string type;    // "urn:waystone:problem:<kind>"
  std::string title;
  std::string detail;

  // Returns the application/problem+json document, with `instance` (the path).
  std::string ToJson(const std::string& instance) const;
};

// The one table from status codes to HTTP problems.
Problem ProblemFromStatus(const absl::Status& status);

Problem Unauthenticated(const std::string& detail);
Problem Forbidden(const std::string& detail);
Problem NotFound(const std::string& detail);
Problem BadRequest(const std::string& detail);
// 422: the request is well-formed but names something that cannot be used.
Problem Unprocessable(const std::string& kind, const std::string& title, const std::string& detail);

}  // namespace waystone
