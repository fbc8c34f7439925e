#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "http/http_front.h"

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

// Parses CloudEvents 1.0 from an HTTP request: structured mode
// (application/cloudevents+json), batched (application/cloudevents-batch+json), or
// binary mode (ce-* headers, the body is the data). `headers` have lower-case
// names, as HttpFront gives them; every ce-* one must be UTF-8 text, in any mode.
// InvalidArgument naming the event and the missing or malformed attribute.
absl::StatusOr<std::vector<IncomingEvent>> ParseCloudEvents(std::string_view content_type,
                                                            const HeaderList& headers,
                                                            const std::string& body);

}  // namespace waystone
