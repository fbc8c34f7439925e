#pragma once

#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "engine/catalog.h"
#include "engine/commit_queue.h"
#include "engine/drive/rate_slot.h"
#include "engine/lease_keeper.h"
#include "model/definition.h"
#include "store/store.h"

namespace waystone {

class CallMetrics;
class CodeWorkflows;
class TemplateEnvironment;

// What a runner needs; all pointers outlive the runner.
struct RunnerDeps {
  Store* store = nullptr;
  CommitQueue* commits = nullptr;
  HttpClient* http = nullptr;
  const Clock* clock = nullptr;
  Random* random = nullptr;
  DefinitionCatalog* catalog = nullptr;
  const TemplateEnvironment* environment = nullptr;
  Millis lease_duration = 30'000;
  Millis idempotency_retention = 7LL * 24 * 3600 * 1000;
  LeaseKeeper* keeper = nullptr;   // renews the lease during long calls; may be null
  CallMetrics* metrics = nullptr;  // counts the calls made; required
  std::string files_dir;           // where uploads' `path` files live; empty: none may be sent
  CodeWorkflows* code = nullptr;   // the code workflows this process runs; may be null
  // `tenants:` configured: every sql statement must touch only its tenant's rows
  // (model/sql_tenant_scope.h); one that may not is refused before it runs.
  bool tenant_scoped_sql = false;
};

// Where a drive left the instance.
struct DriveResult {
  InstanceState state = InstanceState::kRunning;
  std::optional<Millis> wake_at;  // set when it waits for a retry timer
  bool lease_lost = false;        // another worker took over; nothing more was written
  bool awaiting_event = false;    // a wait step waits for an event (wake_at: its deadline)
  // Set only by an asynchronous drive: requests are ready to go (TakeRequests); each
  // response goes to Resume. Nothing else is set then.
  bool calling = false;
  // Set only by an asynchronous drive: calls are under way and none is ready to go;
  // their responses go to Resume. The lease is held. Nothing else is set then.
  bool awaiting_calls = false;
};

// A request an asynchronous drive hands out, its checkpoint committed.
struct OutgoingCall {
  int id = 0;  // quoted with its response to Resume
  HttpRequest request;
  RateSlot slot;  // a target's rate limit: no earlier than slot.send_at; 0: at once
};

// An instance as the transaction that created it left it: its row and its pending
// steps. The first drive of an instance this engine has just started begins from it
// instead of reading both back.
struct CreatedInstance {
  InstanceRecord instance;
  std::vector<StepRecord> steps;
};

// What a start that created `instance` with steps named `step_names` wrote: the row
// it read back, and each step pending with nothing recorded yet.
CreatedInstance CreatedBy(const InstanceRecord& instance,
                          const std::vector<std::string>& step_names);

// InstanceRunner drives one claimed instance: decide, checkpoint, call, classify,
// checkpoint, until the instance waits, finishes, pauses or the lease is lost.
// Every write goes through the CommitQueue with the lease as fencing token.
// Single-threaded: one runner per claimed instance.
class InstanceRunner {
 public:
  // With `created`, the first drive begins from it rather than from the store.
  InstanceRunner(const RunnerDeps& deps, Lease lease,
                 std::optional<CreatedInstance> created = std::nullopt);
  ~InstanceRunner();
  InstanceRunner(const InstanceRunner&) = delete;
  InstanceRunner& operator=(const InstanceRunner&) = delete;

  // Drives the instance. When `stop` is requested it starts nothing new, lets the
  // calls under way come back, releases the lease and returns. Errors other than a
  // lost lease leave the lease to expire so another worker retries.
  //
  // The branches of a parallel group call side by side: each call's checkpoint
  // commits before it goes, each outcome commits as it comes back, and another
  // branch's step goes meanwhile.
  //
  // A synchronous drive (the default) sends the requests itself and waits for them.
  // An asynchronous one returns with `calling` set when requests are due, their
  // checkpoints committed: the caller sends TakeRequests() however it likes (the
  // lease keeper holds the lease meanwhile) and hands each response to Resume, one at
  // a time (not concurrently), which records it and drives on. Either way the same
  // rules run.
  absl::StatusOr<DriveResult> Drive(std::stop_token stop, bool async = false);
  // The requests an asynchronous drive stopped for; once per `calling`.
  std::vector<OutgoingCall> TakeRequests();
  // Records the response to the call `id` of TakeRequests() and drives on, as Drive does.
  absl::StatusOr<DriveResult> Resume(int id, HttpResponse response, std::stop_token stop);

  int64_t instance_id() const;
  // The instance's row as this runner last committed it: what the store reads back
  // while no one else writes it (its lease holds them off). Valid after a drive that
  // returned without error and kept its lease. Null for a code workflow, whose run
  // commits through a runner of its own (code_runner.h) that keeps no such row.
  const InstanceRecord* committed_row() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace waystone
