// libFuzzer target: the CloudEvents parser in all three modes. The first byte picks
// the mode; for binary mode the input is "name: value" header lines, a blank line,
// then the body.

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "server/cloudevents_in.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::map<std::string, std::string> headers;
  std::string body = rest;
  std::string content_type = mode == 0   ? "application/cloudevents+json"
                             : mode == 1 ? "application/cloudevents-batch+json"
                                         : "application/json";
  if (mode == 2) {
    const size_t end = rest.find("\n\n");
    const std::string head = rest.substr(0, end);
    body = end == std::string::npos ? "" : rest.substr(end + 2);
    size_t at = 0;
    while (at < head.size()) {
      const size_t eol = head.find('\n', at);
      const std::string line =
          head.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        headers[name] =
            line.substr(colon + 1 + (colon + 1 < line.size() && line[colon + 1] == ' '));
      }
      if (eol == std::string::npos) break;
      at = eol + 1;
    }
    if (headers.contains("content-type")) content_type = headers["content-type"];
  }
  const waystone::HeaderList list(headers.begin(), headers.end());  // names lower-cased above
  auto events = waystone::ParseCloudEvents(content_type, list, body);
  if (!events.ok() && events.status().message().empty()) std::abort();
  if (events.ok()) {
    for (const auto& e : *events) {
      if (e.id.empty() || e.source.empty() || e.type.empty()) std::abort();  // required attributes
    }
  }
  return 0;
}
