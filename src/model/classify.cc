#include "model/classify.h"

namespace waystone {
namespace {

ErrorClass DefaultForStatus(int status) {
  if (status >= 200 && status < 300) return ErrorClass::kNone;
  switch (status) {
    case 408:  // the server gave up waiting for the request: it did not act
    case 425:
    case 429:
    case 503:
      return ErrorClass::kTransient;
    case 502:  // a gateway got a bad answer from the origin, which may have acted
    case 504:  // a gateway timed out: the origin may have acted
      return ErrorClass::kUnknown;
    default:
      break;
  }
  // Other 5xx: the server failed while handling the request; whether it acted
  // before failing is not known.
  if (status >= 500) return ErrorClass::kUnknown;
  return ErrorClass::kRejected;
}

// An SMTP server's last reply (RFC 5321 §4.2.1). A 4xx is a transient refusal of
// the whole transaction (the message was not taken); a 5xx a permanent one.
ErrorClass DefaultForSmtpReply(int code) {
  if (code >= 200 && code < 300) return ErrorClass::kNone;
  if (code >= 400 && code < 500) return ErrorClass::kTransient;
  return ErrorClass::kRejected;
}

}  // namespace

std::string_view ToString(ConnectionUsed connection) {
  switch (connection) {
    case ConnectionUsed::kNone:
      return "none";
    case ConnectionUsed::kNew:
      return "new";
    case ConnectionUsed::kReused:
      return "reused";
  }
  return "none";
}

ErrorClass Classify(const CallOutcome& outcome, const StatusOverrides& overrides) {
  switch (outcome.kind) {
    case CallOutcome::Kind::kNotSent:
      return ErrorClass::kTransient;
    case CallOutcome::Kind::kLostAfterSend:
      return ErrorClass::kUnknown;
    case CallOutcome::Kind::kInvalid:
      return ErrorClass::kRejected;
    case CallOutcome::Kind::kResponse:
      break;
  }
  if (auto it = overrides.find(outcome.status); it != overrides.end()) return it->second;
  if (outcome.smtp) return DefaultForSmtpReply(outcome.status);
  return DefaultForStatus(outcome.status);
}

}  // namespace waystone
