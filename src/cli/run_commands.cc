#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/log.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "base/time_format.h"
#include "base/utf8.h"
#include "cli/common.h"
#include "cli/runtime.h"
#include "cli/signals.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/operate/batch_runner.h"
#include "engine/operate/operations.h"
#include "messaging/relay.h"
#include "model/duration.h"
#include "model/json_text.h"
#include "server/api_server.h"
#include "server/auth.h"
#include "server/metrics_server.h"
#include "server/server_config.h"
#include "store/lease_owners.h"

namespace waystone::cli {

using TenantPolicies = std::map<std::string, TenantPolicy>;
namespace {

// Long-running commands wait this long for an unreachable database at start.
constexpr Millis kStartPatience = 60'000;

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> OpenRuntime(const GlobalOptions& global, int workers,
                                                     Millis patience, int max_in_flight) {
  EngineOptions options;
  options.workers = workers;
  options.max_in_flight = max_in_flight;
  options.secrets_file = global.secrets_file;
  options.files_dir = global.files_dir;
  if (global.tenants) options.tenants = *global.tenants;
  // A worker or start without serve's config would render every tenant with the
  // process's secrets and skip the allow-list: the same config applies (read
  // before the database is waited for, so a mistake in it is told at once).
  const std::string config_path = ServerConfigPath(global);
  if (!global.tenants && !config_path.empty()) {
    WS_ASSIGN_OR_RETURN(ServerConfig config, LoadServerConfig(config_path));
    options.tenants = config.tenants;
    if (options.secrets_file.empty()) options.secrets_file = config.secrets_file;
  }
  auto runtime = std::make_unique<Runtime>();
  WS_ASSIGN_OR_RETURN(runtime->store, OpenStoreWaiting(global, patience));
  runtime->http = NewCurlHttpClient({});
  auto lease = ParseDuration(global.lease);
  if (!lease) return absl::InvalidArgumentError("--lease '" + global.lease + "' is not a duration");
  options.lease_duration = *lease;
  auto retention = ParseDuration(global.step_key_retention);
  if (!retention || *retention < 1000) {
    return absl::InvalidArgumentError("--step-key-retention '" + global.step_key_retention +
                                      "' is not a duration of at least 1s");
  }
  options.idempotency_retention = *retention;
  WS_ASSIGN_OR_RETURN(runtime->engine,
                      Engine::Create(runtime->store.get(), runtime->http.get(), SystemClock::Get(),
                                     &runtime->random, options));
  return runtime;
}

absl::Status EventConflict(const StartRequest& request, const StartResult& started) {
  return absl::FailedPreconditionError(InboxConflictMessage(request.event_source, request.event_id,
                                                            started.stored_data_hash,
                                                            EventDataHash(request.input_json)));
}

namespace {

const char* OutcomeText(StartOutcome outcome) {
  switch (outcome) {
    case StartOutcome::kCreated:
      return "started";
    case StartOutcome::kExisting:
      return "exists";
    case StartOutcome::kDuplicateEvent:
      return "duplicate event";
    case StartOutcome::kEventConflict:
      return "conflicting event";
    case StartOutcome::kCollected:
      return "collected";
  }
  return "?";
}

}  // namespace

int Run(const GlobalOptions& global, const RunOptions& options) {
  std::stop_token stop = StopOnSignals();
  auto definition = LoadDefinitionFile(options.definition);
  if (!definition.ok()) return Fail(definition.status());
  auto input = TextOrFile(options.input, kMaxInputBytes);
  if (!input.ok()) return Fail(input.status());
  auto runtime = OpenRuntime(global, 1, 0);
  if (!runtime.ok()) return Fail(runtime.status());
  Runtime& rt = **runtime;
  StartRequest request{global.tenant, *input, options.event_source, options.event_id};
  auto started = rt.engine->StartInstance(*definition, request);
  if (!started.ok()) return Fail(started.status());
  if (started->outcome == StartOutcome::kEventConflict) {
    return Fail(EventConflict(request, *started));
  }
  std::fprintf(stderr, "waystone: %s instance %s\n", OutcomeText(started->outcome),
               started->instance.key.c_str());
  if (started->tombstone || started->instance.key.empty()) {
    // Removed by gc (only its tombstone is left): nothing to run again.
    std::printf("%s\t%s\n", started->instance.key.c_str(),
                std::string(ToString(started->instance.state)).c_str());
    return started->instance.state == InstanceState::kCompleted ? kExitOk : kExitNotCompleted;
  }
  auto state = rt.engine->RunUntilRest(started->instance.id, stop);
  if (!state.ok()) return Fail(state.status());
  auto record = rt.store->GetInstance(started->instance.id);
  if (!record.ok()) return Fail(record.status());
  if (auto printed = PrintInstance(*rt.store, *record, false); !printed.ok()) return Fail(printed);
  return *state == InstanceState::kCompleted ? kExitOk : kExitNotCompleted;
}

int Start(const GlobalOptions& global, const StartOptions& options) {
  auto definition = LoadDefinitionFile(options.definition);
  if (!definition.ok()) return Fail(definition.status());
  std::vector<std::string> inputs;
  if (!options.inputs_file.empty()) {
    std::ifstream file(options.inputs_file);
    if (!file) return Fail(absl::NotFoundError(options.inputs_file + ": cannot be read"));
    std::string line;
    while (std::getline(file, line)) {
      if (!line.empty()) inputs.push_back(line);
    }
  } else if (!options.input.empty()) {
    auto input = TextOrFile(options.input, kMaxInputBytes);
    if (!input.ok()) return Fail(input.status());
    inputs.push_back(*input);
  } else {
    return Fail(absl::InvalidArgumentError("give --input or --inputs"));
  }
  auto runtime = OpenRuntime(global, 1, 0);
  if (!runtime.ok()) return Fail(runtime.status());
  int line = 0;
  for (const std::string& input : inputs) {
    ++line;
    StartRequest request{global.tenant, input, options.event_source, options.event_id};
    auto started = (*runtime)->engine->StartInstance(*definition, request);
    if (started.ok() && started->outcome == StartOutcome::kEventConflict) {
      started = EventConflict(request, *started);
    }
    if (!started.ok()) {
      const std::string where = options.inputs_file.empty()
                                    ? ""
                                    : options.inputs_file + ":" + std::to_string(line) + ": ";
      return Fail(
          absl::Status(started.status().code(), where + std::string(started.status().message())));
    }
    std::printf("%s\t%s\t%s\n", OutcomeText(started->outcome), started->instance.key.c_str(),
                std::string(ToString(started->instance.state)).c_str());
  }
  return kExitOk;
}

namespace {

// Each call under way holds a socket: takes the whole open-file allowance the
// system grants, and says so when `max_in_flight` calls would not fit in it.
void RaiseOpenFileLimit(int max_in_flight) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return;
  if (files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
  }
  if (files.rlim_cur != RLIM_INFINITY &&
      files.rlim_cur < static_cast<rlim_t>(max_in_flight) + 256) {
    Log(LogLevel::kWarning, "open files are limited to " + std::to_string(files.rlim_cur) +
                                ", fewer than max_in_flight " + std::to_string(max_in_flight) +
                                " calls need (raise `ulimit -n` or lower --max-in-flight)");
  }
}

// Runs workers (unless `api` only), and the API when `listen` is not empty, until a
// stop signal; then drains.
int RunService(const GlobalOptions& global, const WorkerOptions& options, const std::string& listen,
               bool run_workers, ApiServerOptions api_options = {},
               const std::string& config_path = "") {
  std::stop_token stop = StopOnSignals();
  std::vector<WorkflowDefinition> definitions;
  if (!options.definitions_dir.empty()) {
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(options.definitions_dir, ec)) {
      const auto ext = entry.path().extension();
      if (ext == ".yaml" || ext == ".yml" || ext == ".json") files.push_back(entry.path());
    }
    if (ec) return Fail(absl::NotFoundError(options.definitions_dir + ": " + ec.message()));
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      auto definition = LoadDefinitionFile(file.string());
      if (!definition.ok()) return Fail(definition.status());
      definitions.push_back(std::move(*definition));
    }
  }
  std::optional<RelayConfig> relay_config;
  if (!options.relay_config.empty()) {
    auto loaded = LoadRelayConfig(options.relay_config);
    if (!loaded.ok()) return Fail(loaded.status());
    relay_config = *loaded;
    if (auto status = CheckRelayTenants(global, *relay_config); !status.ok()) return Fail(status);
  }
  auto runtime = OpenRuntime(global, options.workers, kStartPatience, options.max_in_flight);
  if (!runtime.ok()) return Fail(runtime.status());
  Engine& engine = *(*runtime)->engine;
  std::unique_ptr<waystone::Relay> relay;
  if (relay_config) {
    auto created =
        waystone::Relay::Create((*runtime)->store.get(), (*runtime)->http.get(), SystemClock::Get(),
                                &(*runtime)->random, *relay_config, engine.owner() + "/relay");
    if (!created.ok()) return Fail(created.status());
    relay = std::move(*created);
  }
  for (const auto& definition : definitions) {
    if (auto status = engine.Register(definition); !status.ok()) return Fail(status);
  }
  for (const auto& [tenant, policy] : global.tenants.value_or(TenantPolicies())) {
    for (const std::string& workflow : policy.workflows) {
      if (engine.catalog().Current(workflow) != nullptr) continue;
      auto line = global.tenant_lines.find(tenant);
      return Fail(absl::InvalidArgumentError(
          config_path + ":" + std::to_string(line == global.tenant_lines.end() ? 0 : line->second) +
          ": tenant '" + tenant + "' may start workflow '" + workflow +
          "', which is not among the definitions"));
    }
  }
  if (!listen.empty() && global.tenants.value_or(TenantPolicies()).empty()) {
    Log(LogLevel::kWarning,
        "no tenants: in the config: every tenant may start every workflow "
        "and renders this process's secrets (docs/operations.md#tenants)");
  }
  for (const EventRoute& route : api_options.events) {
    if (!route.start.empty() && engine.catalog().Current(route.start) == nullptr) {
      return Fail(absl::InvalidArgumentError(
          config_path + ":" + std::to_string(route.line) + ": event type '" + route.type +
          "' starts workflow '" + route.start + "', which is not among the definitions" +
          (options.definitions_dir.empty() ? " (no --definitions given)" : "")));
    }
  }
  std::unique_ptr<ApiServer> api;
  if (!listen.empty()) {
    api_options.listen = listen;
    auto started =
        ApiServer::Start(api_options, (*runtime)->store.get(), SystemClock::Get(), &engine);
    if (!started.ok()) return Fail(started.status());
    api = std::move(*started);
    std::printf("api on %s://127.0.0.1:%d\n", api_options.tls_cert_file.empty() ? "http" : "https",
                api->port());
    std::fflush(stdout);
  }
  std::unique_ptr<MetricsServer> metrics;
  if (!options.metrics_listen.empty()) {
    auto started = MetricsServer::Start(options.metrics_listen, (*runtime)->store.get(),
                                        SystemClock::Get(), &engine.call_metrics());
    if (!started.ok()) return Fail(started.status());
    metrics = std::move(*started);
  }
  if (run_workers) {
    RaiseOpenFileLimit(options.max_in_flight);
    std::fprintf(stderr, "waystone: worker %s running with %d threads on %s\n",
                 engine.owner().c_str(), options.workers, DatabasePath(global).c_str());
    engine.Start();
    if (relay) relay->Start();
  }
  // Batches created through any server's API on this store are applied by the
  // processes that run workers (serve, and worker beside an --api-only serve).
  std::unique_ptr<BatchRunner> batches;
  if (run_workers) {
    batches = std::make_unique<BatchRunner>((*runtime)->store.get(), (*runtime)->store.get(),
                                            &engine.operations(), SystemClock::Get(),
                                            engine.owner() + "/batches");
    batches->Start();
  }
  while (!stop.stop_requested()) {
    SystemClock::Get()->SleepFor(200, stop);
    if (options.exit_when_idle) {
      auto idle = engine.Idle();
      if (idle.ok() && *idle) break;
    }
  }
  std::fprintf(stderr, "waystone: worker draining\n");
  api.reset();  // no new requests
  if (batches) batches->Stop();
  engine.Stop();
  if (relay) relay->Stop();
  std::fprintf(stderr, "waystone: worker stopped\n");
  return kExitOk;
}

}  // namespace

