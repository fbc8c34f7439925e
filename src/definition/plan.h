#pragma once

#include <string>

#include "model/definition.h"

namespace waystone {

// Returns the recovery plan of a definition as text for an operator: per step its
// recovery class, idempotency key, and what happens on transient, rejected and
// unknown outcomes, and its compensation.
std::string RenderPlan(const WorkflowDefinition& definition);

}  // namespace waystone
