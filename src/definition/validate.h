#pragma once

#include <vector>

#include "definition/loader.h"
#include "model/definition.h"

namespace waystone {

// Checks the rules that span fields: template references (roots, later or unknown
// steps), side-effecting steps without a lookup, honoured idempotency or `manual`,
// `compensable` without `compensate`, `lookup` without a lookup. Appends to `out`.
void ValidateDefinition(const WorkflowDefinition& definition, std::vector<Diagnostic>* out);

// For every step that keeps what is needed (or a list), adds the JSON pointers into
// its answer that the workflow's templates read (`{{steps.NAME.response.a.0.b}}`
// is "/a/0/b"); a template reading the whole answer keeps it whole (""). Runs on a
// valid definition. Pure.
void DeriveKeptResponses(WorkflowDefinition* definition);

}  // namespace waystone
