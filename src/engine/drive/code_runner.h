#pragma once

#include <stop_token>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/drive/instance_runner.h"
#include "store/store.h"

namespace waystone {

// Drives one claimed instance of a code workflow (definition.code): runs its
// function (from deps.code) from the top, each step recorded as a step row at its
// position: a recorded step returns its result; an unrecorded one is checkpointed
// `running`, run, and its outcome committed before the function goes on. A step
// whose position, name or input differs from the record parks the instance
// (definition_diverged). After the function fails, the completed steps'
// compensations run in reverse order. `instance` and `steps` are as loaded under
// `lease`. Returns where the instance was left, as InstanceRunner::Drive does
// (never `calling`: the function's own steps wait on this thread).
absl::StatusOr<DriveResult> DriveCodeWorkflow(const RunnerDeps& deps, const Lease& lease,
                                              const InstanceRecord& instance,
                                              std::vector<StepRecord> steps, std::stop_token stop);

}  // namespace waystone
