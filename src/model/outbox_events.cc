#include "model/outbox_events.h"

#include <nlohmann/json.hpp>

#include "model/json_text.h"

namespace waystone {

EventRecord MakeEvent(std::string_view type, const InstanceRecord& instance, const StepRecord* step,
                      std::string_view message, Random& random, Millis now) {
  nlohmann::json data = {{"instance_key", instance.key},
                         {"instance_id", instance.id},
                         {"tenant", instance.tenant},
                         {"workflow", instance.workflow},
                         {"trace_id", instance.trace_id}};
  if (step != nullptr) {
    data["step"] = step->name;
    data["state"] = std::string(ToString(step->state));
    data["attempts"] = step->attempts;
    if (!step->external_id.empty()) data["external_id"] = step->external_id;
    if (step->error_class != ErrorClass::kNone) {
      data["error_class"] = std::string(ToString(step->error_class));
    }
    if (step->resolution != Resolution::kNone) {
      data["resolution"] = std::string(ToString(step->resolution));
    }
  }
  if (!message.empty()) data["message"] = std::string(message);
  EventRecord event;
  event.event_id = random.TimeOrderedHex(now);
  event.instance_id = instance.id;
  event.tenant = instance.tenant;
  event.type = std::string(type);
  event.payload_json = JsonText(data);
  event.created_at = now;
  return event;
}

EventRecord MakeAlertEvent(const AlertRecord& alert, const InstanceRecord& instance, Random& random,
                           Millis now) {
  StepRecord step;
  step.name = alert.step;
  return MakeEvent("waystone.alert." + std::string(ToString(alert.kind)), instance,
                   alert.step.empty() ? nullptr : &step, alert.message, random, now);
}

}  // namespace waystone
