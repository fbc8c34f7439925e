#pragma once

// An email as it leaves: the RFC 5322 message of a notify step's email channel,
// built from its rendered fields. Pure.

#include <string>

#include "absl/status/statusor.h"

namespace waystone {

// A notification email, rendered. Addresses are plain ("name@example.com").
struct MailFields {
  std::string from;
  std::string to;
  std::string subject;
  std::string text;        // UTF-8; any line ending
  std::string message_id;  // the left part of the Message-ID
  std::string delivery;    // the delivery's identity (X-Waystone-Delivery)
};

// Returns the message (lines ending CRLF, no Date:; the sender adds it when it
// leaves): From, To, Subject (an RFC 2047 encoded word when not ASCII), Message-ID
// "<message_id@domain of from>", X-Waystone-Delivery, MIME-Version, and a text/plain
// UTF-8 body, 7bit when it is ASCII with short lines, base64 otherwise.
// InvalidArgument naming the field when an address is not one plain address, or a
// header would contain a line break.
absl::StatusOr<std::string> ComposeMail(const MailFields& fields);

// Returns true when `address` is one plain address: "local@domain" in printable ASCII
// (no SMTPUTF8), one '@', no spaces, angle brackets, commas, quotes or control
// characters, at most 254 bytes.
bool PlainAddress(const std::string& address);

}  // namespace waystone
