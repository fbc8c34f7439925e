#pragma once

// Workflows written as C++ functions (the embedded API's Workflow<In, Out>), as the
// engine sees them: a function it runs under the instance's lease, from the top on
// every run, whose context journals each step as a step row. A step already
// recorded returns its recorded result (re-execution); one that is not runs and is
// recorded. See docs/cpp-api.md.

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "connectors/http/http_client.h"
#include "model/classify.h"
#include "model/definition.h"
#include "model/retry_policy.h"
#include "model/sql_statement.h"
#include "store/store.h"

namespace waystone {

// How a code step's failure is classified, from the status its function returns:
// Unavailable or ResourceExhausted: transient (nothing happened; retried with
// backoff); DeadlineExceeded or Unknown: the outcome is unknown (it may have acted);
// anything else: rejected (never retried).
ErrorClass ClassifyCodeFailure(const absl::Status& status);

class CodeContext;

// Why a step's run must wait before it begins (its target refused the call), and
// until when.
struct CodeWait {
  Millis until = 0;
  std::string reason;
};

struct CodeStepOptions {
  // The step may run again when its outcome is unknown (interrupted, a timeout):
  // it does nothing twice, or its target takes its idempotency key. When false, an
  // unknown outcome is looked up (`lookup`), or the instance waits for an operator.
  bool repeatable = true;
  // Retries by error class (a rejection is never retried):
  // - transient failures (nothing happened): attempts that may fail so, the first
  //   included, before the step fails; and the backoff between them;
  // - unknown outcomes (it may have acted, or it ran past `timeout`): how many the
  //   step may have, each looked up or run again after a backoff, before an operator
  //   decides (a lookup that failed counts against it too).
  RetryPolicy retry;
  RetryPolicy unknown;
  // How long one run of the function may take (0: no limit).
  // Past it the instance's lease is no longer renewed: when it runs out, any worker
  // with a free thread recovers the step as after a crash (its outcome unknown; not
  // sent again on a lookup's "not found" unless repeatable), and what the late run
  // returns is refused once another took the instance. Its thread is held until it
  // returns.
  Millis timeout = 0;
  // Asks the target whether the step acted after all, before it runs again: its
  // result when it did, nullopt when it did not. Errors are transient.
  std::function<absl::StatusOr<std::optional<std::string>>()> lookup;
  // Asked before each run's `running` checkpoint: nullopt to go; a wait when the run
  // may not begin yet (nothing of it is recorded, and it spends no attempt).
  std::function<std::optional<CodeWait>()> admit;
  // Undoes the completed step (given its result) when the workflow fails later.
  // It runs after the function returned: it must not use what the function's
  // frame held (it gets the context, with the compensation's idempotency key).
  std::function<absl::Status(CodeContext& ctx, const std::string& result_json)> compensate;
};

// What a transaction's function reaches the database through: the change's own
// connection, inside the transaction that also commits the step's checkpoint.
// Used by the thread running the function, only while it runs.
class CodeTransaction {
 public:
  // Runs `statement`, with :name parameters bound from `params` (never spliced), on
  // a table of the program's own (Waystone's tables are refused); returns its rows
  // as {"rows": [...], "count": n}.
  virtual absl::StatusOr<std::string> Execute(const std::string& statement,
                                              const std::map<std::string, SqlParam>& params) = 0;
  // Adds an outbox event, committed with the transaction (the relay delivers it).
  virtual void Emit(const std::string& type, const std::string& payload_json) = 0;

