#pragma once

#include <map>
#include <optional>
#include <string_view>

#include "base/clock.h"
#include "model/states.h"

namespace waystone {

// Which connection a request went out on, as far as the client knows. Persisted
// on attempt records; values frozen.
enum class ConnectionUsed : uint8_t {
  kNone = 0,    // no connection was made (refused, DNS, malformed URL)
  kNew = 1,     // opened for this request
  kReused = 2,  // kept alive from an earlier request
};
std::string_view ToString(ConnectionUsed connection);

// What one external call did, as far as the caller can tell. Produced by a
// connector, consumed by Classify. A value type.
struct CallOutcome {
  enum class Kind : uint8_t {
    kResponse = 1,       // a complete HTTP response arrived
    kNotSent = 2,        // failed before the request left (DNS, refused, connect timeout)
    kLostAfterSend = 3,  // sent, then timed out or the connection broke
    kInvalid = 4,        // could not be sent as written (malformed URL, unsupported scheme)
  };
  Kind kind = Kind::kResponse;
  int status = 0;                     // HTTP status when kind == kResponse
  std::optional<Millis> retry_after;  // parsed Retry-After, when present
  bool sent = false;                  // some of the request left this process
  // kInvalid: our identity was refused: a certificate (ours or theirs) or the OAuth2
  // client credentials. Not retried, and nothing is undone for it.
  bool identity_refused = false;
  // kNotSent: a file changed after it was pinned; the request was cut off before its
  // end, so the target cannot have acted on it.
  bool content_changed = false;
  // kNotSent: held back by the caller at the last moment (its lease ran out); says
  // nothing of the target.
  bool withdrawn = false;
  ConnectionUsed connection = ConnectionUsed::kNone;
  // `status` is an SMTP reply code (RFC 5321 §4.2.1): 2xx done, 4xx transient,
  // 5xx permanent.
  bool smtp = false;
};

// Per-step overrides of the default class for an HTTP status (the `errors:` map).
using StatusOverrides = std::map<int, ErrorClass>;

// Returns the error class of an outcome: kNone for a 2xx response, otherwise
// transient / rejected / unknown per DESIGN.md (SMTP replies by their own classes),
// after `overrides`.
ErrorClass Classify(const CallOutcome& outcome, const StatusOverrides& overrides);

}  // namespace waystone
