#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/operate/operator_plan.h"

namespace waystone {

// The JSON bodies of the API's write routes, parsed and checked without I/O.
// Errors are InvalidArgument with the text the 400 problem shows. Pure; the
// fuzz targets call these exactly as the handlers do.

// POST /v1/instances: {"workflow", "input" (object), "tenant"?}.
struct StartBody {
  std::string workflow;
  std::string tenant;      // "" = the token's
  std::string input_json;  // canonical JSON of the input object
};
absl::StatusOr<StartBody> ParseStartBody(const std::string& body);

// POST /v1/instances/{key}/{action}: {"reason", "step"?, "external_id"?,
// "happened"?, "response"?}. Fills those fields of an OperatorRequest.
absl::StatusOr<OperatorRequest> ParseActionBody(const std::string& body);

// POST /v1/instances/{key}/decide: {"step", "data_version", "decision" (approve or
// reject), "request"? (a number; absent: before the request opened), "comment"?}.
struct DecisionBody {
  std::string step;
  int request = 0;
  std::string data_version;
  bool approve = false;
  std::string comment;
};
absl::StatusOr<DecisionBody> ParseDecisionBody(const std::string& body);

// POST /v1/instances/{key}/revise: {"input" (object), "reason"}.
struct ReviseBody {
  std::string input_json;  // canonical JSON of the new input object
  std::string reason;
};
absl::StatusOr<ReviseBody> ParseReviseBody(const std::string& body);

// POST /v1/batches: {"action", "reason", "filter" (object of strings: the list
// filters and stopped_at), "tenant"?, and the action's fields as above}.
struct BatchBody {
  OperatorRequest request;  // action, reason and the action's fields
  std::string tenant;       // "" = the token's
  std::map<std::string, std::string> filter;
};
absl::StatusOr<BatchBody> ParseBatchBody(const std::string& body);

// POST /v1/alerts/{id}/acknowledge: {"reason"}. Returns the reason.
absl::StatusOr<std::string> ParseReasonBody(const std::string& body);

// POST /v1/tokens: {"name", "role", "tenant"?, "expires"? (a duration, "90d")}.
struct TokenBody {
  std::string name;
  std::string role;
  std::string tenant;   // "" = the admin's own
  std::string expires;  // "" = until revoked
};
absl::StatusOr<TokenBody> ParseTokenBody(const std::string& body);

}  // namespace waystone