int Worker(const GlobalOptions& global, const WorkerOptions& options) {
  return RunService(global, options, "", true);
}

int Serve(const GlobalOptions& global_flags, const ServeOptions& flags) {
  // Flags win over environment variables, which win over the config file.
  GlobalOptions global = global_flags;
  ServeOptions options = flags;
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value == nullptr ? "" : value;
  };
  const std::string config_path = options.config.empty() ? env("WAYSTONE_CONFIG") : options.config;
  ServerConfig config;
  if (!config_path.empty()) {
    auto loaded = LoadServerConfig(config_path);
    if (!loaded.ok()) return Fail(loaded.status());
    config = *loaded;
  }
  if (global.db.empty() && env("WAYSTONE_DB").empty()) global.db = config.database;
  if (options.listen.empty()) options.listen = env("WAYSTONE_LISTEN");
  if (options.listen.empty()) options.listen = config.listen;
  if (options.listen.empty()) options.listen = "127.0.0.1:8080";
  if (!options.workers_given && config.workers > 0) options.worker.workers = config.workers;
  if (!options.max_in_flight_given && config.max_in_flight > 0) {
    options.worker.max_in_flight = config.max_in_flight;
  }
  if (!options.lease_given && !config.lease.empty()) global.lease = config.lease;
  if (!options.step_key_retention_given && !config.step_key_retention.empty()) {
    global.step_key_retention = config.step_key_retention;
  }
  if (options.worker.definitions_dir.empty()) options.worker.definitions_dir = config.definitions;
  if (options.worker.relay_config.empty()) options.worker.relay_config = config.relay_config;
  if (options.worker.metrics_listen.empty()) options.worker.metrics_listen = config.metrics_listen;
  if (global.secrets_file.empty()) global.secrets_file = config.secrets_file;
  if (global.files_dir.empty()) global.files_dir = config.files_dir;
  ApiServerOptions api;
  api.max_body_bytes = config.max_body_bytes;
  api.read_timeout_seconds = config.read_timeout_seconds;
  api.idempotency_retention = config.idempotency_retention;
  api.events = config.events;
  api.permissions = config.permissions;
  api.groups = config.groups;
  api.tls_cert_file = options.tls_cert.empty() ? config.tls_cert_file : options.tls_cert;
  api.tls_key_file = options.tls_key.empty() ? config.tls_key_file : options.tls_key;
  api.hsts_max_age = config.tls_hsts_max_age;
  api.tenants = config.tenants;
  api.max_connections = config.max_connections;
  api.max_connections_per_client = config.max_connections_per_client;
  api.handler_threads = config.handler_threads;
  global.tenants = config.tenants;
  global.tenant_lines = config.tenant_lines;
  return RunService(global, options.worker, options.workers_only ? "" : options.listen,
                    !options.api_only, api, config_path);
}

