#pragma once

#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "engine/operate/operator_plan.h"
#include "store/store.h"

namespace waystone {

class Operations;

struct BatchRunnerOptions {
  // How often an idle runner looks for items to take and to judge.
  Millis poll_interval = 250;
  // How long a claim on an item lasts: a runner that died leaves its items to be
  // taken again after this. Must exceed a round's longest: items_per_round actions,
  // each waiting up to 3 s for a worker to let go of its instance.
  Millis claim_duration = 20'000;
  // Most items taken at once.
  int items_per_round = 4;
  // How long an applied item's instance may take to come to rest before the item
  // is judged `unsettled` with the state it is in then: one slow instance does not
  // hold its batch.
  Millis settle_patience = 120'000;
  // Times an item is taken while a worker holds its instance, before it fails.
  int max_tries = 5;
};

// Returns the action fields a batch keeps (step, happened, external_id, response)
// as JSON, and the request a batch's item is applied with (its actor, reason and
// public id); InvalidArgument for fields it did not write.
std::string BatchActionJson(const OperatorRequest& request);
absl::StatusOr<OperatorRequest> BatchRequest(const BatchRecord& batch);

// Returns the state an action leaves an instance in when it goes well: completed
// (retry, confirm, skip), compensated (compensate) or closed (close).
InstanceState AimOf(OperatorAction action);

// BatchRunner applies the items of running batches: it claims pending items in the
// store (so two runners, in one process or two, never take the same one), applies
// each through Operations::Apply as the single-instance API does, and judges each
// applied item by the state its instance comes to rest in. An item whose runner
// died is taken again once its claim expires; the audit record the action
// committed with (which names the batch) tells that it was applied already, so no
// instance gets the action twice. Owns one thread between Start() and Stop().
// Thread-safe; the pointers outlive it.
class BatchRunner {
 public:
  BatchRunner(BatchStore* batches, InstanceStore* instances, Operations* operations,
              const Clock* clock, std::string owner, BatchRunnerOptions options = {});
  ~BatchRunner();
  BatchRunner(const BatchRunner&) = delete;
  BatchRunner& operator=(const BatchRunner&) = delete;

  void Start();
  // Stops taking items; the item under way is finished first.
  void Stop();

  // Runs one round from the calling thread: takes and applies items, then judges
  // applied ones. Returns how many items moved.
  absl::StatusOr<int> RunOnce();

 private:
  void Loop(std::stop_token stop);
  absl::Status ApplyItem(const BatchItemRecord& item);
  absl::StatusOr<bool> Judge(const BatchItemRecord& item);
  // True when the instance's audit log holds this batch's action.
  absl::StatusOr<bool> AppliedBefore(const BatchRecord& batch, const BatchItemRecord& item);

  BatchStore* batches_;
  InstanceStore* instances_;
  Operations* operations_;
  const Clock* clock_;
  std::string owner_;
  BatchRunnerOptions options_;
  std::jthread thread_;
};

}  // namespace waystone
