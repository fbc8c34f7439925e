#pragma once

// Waystone embedded in a C++ program: open an engine on a database, register
// workflow definitions, start instances by business key and wait for their
// outcome. The instances are the same as those `waystone serve` and `waystone
// worker` run on the same database: listed, shown, retried, confirmed,
// compensated and closed by the HTTP API, the CLI and the console.
//
//   auto engine = waystone::api::Engine::Open({.database = "orders.db"});
//   if (!engine.ok()) ...                       // engine.status().message() says why
//   (*engine)->RegisterFile("order-to-erp.yaml");
//   auto order = (*engine)->Start("order-to-erp", "", R"({"order_id":"A-1"})");
//   auto outcome = (*order)->Wait(std::chrono::seconds(30));
//
// See docs/cpp-api.md.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "waystone/export.h"
#include "waystone/status.h"
#include "waystone/workflow.h"

namespace waystone::api {

enum class InstanceState {
  kRunning,         // has work to do now or later (a retry timer, a wait for an event)
  kCompleted,       // every step completed
  kCompensating,    // a step failed; compensations are running
  kCompensated,     // compensations finished: the business action was undone
  kFailed,          // a step failed and there was nothing to compensate
  kNeedsAttention,  // paused until an operator acts (an unknown outcome, a conflict)
  kClosed,          // closed by an operator, with a reason
};

// "running", "completed", ...: the names the HTTP API and the CLI use.
WAYSTONE_API const char* ToString(InstanceState state);

// One step's checkpoint as it stands. A value (like std::string).
struct StepOutcome {
  std::string name;
  std::string state;        // "pending", "running", "completed", "unknown", ...
  int attempts = 0;         // submissions of its request
  std::string external_id;  // the order number, message id, ... it recorded
  // What the checkpoint keeps of its response: the fields the definition reads
  // of it (later templates, `result:`), or a transform's output; "{}" when none.
  std::string response_json;
  std::string error;  // its last error, if any
};

// An instance as it stands. A value (like std::string).
struct Outcome {
  std::string key;  // the business key
  std::string workflow;
  InstanceState state = InstanceState::kRunning;
  // Completed, compensated, failed, closed or waiting for an operator: nothing
  // will change until an operator comes. (An instance waiting for an event is
  // running, not at rest: Wait returns it when its timeout passes.)
  bool at_rest = false;
  std::string reason;  // why it rests where it does, for operators
  std::vector<StepOutcome> steps;
  // A workflow written as a function (Workflow): its output (JSON), once completed;
  // "" otherwise. Output<Out>(outcome) decodes it.
  std::string output_json;
};

// The output of a completed function workflow, decoded; FailedPrecondition naming
// the state (and reason) when it is not completed.
template <typename Out>
Result<Out> Output(const Outcome& outcome) {
  if (outcome.state != InstanceState::kCompleted) {
    return Status(Status::Code::kFailedPrecondition,
                  "instance '" + outcome.key + "' is " + ToString(outcome.state) +
                      (outcome.reason.empty() ? "" : ": " + outcome.reason));
  }
  return Codec<Out>::Decode(outcome.output_json);
}

// A clock a test moves by hand (EngineOptions::clock): the engine's time — durable
// timers (Context::Sleep), retry backoffs, WaitEvent's timeout, recorded
// Context::Now(), leases — moves only when the test advances it. Advance it while
// no step is running: a lease is in the same time, and a step under way when an
// advance passes its lease may be taken over as interrupted. Thread-safe.
class WAYSTONE_API ManualClock {
 public:
  static std::shared_ptr<ManualClock> Create(std::chrono::system_clock::time_point start);
  virtual ~ManualClock();
  virtual std::chrono::system_clock::time_point Now() const = 0;
  virtual void Advance(std::chrono::milliseconds by) = 0;

 protected:
  ManualClock() = default;
};

// What Engine::Open opens. A value (like std::string).
struct EngineOptions {
  // A SQLite file (created if missing) or a PostgreSQL URI ("postgresql://...").
  std::string database;
  // Worker threads of this engine. 0: none; instances started here are run by
  // another process's workers on the same database (`waystone worker`).
  int workers = 4;
  // PostgreSQL: the connections this engine keeps open (its workers, its commit
  // thread and the starts share them). SQLite: unused.
  int database_connections = 8;
  // The tenant instances are started for.
  std::string tenant = "default";
  // A file of NAME=value secrets for {{secret.NAME}}; empty: the environment only.
  std::string secrets_file;
  // The folder whose files requests may upload; empty: none.
  std::string files_dir;
  // How long a worker's claim on an instance lasts without a commit; must exceed
  // the longest step timeout. Another process takes an instance over after it.
  std::chrono::milliseconds lease = std::chrono::seconds(30);
  // For tests: the engine's time, moved by hand. Null: the system clock. (Wait's
  // timeout is always real time.)
  std::shared_ptr<ManualClock> clock;
};

// A started (or found) instance. Thread-compatible: one thread at a time per
// handle; handles of the same instance may be used from different threads.
// A handle keeps its engine's database open; once the Engine is destroyed, Wait
// sees only what other processes' workers do.
class WAYSTONE_API Instance {
 public:
  virtual ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  virtual const std::string& key() const = 0;
  // False when Start found an instance of the same key and input (a second start
  // of the same business action is the first one).
  virtual bool created() const = 0;
  // Waits until the instance is at rest, or `timeout` passed (then at_rest is
  // false and the outcome is as it stands). The engine's workers, or another
  // process's, drive it meanwhile.
  virtual Result<Outcome> Wait(std::chrono::milliseconds timeout) = 0;
  // The instance as it stands now.
  virtual Result<Outcome> Get() = 0;

