#pragma once

#include <string>
#include <string_view>

#include "base/random.h"
#include "model/records.h"

namespace waystone {

// Returns an outbox event of `type` ("waystone.step.completed", ...) about
// `instance` and, when given, one of its steps. The id is a UUIDv7 of `now` (time-ordered,
// 74 random bits) and stable: the relay delivers it unchanged on every attempt.
EventRecord MakeEvent(std::string_view type, const InstanceRecord& instance, const StepRecord* step,
                      std::string_view message, Random& random, Millis now);

// Returns the outbox event that pushes `alert` (about `instance`) to the sinks.
EventRecord MakeAlertEvent(const AlertRecord& alert, const InstanceRecord& instance, Random& random,
                           Millis now);

}  // namespace waystone