int TokenCreate(const GlobalOptions& global, const TokenOptions& options) {
  auto role = ParseRole(options.role);
  if (!role) {
    return Fail(absl::InvalidArgumentError("--role '" + options.role +
                                           "' is not one of viewer, operator, admin"));
  }
  const Millis now = SystemClock::Get()->NowMillis();
  Millis expires_at = 0;
  if (!options.expires.empty()) {
    auto valid_for = ParseDuration(options.expires);
    if (!valid_for || *valid_for < 1000) {
      return Fail(absl::InvalidArgumentError("--expires '" + options.expires +
                                             "' is not a duration of at least 1s, such as 90d"));
    }
    expires_at = now + *valid_for;
  }
  auto store = OpenStoreFor(global);
  if (!store.ok()) return Fail(store.status());
  auto token = CreateToken(**store, options.name, options.tenant, *role, now, expires_at);
  if (!token.ok()) return Fail(token.status());
  std::printf("%s\n", token->c_str());
  std::fprintf(stderr, "waystone: token '%s' for tenant %s, role %s%s; it is not shown again\n",
               options.name.c_str(), options.tenant.c_str(), options.role.c_str(),
               expires_at ? (", expires " + FormatRfc3339(expires_at)).c_str() : "");
  return kExitOk;
}