 protected:
  Instance() = default;
};

// Thread-safe: every method may be called from any thread at once.
class WAYSTONE_API Engine {
 public:
  // Opens (and creates or migrates) the database and starts `options.workers`
  // worker threads.
  static Result<std::unique_ptr<Engine>> Open(const EngineOptions& options);
  // Stops the workers: each finishes the action under way (a call under way is
  // waited for and its outcome recorded) and releases its claim.
  virtual ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Loads a YAML definition and registers it under its workflow name (a newer
  // registration of a name is used for new starts; running instances keep the
  // definition they started with). A mistake is InvalidArgument naming the file,
  // line and field (a file that is not there: NotFound), and registers nothing.
  virtual Status RegisterFile(const std::string& path) = 0;
  // The same from text; `origin` names it in errors.
  virtual Status RegisterYaml(const std::string& text, const std::string& origin) = 0;

  // Starts an instance of `workflow` with `input_json` (a JSON object), or
  // returns the one already started for its business key with the same input
  // (created() false). The key comes from the definition's `key:` template;
  // when `key` is not empty it must be what the template gives for this input,
  // or nothing starts (InvalidArgument naming both). The same key with another
  // input is FailedPrecondition, and starts nothing.
  virtual Result<std::unique_ptr<Instance>> Start(const std::string& workflow,
                                                  const std::string& key,
                                                  const std::string& input_json) = 0;
  // The instance of this tenant with business key `key`; NotFound if none.
  virtual Result<std::unique_ptr<Instance>> Find(const std::string& key) = 0;

  // Registers a workflow written as a function (waystone/workflow.h). This engine's
  // workers run its instances; register it in every process whose workers share
  // the database (a process without it leaves its instances to one that has it).
  // Register before instances of it may be due: at Open's return, workers start.
  template <typename In, typename Out>
  Status Register(const Workflow<In, Out>& workflow) {
    return RegisterFunction(workflow.name(), workflow.Raw());
  }
  // Starts an instance of `workflow` under business key `key` (required) with
  // `input`, or returns the one started before with that key and the same input.
  template <typename In, typename Out>
  Result<std::unique_ptr<Instance>> Start(const Workflow<In, Out>& workflow, const std::string& key,
                                          const In& input) {
    return Start(workflow.name(), key, Codec<In>::Encode(input));
  }
  // Delivers an event to the instance of this tenant with business key `key`: a
  // function waiting in Context::WaitEvent for `event_type` gets `data_json`. The
  // event is claimed in the inbox under (source, id) with its effect: delivered
  // again, it changes nothing (OK). When the function does not wait for that type
  // now, the event is kept (OK) for its next WaitEvent of the type; FailedPrecondition
  // when the instance keeps 100 such events already, or takes no more events (it
  // ended, or compensates); DeadlineExceeded when its latest wait for the type timed
  // out (until it waits for the type again); Unavailable when a worker holds the
  // instance for long (try again); NotFound when there is no such instance.
  virtual Status Signal(const std::string& key, const std::string& event_type,
                        const std::string& source, const std::string& id,
                        const std::string& data_json) = 0;

  // Registers the systems that workflows written as functions call, as a YAML
  // definition's `targets:` (docs/definition-reference.md#targets): a document
  // `targets: { erp: { url: ..., tls: ..., oauth2: ..., limits: ...,
  // circuit_breaker: ... } }`. Every request of Context::Call (the call, its
  // lookup, its compensation) whose URL lies under a target's `url` goes with
  // its TLS identity and OAuth2 token, and asks its protections first (an
  // operator's pause, the circuit breaker, the concurrency cap and rate limit,
  // shared by every process on the database): refused, it is not sent, and the
  // instance waits (its reason says for what) without spending an attempt. A
  // name registered again is replaced. Targets are this process's: register them
  // before Register(workflow), in every process that runs it. Secrets come from
  // {{secret.NAME}} or {{env.NAME}} only. A mistake is InvalidArgument naming
  // `origin`, the line and the field, and registers nothing.
  virtual Status RegisterTargets(const std::string& yaml, const std::string& origin) = 0;

  // The untyped registration Register uses: the function over JSON text.
  virtual Status RegisterFunction(
      const std::string& name,
      std::function<Result<std::string>(Context&, const std::string&)> function) = 0;

 protected:
  Engine() = default;
};

}  // namespace waystone::api
