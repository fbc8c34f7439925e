#pragma once

// Engine-internal: the pieces every transition (transitions.cc, approvals.cc) builds
// its Change with. Pure like the transitions.

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "rules/transitions.h"

namespace waystone {

// A change at `facts.now`; the runner adds its lease. Whatever happens next, the
// instance no longer waits for a target (its reason from before comes back).
Change At(const Facts& facts);

// Adds the outbox event `type` about the instance (and `step`, when given).
void AddEvent(const Facts& facts, Change& change, std::string_view type, const StepRecord* step,
              std::string_view message = {});

// Raises an alert; alerts are pushed, not only listed: each leaves through the outbox once.
void AddAlert(const Facts& facts, Change& change, AlertKind kind, const std::string& step,
              const std::string& message);

// What a step keeps of an answer, as JSON text, by its `store_response`: the
// pointers its templates read (by default), all, none ("{}"), or a list. Never
// empty: a kept answer also marks "the target said yes".
std::string KeptAnswer(const nlohmann::json& answer, const StepDefinition& step);

// Moves the instance to `state` with its event (and releases it to run now).
void SetInstanceState(const Facts& facts, Change& change, InstanceState state,
                      const std::string& reason);

}  // namespace waystone