int TokenList(const GlobalOptions& global, bool json) {
  auto store = OpenStoreFor(global);
  if (!store.ok()) return Fail(store.status());
  auto tokens = (*store)->ListTokens();
  if (!tokens.ok()) return Fail(tokens.status());
  const Millis now = SystemClock::Get()->NowMillis();
  auto state = [now](const TokenRecord& t) {
    if (t.revoked_at != 0) return "revoked";
    if (t.expires_at != 0 && t.expires_at <= now) return "expired";
    return "active";
  };
  auto when = [](Millis at) { return at == 0 ? std::string("-") : FormatRfc3339(at); };
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const TokenRecord& t : *tokens) {
      out.push_back({{"name", t.name},
                     {"id", t.token_hash.substr(0, 12)},
                     {"tenant", t.tenant},
                     {"role", t.role},
                     {"state", state(t)},
                     {"created_at", when(t.created_at)},
                     {"expires_at", when(t.expires_at)},
                     {"revoked_at", when(t.revoked_at)}});
    }
    std::printf("%s\n", JsonText(out, 2).c_str());
    return kExitOk;
  }
  // ID: the start of the token's SHA-256 (never the token): tells tokens apart.
  std::printf("%-24s %-12s %-16s %-9s %-8s %-24s %s\n", "NAME", "ID", "TENANT", "ROLE", "STATE",
              "CREATED", "EXPIRES");
  for (const TokenRecord& t : *tokens) {
    std::printf("%-24s %-12s %-16s %-9s %-8s %-24s %s\n", Printable(t.name).c_str(),
                t.token_hash.substr(0, 12).c_str(), t.tenant.c_str(), t.role.c_str(), state(t),
                when(t.created_at).c_str(), when(t.expires_at).c_str());
  }
  return kExitOk;
}

int TokenRevoke(const GlobalOptions& global, const std::string& name) {
  auto store = OpenStoreFor(global);
  if (!store.ok()) return Fail(store.status());
  AuditRecord audit;
  audit.at = SystemClock::Get()->NowMillis();
  audit.actor = "waystone token revoke";
  audit.action = "revoke_token";
  audit.detail_json = nlohmann::json{{"token", name}}.dump();
  if (auto tokens = (*store)->ListTokens(); tokens.ok()) {
    for (const TokenRecord& t : *tokens) {
      if (t.name == name) audit.tenant = t.tenant;
    }
  }
  if (auto revoked = (*store)->RevokeToken(name, audit); !revoked.ok()) {
    return Fail(revoked);
  }
  std::fprintf(stderr, "waystone: token '%s' revoked; it is refused from now on\n", name.c_str());
  return kExitOk;
}

}  // namespace waystone::cli
