#pragma once

#include <string>
#include <vector>

#include "model/definition.h"
#include "model/records.h"

namespace waystone {

// What to do next for one instance. Produced by Decide; a value type.
struct NextAction {
  enum class Kind : uint8_t {
    kRunStep = 1,         // submit step `step` (first attempt or retry)
    kRecoverRunning = 2,  // step `step` was found running: its outcome is unknown
    kResolveUnknown = 3,  // step `step` is unknown: look up, resubmit or pause
    kCompensate = 4,      // run the compensation of step `step`
    kWait = 5,            // nothing is due before `wait_until`
    kFinish = 6,          // move the instance to `final_state`
    kIdle = 7,            // terminal or paused: nothing to do
    kAwaitEvent = 8,      // step `step` waits for an event until `wait_until` (0: no deadline)
    kAwaitCalls = 9,      // every step that could go now has a call under way: wait for one
    kSettleFailure = 10,  // step `step` failed beside branches now at rest: move the instance on
  };
  Kind kind = Kind::kIdle;
  int step = -1;
  Millis wait_until = 0;
  InstanceState final_state = InstanceState::kCompleted;

  bool operator==(const NextAction&) const = default;
};

// Decides the next action from the checkpoints alone. Pure: no I/O, no clock but
// `now`. Steps run in order; the branches of a parallel group run side by side, none
// waiting for another. `busy` lists the steps whose call is under way in this drive
// (their rows say `running` or `unknown`): they are passed over, so another branch's
// action comes next, or kAwaitCalls when none is left; a step that failed beside a
// busy one waits for it (kAwaitCalls), then kSettleFailure moves the instance on.
// After a failure (instance compensating) completed steps with a compensation are
// undone in reverse order.
NextAction Decide(const WorkflowDefinition& definition, const InstanceRecord& instance,
                  const std::vector<StepRecord>& steps, Millis now,
                  const std::vector<int>& busy = {});

// Returns the steps the forward run stands at, in step order: the first step not
// done; when it is in a parallel group, the first step not done of each of the group's
// branches. Empty when every step is done.
std::vector<int> Frontier(const WorkflowDefinition& definition,
                          const std::vector<StepRecord>& steps);

// Returns true for a step the forward run has gone past: completed, skipped (by its
// `when` or an operator), or an optional step that failed and was passed over
// (resolution passed_over, set by FailStep).
bool StepDone(const WorkflowDefinition& definition, const StepRecord& step);

// Returns the instance state that follows a step's failure: needs_attention for a
// manual step or one declared `on_failure: pause`, or while a step beside it (a
// parallel branch) has an unknown outcome; running while a call beside it is under
// way in this drive (`busy`: its outcome comes first, then Decide says
// kSettleFailure); compensating when a completed step has a compensation, else
// failed.
InstanceState StateAfterFailure(const WorkflowDefinition& definition,
                                const std::vector<StepRecord>& steps, int failed_step,
                                const std::vector<int>& busy = {});

}  // namespace waystone
