#include "server/cloudevents_in.h"

#include <nlohmann/json.hpp>

#include "base/utf8.h"
#include "model/json_text.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr const char* kRequired[] = {"specversion", "id", "source", "type"};

bool IsJsonType(std::string_view content_type) {
  const std::string_view media = content_type.substr(0, content_type.find(';'));
  return media.empty() || media == "application/json" || media.ends_with("+json") ||
         media == "text/json";
}

absl::Status Missing(const std::string& where, const std::string& attribute, const char* how) {
  return absl::InvalidArgumentError(where + "missing required attribute '" + attribute + "'" + how);
}

absl::StatusOr<IncomingEvent> FromStructured(const Json& object, const std::string& where) {
  if (!object.is_object()) return absl::InvalidArgumentError(where + "an event is a JSON object");
  for (const char* attribute : kRequired) {
    if (!object.contains(attribute)) return Missing(where, attribute, "");
    if (!object[attribute].is_string() || object[attribute].get<std::string>().empty()) {
      return absl::InvalidArgumentError(where + "attribute '" + attribute +
                                        "' must be a non-empty string");
    }
  }
  if (object["specversion"] != "1.0") {
    return absl::InvalidArgumentError(where + "specversion must be \"1.0\"");
  }
  IncomingEvent event;
  event.id = object["id"];
  event.source = object["source"];
  event.type = object["type"];
  if (object.contains("subject") && object["subject"].is_string())
    event.subject = object["subject"];
  if (object.contains("tenant")) {
    if (!object["tenant"].is_string()) {
      return absl::InvalidArgumentError(where + "attribute 'tenant' must be a string");
    }
    event.tenant = object["tenant"];
  }
  if (object.contains("data") && object.contains("data_base64")) {
    return absl::InvalidArgumentError(where + "an event has 'data' or 'data_base64', not both");
  }
  if (object.contains("data")) {
    event.data_json = JsonText(object["data"]);
  } else if (object.contains("data_base64")) {
    event.data_json = JsonText(object["data_base64"]);  // kept as its base64 text
  } else {
    event.data_json = "null";
  }
  return event;
}

}  // namespace

absl::StatusOr<std::vector<IncomingEvent>> ParseCloudEvents(std::string_view content_type,
                                                            const HeaderList& headers,
                                                            const std::string& body) {
  // Every attribute is text: checked before anything is claimed or committed.
  for (const auto& [name, value] : headers) {
    if (name.starts_with("ce-") && FirstInvalidUtf8(value) != std::string::npos) {
      return absl::InvalidArgumentError("header " + name + " is not UTF-8 text");
    }
  }
  auto header = [&headers](const std::string& name) -> std::optional<std::string> {
    for (const auto& [n, v] : headers) {
      if (n == name) return v;
    }
    return std::nullopt;
  };
  const std::string_view media = content_type.substr(0, content_type.find(';'));
  std::vector<IncomingEvent> events;
  if (media == "application/cloudevents+json" || media == "application/cloudevents-batch+json") {
    auto bounded = ParseBoundedJson(body, "the body");
    if (!bounded.ok()) return bounded.status();
    const Json& parsed = *bounded;
    if (media == "application/cloudevents+json") {
      auto event = FromStructured(parsed, "");
      if (!event.ok()) return event.status();
      events.push_back(std::move(*event));
      return events;
    }
    if (!parsed.is_array()) {
      return absl::InvalidArgumentError("a batch is a JSON array of events");
    }
    if (parsed.empty()) return absl::InvalidArgumentError("the batch is empty");
    for (size_t i = 0; i < parsed.size(); ++i) {
      auto event = FromStructured(parsed[i], "event " + std::to_string(i) + ": ");
      if (!event.ok()) return event.status();
      events.push_back(std::move(*event));
    }
    return events;
  }
  // Binary mode: the attributes are ce-* headers, the body is the data.
  IncomingEvent event;
  for (const char* attribute : kRequired) {
    auto value = header(std::string("ce-") + attribute);
    if (!value || value->empty()) {
      return Missing("", attribute, (std::string(" (header ce-") + attribute + ")").c_str());
    }
  }
  if (*header("ce-specversion") != "1.0") {
    return absl::InvalidArgumentError("ce-specversion must be 1.0");
  }
  event.id = *header("ce-id");
  event.source = *header("ce-source");
  event.type = *header("ce-type");
  event.subject = header("ce-subject").value_or("");
  event.tenant = header("ce-tenant").value_or("");
  if (body.empty()) {
    event.data_json = "null";
  } else if (IsJsonType(content_type)) {
    auto data = ParseBoundedJson(body, "the body (the event's data)");
    if (!data.ok()) return data.status();
    event.data_json = JsonText(*data);
  } else {
    // Kept as a JSON string: it must be text.
    if (const size_t bad = FirstInvalidUtf8(body); bad != std::string::npos) {
      return absl::InvalidArgumentError("the body (the event's data) is not UTF-8 text: byte " +
                                        std::to_string(bad) + " is not");
    }
    event.data_json = JsonText(Json(body));
  }
  events.push_back(std::move(event));
  return events;
}

}  // namespace waystone
