#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace waystone {

// One CloudEvent received by POST /v1/events. A value type.
struct IncomingEvent {
  std::string id;
  std::string source;
  std::string type;
  std::string subject;
  std::string tenant;     // the `tenant` extension attribute, if any
  std::string data_json;  // the data as JSON text; "null" when there is none
};

// Returns the value of a request header (case-insensitive name), if present.
using HeaderLookup = std::function<std::optional<std::string>(std::string_view name)>;

// Parses CloudEvents 1.0 from an HTTP request: structured mode
// (application/cloudevents+json), batched (application/cloudevents-batch+json), or
// binary mode (ce-* headers, the body is the data). InvalidArgument naming the
// event and the missing or malformed attribute.
absl::StatusOr<std::vector<IncomingEvent>> ParseCloudEvents(std::string_view content_type,
                                                            const HeaderLookup& header,
                                                            const std::string& body);

}  // namespace waystone
