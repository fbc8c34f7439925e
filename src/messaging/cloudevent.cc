#include "messaging/cloudevent.h"

#include <nlohmann/json.hpp>

#include "base/time_format.h"
#include "model/json_text.h"

namespace waystone {

std::string WorkflowOf(const EventRecord& event) {
  const auto data = nlohmann::json::parse(event.payload_json, nullptr, false);
  if (!data.is_object()) return "";
  return data.value("workflow", "");
}

std::string ToCloudEventJson(const EventRecord& event, const std::string& deployment) {
  nlohmann::json data = nlohmann::json::parse(event.payload_json, nullptr, false);
  if (data.is_discarded()) data = nlohmann::json::object();
  // The database's instance id stays inside (the API shows none either): counted across
  // tenants, it would tell a sink how much work the others have. The instance is its
  // key (subject, aggregateid) within its tenant.
  if (data.is_object()) data.erase("instance_id");
  const std::string workflow = data.is_object() ? data.value("workflow", "") : "";
  const std::string key = data.is_object() ? data.value("instance_key", "") : "";
  nlohmann::json doc = {{"specversion", "1.0"},
                        {"id", event.event_id},
                        {"source", "waystone://" + deployment + "/" + workflow},
                        {"type", event.type},
                        {"subject", key},
                        {"time", FormatRfc3339(event.created_at)},
                        {"datacontenttype", "application/json"},
                        {"aggregatetype", workflow},
                        {"aggregateid", key},
                        {"data", data}};
  return JsonText(doc);
}

}  // namespace waystone
