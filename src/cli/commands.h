#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tenant_policy.h"

namespace waystone {
class Relay;
class Store;
}  // namespace waystone

namespace waystone::cli {

// Exit codes of the `waystone` binary.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;         // bad input, unreachable database, ...
inline constexpr int kExitUsage = 2;         // bad command line
inline constexpr int kExitNotCompleted = 3;  // `run`: the instance rests, but not completed

// Options every command shares.
struct GlobalOptions {
  std::string db;  // --db, WAYSTONE_DB, ./waystone.db
  std::string tenant = "default";
  std::string secrets_file;   // --secrets
  std::string files_dir;      // --files
  std::string lease = "30s";  // --lease
  // --step-key-retention: how long a step's idempotency key stays pinned to its
  // request (longer than the targets keep their keys); a workflow may set its own.
  std::string step_key_retention = "7d";
  // --attempts-per-step: attempt records kept per step (StoreOptions::attempts_per_step).
  int attempts_per_step = 1000;
  // SQLite's synchronous mode (StoreOptions::synchronous); not a flag: verify-worker
  // sets NORMAL, since it is killed, never powered off.
  std::string sqlite_synchronous = "FULL";
  bool verbose = false;
  // A server config (--config, WAYSTONE_CONFIG) whose `tenants:` every engine
  // command obeys: serve reads it whole, run/start/worker its tenants and secrets.
  std::string config;
  // The config's `tenants:` once read (serve reads them itself); nullopt = not read.
  std::optional<std::map<std::string, TenantPolicy>> tenants;
  std::map<std::string, int> tenant_lines;
};

struct RunOptions {
  std::string definition;
  std::string input;  // JSON text or @file
  std::string event_source;
  std::string event_id;
};

struct WorkerOptions {
  std::string definitions_dir;
  int workers = 16;
  int max_in_flight = 10'000;  // instances held at once, calls under way included
  bool exit_when_idle = false;
  std::string relay_config;    // also run the outbox relay with this config
  std::string metrics_listen;  // host:port of a token-less /metrics for scrapers; "" = none
};

struct RelayOptions {
  std::string config;
  std::string enable_sink;     // re-enable a sink disabled after a 410, then exit
  bool until_drained = false;  // exit once nothing is left to deliver now
  std::string metrics_listen;  // serve /metrics on host:port
};

struct StartOptions {
  std::string definition;
  std::string input;        // JSON text or @file
  std::string inputs_file;  // one JSON object per line
  std::string event_source;
  std::string event_id;
};

struct StatusOptions {
  std::string key;
  bool json = false;
  std::string sim_url;  // add the simulator's counts to the summary
};

struct ListOptions {
  std::string state;
  std::string workflow;
  int limit = 100;
  bool json = false;
};

// `waystone verify` (docs/verify.md).
struct VerifyCommandOptions {
  std::string definition;
  std::string input;  // JSON text or @file; "" = synthesized
  uint64_t seed = 1;
  int schedules = 0;  // 0: every boundary and outcome; N: N random ones
  std::string replay;
  bool json = false;
  int jobs = 16;
  std::string work_dir;  // "" = a temporary folder
  bool keep = false;
  std::vector<std::string> against;  // NAME=URL: that env's system is a team's sandbox
  std::string contract;              // a contract file: what cannot be inferred of the systems
  bool allow_uncovered = false;      // exit 0 though a branch or schedule was not reached
};

// The worker process `verify` runs for each schedule (not for people).
struct VerifyWorkerOptions {
  std::string definition;
  std::string input;
  std::string result;    // where the instance's end goes (JSON)
  std::string crash_at;  // "<point>:<step>"
  int crash_occurrence = 1;
  std::string event_source;
  std::string event_id;
  std::string relay_config;          // deliver the outbox with it once the instance rests
  bool observe_lookups = false;      // report what each step's lookup finds at the end
  bool operator_compensate = false;  // compensate the instance once it completed
};

struct SimOptions {
  std::string host = "127.0.0.1";
  int port = 8900;
  std::string faults;  // JSON text or @file
  uint64_t seed = 42;
};

int Run(const GlobalOptions& global, const RunOptions& options);
int Worker(const GlobalOptions& global, const WorkerOptions& options);
int Start(const GlobalOptions& global, const StartOptions& options);
int Status(const GlobalOptions& global, const StatusOptions& options);
int List(const GlobalOptions& global, const ListOptions& options);
struct TokenOptions {
  std::string tenant;
  std::string role;
  std::string name;     // unique
  std::string expires;  // a duration such as 90d; "" = until revoked
};

struct ServeOptions {
  std::string config;    // --config, WAYSTONE_CONFIG: settings below the flags
  std::string listen;    // --listen, WAYSTONE_LISTEN, config, 127.0.0.1:8080
  std::string tls_cert;  // --tls-cert, config tls.cert_file: serve HTTPS
  std::string tls_key;   // --tls-key, config tls.key_file
  bool api_only = false;
  bool workers_only = false;
  WorkerOptions worker;
  bool workers_given = false;        // --workers was on the command line
  bool max_in_flight_given = false;  // --max-in-flight was on the command line
  bool lease_given = false;          // --lease was on the command line
  bool step_key_retention_given = false;
};

struct GcOptions {
  std::string older_than = "30d";
  // Inbox claims and tombstones (the protection against late redeliveries) are kept
  // this long: longer than any upstream retries and as long as audits need.
  std::string keep_protection = "400d";
  bool dry_run = false;
};

// Commands over the HTTP API of a running server.
struct ApiOptions {
  std::string server;  // --server, WAYSTONE_SERVER, http://127.0.0.1:8080
  std::string tenant;  // for an all-tenants token
};

struct InstancesOptions {
  std::string state, workflow, error_class, alert, created_after, created_before, cursor;
  int limit = 50;
  bool json = false;
};

struct ShowOptions {
  std::string key;
  bool json = false;
};

// retry | confirm | compensate | skip | close
struct ActOptions {
  std::string action;
  std::string key;
  std::string step;
  std::string reason;
  bool happened = false;
  bool not_happened = false;
  std::string external_id;
  bool dry_run = false;
  bool json = false;
};

struct AlertsOptions {
  std::string state;
  bool json = false;
};

struct AckOptions {
  std::string id;  // the alert's public id, as the API shows it
  std::string reason;
  bool dry_run = false;
};

// waystone decide KEY --step S --approve|--reject --data-version V [--request N]
struct DecideOptions {
  std::string key;
  std::string step;
  bool approve = false;
  bool reject = false;
  std::string data_version;  // the version shown (a prefix of 8+ characters will do)
  int request = 0;           // 0: the request shown now
  std::string comment;
  bool json = false;
};

// waystone revise KEY --input JSON|@FILE --reason R
struct ReviseOptions {
  std::string key;
  std::string input;
  std::string reason;
  bool json = false;
};

int Decide(const ApiOptions& api, const DecideOptions& options);
int Revise(const ApiOptions& api, const ReviseOptions& options);
int Instances(const ApiOptions& api, const InstancesOptions& options);
int Show(const ApiOptions& api, const ShowOptions& options);
int Act(const ApiOptions& api, const ActOptions& options);
int Alerts(const ApiOptions& api, const AlertsOptions& options);
int Ack(const ApiOptions& api, const AckOptions& options);

// waystone targets | waystone target pause|resume NAME --reason R
struct TargetOptions {
  std::string name;
  std::string reason;
  bool json = false;
};
int Targets(const ApiOptions& api, bool json);
int ChangeTarget(const ApiOptions& api, const std::string& verb, const TargetOptions& options);

int Lint(const std::vector<std::string>& files);
int Gc(const GlobalOptions& global, const GcOptions& options);
int TokenCreate(const GlobalOptions& global, const TokenOptions& options);
int TokenList(const GlobalOptions& global, bool json);
int TokenRevoke(const GlobalOptions& global, const std::string& name);
int Serve(const GlobalOptions& global, const ServeOptions& options);
int Plan(const std::string& file);
int Sim(const SimOptions& options);
int Verify(const VerifyCommandOptions& options);
// Delivers until nothing waits on an enabled sink (retries included).
absl::Status DrainRelay(waystone::Relay& relay, waystone::Store& store, int64_t poll_interval,
                        std::stop_token stop);
int VerifyWorker(const GlobalOptions& global, const VerifyWorkerOptions& options);
int Relay(const GlobalOptions& global, const RelayOptions& options);

// Entry point: parses argv and runs the command.
int Main(int argc, char** argv);

}  // namespace waystone::cli
