#include "messaging/cloudevent.h"

#include <ctime>

#include <nlohmann/json.hpp>

namespace waystone {
namespace {

std::string Rfc3339(Millis at) {
  const time_t seconds = static_cast<time_t>(at / 1000);
  tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  char millis[8];
  std::snprintf(millis, sizeof(millis), ".%03lldZ", static_cast<long long>(at % 1000));
  return std::string(text) + millis;
}

}  // namespace

std::string WorkflowOf(const EventRecord& event) {
  const auto data = nlohmann::json::parse(event.payload_json, nullptr, false);
  if (!data.is_object()) return "";
  return data.value("workflow", "");
}

std::string ToCloudEventJson(const EventRecord& event, const std::string& deployment) {
  nlohmann::json data = nlohmann::json::parse(event.payload_json, nullptr, false);
  if (data.is_discarded()) data = nlohmann::json::object();
  const std::string workflow = data.is_object() ? data.value("workflow", "") : "";
  const std::string key = data.is_object() ? data.value("instance_key", "") : "";
  nlohmann::json doc = {{"specversion", "1.0"},
                        {"id", event.event_id},
                        {"source", "waystone://" + deployment + "/" + workflow},
                        {"type", event.type},
                        {"subject", key},
                        {"time", Rfc3339(event.created_at)},
                        {"datacontenttype", "application/json"},
                        {"aggregatetype", workflow},
                        {"aggregateid", key},
                        {"data", data}};
  return doc.dump();
}

}  // namespace waystone
