#pragma once

#include <string>

#include "store/store.h"

namespace waystone {

// Renders an outbox row as a CloudEvents 1.0 JSON document (structured mode):
//   id      the row's stable event id (the same on every delivery attempt)
//   source  "waystone://<deployment>/<workflow>"
//   type    the row's type, e.g. "waystone.step.completed"
//   subject the instance key
//   time    when the row was committed (RFC 3339, UTC)
//   data    the row's payload (instance key, tenant, step, state, external id, trace id)
// plus the Debezium-style routing extensions aggregatetype (the workflow) and
// aggregateid (the instance key), so consumers can partition by instance.
std::string ToCloudEventJson(const EventRecord& event, const std::string& deployment);

// Returns the workflow named in an outbox row's payload ("" if absent).
std::string WorkflowOf(const EventRecord& event);

}  // namespace waystone
