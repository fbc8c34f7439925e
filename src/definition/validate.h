#pragma once

#include <vector>

#include "definition/definition.h"
#include "definition/loader.h"

namespace waystone {

// Checks the rules that span fields: template references (roots, later or unknown
// steps), side-effecting steps without a lookup, honoured idempotency or `manual`,
// `compensable` without `compensate`, `lookup` without a lookup. Appends to `out`.
void ValidateDefinition(const WorkflowDefinition& definition, std::vector<Diagnostic>* out);

}  // namespace waystone
