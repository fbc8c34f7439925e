#pragma once

// The simulator's fault knobs (docs/simulator.md): what a document of route ->
// knobs says, and which fault the next request on a route draws.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "sim/lost_response.h"

namespace waystone {

enum class FaultKind {
  kNone,
  kDropResponse,
  kDelay,
  kUnavailable,
  kRateLimit,
  kFail,
  kError,
  // After the commit, as real servers and proxies lose answers (lost_response.h):
  kCloseBeforeBytes,
  kCloseBeforeBytesReused,
  kReset,
  kPartialStatus,
  kPartialHeaders,
  kStatus500,
  kStatus502,
  kStatus504,
};

// The name of a fault in knobs, `next` and the stats ("drop_response").
std::string_view FaultName(FaultKind kind);

// The shapes that take the connection away from the HTTP server, and how.
std::optional<LostResponse> LossOf(FaultKind kind);

// The shapes that answer an error after the commit, with their status.
std::optional<int> StatusAfterCommit(FaultKind kind);

// Knobs for one route. Probabilities are checked in the order of the fields;
// `next` forces the given faults on the next requests, one each, first.
struct Fault {
  double drop_response = 0;  // commit, then close the connection without a full response
  double delay = 0;          // commit, then answer after delay_ms (past the client's timeout)
  double unavailable = 0;    // 503 with Retry-After, nothing committed
  double rate_limit = 0;     // 429 with Retry-After, nothing committed
  double fail = 0;           // 503 without Retry-After, nothing committed
  double error = 0;          // 500, nothing committed (the caller cannot know that)
  int delay_ms = 3000;
  int retry_after_s = 1;
  std::deque<FaultKind> next;
  // Probabilities of the lost-response shapes, by kind (knobs named as the shapes).
  std::map<FaultKind, double> shapes;
};

// Reads a faults document (a JSON object of route -> knobs; "" = none) for the
// routes named in `routes`. InvalidArgument with the reason otherwise.
absl::StatusOr<std::map<std::string, Fault>> ParseFaults(const std::string& text,
                                                         const std::set<std::string>& routes);

// The fault the next request under `fault` gets: the first of `next`, else one
// drawn by the probabilities. A reused-connection-only fault waits for (in `next`)
// or skips (drawn) a request on a fresh connection.
FaultKind DrawFault(Fault& fault, std::mt19937_64& random, bool reused_connection);

}  // namespace waystone
