#pragma once

#include <map>
#include <memory>
#include <stop_token>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "engine/tenant_policy.h"
#include "model/definition.h"
#include "store/store.h"

namespace waystone {

class CallMetrics;
class CodeWorkflow;
class DefinitionCatalog;
class Operations;

// Inputs larger than this are refused.
inline constexpr size_t kMaxInputBytes = 256 * 1024;
// Business keys travel in URLs, headers (Idempotency-Key) and Location: bounded.
inline constexpr size_t kMaxBusinessKeyBytes = 512;

struct EngineOptions {
  // Worker threads, each driving one instance at a time between its calls. A call
  // under way holds no worker: it waits on the HTTP client's event loop.
  int workers = 16;
  // Most instances claimed at once, those whose call is under way included.
  int max_in_flight = 10'000;
  // How long a claim lasts without a commit; every commit renews it. Must exceed
  // the longest step timeout.
  Millis lease_duration = 30'000;
  // How often an idle dispatcher looks for due instances.
  Millis poll_interval = 25;
  // How long an idempotency record pins its key to one request.
  Millis idempotency_retention = 7LL * 24 * 3600 * 1000;
  // Lease owner name; empty: "<host>/<pid>/<random>".
  std::string owner;
  // Take over at once the leases of dead processes on this host.
  bool reap_dead_local_owners = true;
  // File of NAME=value secrets for {{secret.NAME}}; empty: environment only.
  // With `tenants`, these are no tenant's: each tenant renders only its own.
  std::string secrets_file;
  // The folder whose files uploads may send (`path:` in a request's multipart or
  // body_file, relative to it); empty: no file from disk may be sent.
  std::string files_dir;
  // Tenants as a boundary (the server config's `tenants:`). Empty: one trust
  // domain, every tenant may start every workflow with the process's secrets.
  std::map<std::string, TenantPolicy> tenants;
  // Most changes per group commit.
  int max_batch = 256;
  // Counts the external calls (what /metrics shows of this process); outlives the
  // engine. Null: the engine keeps its own (see Engine::call_metrics()).
  CallMetrics* call_metrics = nullptr;
};

// How to start an instance.
struct StartRequest {
  std::string tenant = "default";
  std::string input_json;
  // When both are set, (source, id) is claimed in the inbox with the start: the
  // same event delivered again has no second effect.
  std::string event_source;
  std::string event_id;
  // When set, the business key the definition's `key:` must give for this input;
  // another key starts nothing (InvalidArgument naming both).
  std::string key;
  // The token that starts it (recorded; an approval's starter may not decide it).
  std::string started_by;
};

// Engine runs workflow instances: it starts them, and its worker pool claims
// runnable instances under leases and drives them. A worker hands each request to
// the HttpClient's SendAsync and takes up other instances; whichever worker is free
// when the response comes records it and drives on. Owns a commit queue thread,
// and between Start() and Stop() a dispatcher thread and `workers` worker threads.
// Thread-safe.
class Engine {
 public:
  // Creates an engine; the pointers must outlive it.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(Store* store, HttpClient* http,
                                                        const Clock* clock, Random* random,
                                                        const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks `definition` against engine limits (step timeouts vs lease) and stores it.
  absl::Status Register(const WorkflowDefinition& definition);

  // Registers the code workflow `name` (code_workflow.h): its definition
  // (CodeWorkflowDefinition) is stored and made current, and this engine's workers
  // run its instances with `workflow`. Returns the definition to start it with.
  absl::StatusOr<WorkflowDefinition> RegisterCode(const std::string& name,
                                                  std::shared_ptr<const CodeWorkflow> workflow);

  // Adds the targets the calls of code workflows go through (CodeWorkflows::AddTargets),
  // once each renders with the environment and secrets of `tenant`
  // (CheckTargetsRender); adds nothing otherwise.
  absl::Status AddCodeTargets(const std::vector<TargetSpec>& targets, const std::string& tenant);

  // Starts an instance of `definition` (registering it), or returns the existing
  // one with the same business key. A code workflow's key is request.key, which it
  // requires. InvalidArgument for bad input (not a JSON
  // object, too large, key template fails); FailedPrecondition for the same key
  // with another input.
  absl::StatusOr<StartResult> StartInstance(const WorkflowDefinition& definition,
                                            const StartRequest& request);

  // Starts the worker pool.
  void Start();
  // Stops claiming, lets each instance finish the action under way (a call under
  // way is waited for and its outcome recorded), releases every lease held, and
  // joins the threads.
  void Stop();

  // Drives one instance from the calling thread until it is completed, compensated,
  // failed or waiting for an operator, sleeping through retry timers and waiting
  // out other workers' leases. Returns the state it rests in; `running` when it
  // waits for an event with no deadline (a wait step with a deadline is watched
  // until the event or the deadline comes).
  absl::StatusOr<InstanceState> RunUntilRest(int64_t instance_id, std::stop_token stop);

  // Waits until instance `instance_id` is at rest — completed, compensated, failed,
  // closed or waiting for an operator — while the worker pool (this process's or
  // another's) drives it, and returns it; after `timeout` (real time, whatever the
  // engine's clock) returns it as it is (still running or compensating). A local
  // worker's finish wakes the wait at once. It does not check a tenant: the caller
  // holds an id it was allowed to see.
  absl::StatusOr<InstanceRecord> AwaitRest(int64_t instance_id, Millis timeout);

  // Returns true when no instance is runnable now or later and none is in flight.
  absl::StatusOr<bool> Idle();

  DefinitionCatalog& catalog();
  // Operator actions and event signals, applied under the instance's lease.
  Operations& operations();
  const std::string& owner() const;
  // The calls this engine made, by phase and outcome (options.call_metrics when given).
  const CallMetrics& call_metrics() const;

 private:
  class Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace waystone
