#pragma once

// An answer to a request as a value: what the connectors return and the rules read.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/classify.h"

namespace waystone {

// What came back. `outcome` says whether a response arrived, and if not, whether
// the request had already left (which makes the result unknown). For an email the
// response is the server's last reply: its code is the status (250: accepted), its
// line the body. Only once the whole message was handed over (DATA ended) can an
// email have been delivered: a connection lost before is kNotSent, after kLostAfterSend.
struct HttpResponse {
  CallOutcome outcome;
  std::string body;
  std::string error;  // transport error text when no complete response arrived
  // The response's headers, names in lower case (bounded: 64, values cut at 1 KiB).
  std::vector<std::pair<std::string, std::string>> headers;

  // Returns the value of header `lower_name` ("" when absent).
  std::string Header(std::string_view lower_name) const {
    for (const auto& [name, value] : headers) {
      if (name == lower_name) return value;
    }
    return "";
  }
  // The request was sent once before with a bearer token the target refused (401),
  // then once more with a new token; this is the second answer. The engine records
  // the first as an attempt of its own that spends no business attempt.
  bool token_renewed = false;
};

}  // namespace waystone
