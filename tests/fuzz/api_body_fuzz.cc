// libFuzzer target: the JSON bodies of the API's write routes, parsed exactly as
// the handlers parse them. The first byte picks the route.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/request_bodies.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::Status status;
  switch (data[0] % 4) {
    case 0: {
      auto start = waystone::ParseStartBody(body);
      status = start.status();
      if (start.ok() && (start->workflow.empty() || start->input_json.empty())) std::abort();
      break;
    }
    case 1:
      status = waystone::ParseActionBody(body).status();
      break;
    case 2: {
      auto batch = waystone::ParseBatchBody(body);
      status = batch.status();
      if (batch.ok() && (batch->filter.empty() || batch->request.reason.empty())) std::abort();
      break;
    }
    default:
      status = waystone::ParseReasonBody(body).status();
      break;
  }
  if (!status.ok() && (status.message().empty() || !absl::IsInvalidArgument(status))) std::abort();
  return 0;
}