 protected:
  ~CodeTransaction() = default;
};

// A code workflow's HTTP call (CodeContext::Call): how it recovers and is undone.
struct CodeCallOptions {
  // The target takes the call's Idempotency-Key (it acts once per key): an unknown
  // outcome is sent again under the same key. GET, HEAD and OPTIONS always may be.
  bool repeatable = false;
  RetryPolicy retry;    // transient failures, as CodeStepOptions::retry
  RetryPolicy unknown;  // unknown outcomes, as CodeStepOptions::unknown
  // HTTP statuses whose class the default does not fit. (Lists of plain ints: the
  // public library builds them, and a std container over an engine type would be
  // exported from it.)
  std::vector<int> transient_statuses, unknown_statuses, rejected_statuses;
  // Reads a complete answer of the call itself (JSON as its result) before its
  // status is looked at: its class (kTransient, kRejected or kUnknown) when the
  // body says it failed (a 200 {"status":"ERROR"}), nullopt to class it by status.
  std::function<std::optional<ErrorClass>(const std::string& answer_json)> classify;
  // Asks the target whether the call acted before it is sent again: `lookup` is sent,
  // and `found` reads its answer (JSON as the call's result is) into the call's
  // result when it acted, nullopt when it did not.
  std::optional<HttpRequest> lookup;
  std::function<absl::StatusOr<std::optional<std::string>>(const std::string& answer_json)> found;
  // Over pages: the request for the page after `page_json` (one `found` found
  // nothing in), nullopt after the last. Up to 100 pages.
  std::function<absl::StatusOr<std::optional<HttpRequest>>(const std::string& page_json)> next_page;
  // The request that undoes the completed call (given its result), sent with the key
  // "<call's key>:compensate"; nullopt: nothing to undo; an error: it cannot be
  // undone (an operator decides).
  std::function<absl::StatusOr<std::optional<HttpRequest>>(const std::string& result_json)>
      compensate;
};

// The context a code workflow's function calls. Once the run must stop (it waits
// for a timer, the instance was parked, the lease was lost, the function diverged
// from the record) every call returns the same error: kStopped (Aborted). The
// function is expected to return it; what it returns then is not recorded.
// Used by the thread running the function.
class CodeContext {
 public:
  virtual ~CodeContext() = default;
  // Runs `fn` once for the instance, recorded as step `name` at the next position
  // (an earlier run's result is returned without running it). `input_json` is
  // hashed: another input at the same position is a divergence.
  virtual absl::StatusOr<std::string> Step(const std::string& name, const std::string& input_json,
                                           const std::function<absl::StatusOr<std::string>()>& fn,
                                           const CodeStepOptions& options) = 0;
  // Sends `request` once for the instance as step `name` (a step whose function is
  // the call): its Idempotency-Key header is the step's key, the same on every
  // attempt; the answer is classified as a YAML step's is; an unknown outcome is
  // looked up before it is sent again. Its result is {"status": n, "headers":
  // {lower-case name: value}, "body": "text"}.
  virtual absl::StatusOr<std::string> Call(const std::string& name, HttpRequest request,
                                           const CodeCallOptions& options) = 0;
  // Runs `fn` inside the transaction that records it as step `name`: what it writes
  // and the checkpoint commit together or not at all. Its result is the step's.
  virtual absl::StatusOr<std::string> Transaction(
      const std::string& name,
      const std::function<absl::StatusOr<std::string>(CodeTransaction&)>& fn) = 0;
  // The clock, a random number, a UUID: recorded on first use, the same on replay.
  virtual absl::StatusOr<Millis> Now() = 0;
  virtual absl::StatusOr<uint64_t> Random() = 0;
  virtual absl::StatusOr<std::string> Uuid() = 0;
  // Waits `duration` on a durable timer: the instance rests (no thread held) and
  // runs again from the top when it is due.
  virtual absl::Status Sleep(Millis duration) = 0;
  // Waits for an event of `event_type` delivered to the instance (Operations::Deliver,
  // claimed in the inbox) for at most `timeout` (0: no limit): its data (JSON), or
  // DeadlineExceeded once the timeout passed. The instance rests meanwhile. An event
  // that came before (while nothing waited for its type) was kept: the oldest such
  // is taken at once.
  virtual absl::StatusOr<std::string> WaitEvent(const std::string& event_type, Millis timeout) = 0;
  // True when this run may take the code path introduced under `patch`: an instance
  // that recorded steps past this point without it keeps the old path.
  virtual absl::StatusOr<bool> Patched(const std::string& patch) = 0;
  // The idempotency key of the step running now ("" outside a step): the same on
  // every attempt of that step.
  virtual const std::string& idempotency_key() const = 0;
  virtual const std::string& business_key() const = 0;
};

// A code workflow's function.
class CodeWorkflow {
 public:
  virtual ~CodeWorkflow() = default;
  // Runs the workflow from the top with the instance's input; returns its output
  // (JSON text), or an error that fails it (its completed steps are compensated).
  virtual absl::StatusOr<std::string> Run(CodeContext& ctx,
                                          const std::string& input_json) const = 0;
};

// The code workflows this process can run, by name. Thread-safe.
class CodeWorkflows {
 public:
  void Register(const std::string& name, std::shared_ptr<const CodeWorkflow> workflow) {
    MutexLock lock(mu_);
    by_name_[name] = std::move(workflow);
  }
  std::shared_ptr<const CodeWorkflow> Find(const std::string& name) {
    MutexLock lock(mu_);
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }

  // The targets their calls go through (CodeContext::Call, its lookup and its
  // compensation), as a definition's `targets:`: a name given again is replaced.
  void AddTargets(const std::vector<TargetSpec>& targets) {
    MutexLock lock(mu_);
    auto merged = std::make_shared<std::vector<TargetSpec>>(*targets_);
    for (const TargetSpec& target : targets) {
      auto same = std::find_if(merged->begin(), merged->end(),
                               [&](const TargetSpec& t) { return t.name == target.name; });
      if (same != merged->end()) {
        *same = target;
      } else {
        merged->push_back(target);
      }
    }
    targets_ = std::move(merged);
  }
  std::shared_ptr<const std::vector<TargetSpec>> Targets() {
    MutexLock lock(mu_);
    return targets_;
  }

 private:
  Mutex mu_;
  std::map<std::string, std::shared_ptr<const CodeWorkflow>> by_name_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::vector<TargetSpec>> targets_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const std::vector<TargetSpec>>();
};

// The step row of a function waiting for an event of `event_type` (WaitEvent).
inline std::string CodeWaitRowName(const std::string& event_type) { return "$wait:" + event_type; }

// The error every context call returns once the run has stopped.
bool IsCodeRunStopped(const absl::Status& status);

}  // namespace waystone
