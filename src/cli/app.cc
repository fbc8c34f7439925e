#include <CLI/CLI.hpp>

#include "base/log.h"
#include "cli/commands.h"

namespace waystone::cli {

int Main(int argc, char** argv) {
  CLI::App app{"waystone: durable workflows for enterprise integrations"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");
  GlobalOptions global;
  auto add_global = [&](CLI::App* sub) {
    sub->add_option("--db", global.db, "SQLite database file (default $WAYSTONE_DB or ./waystone.db)");
    sub->add_option("--tenant", global.tenant, "Tenant of the instances")->capture_default_str();
    sub->add_flag("-v,--verbose", global.verbose, "Log what the engine does");
  };
  auto add_engine = [&](CLI::App* sub) {
    sub->add_option("--secrets", global.secrets_file, "File of NAME=value secrets for {{secret.NAME}}");
    sub->add_option("--lease", global.lease, "Lease duration, e.g. 30s")->capture_default_str();
  };

  RunOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Start or resume one instance and drive it until it rests");
  run_cmd->add_option("definition", run.definition, "Workflow definition (YAML or JSON)")->required();
  run_cmd->add_option("--input", run.input, "Input JSON object, or @file")->required();
  run_cmd->add_option("--event-source", run.event_source, "Source of the event that starts it");
  run_cmd->add_option("--event-id", run.event_id, "Id of that event (claimed once)");
  add_global(run_cmd);
  add_engine(run_cmd);

  WorkerOptions worker;
  CLI::App* worker_cmd = app.add_subcommand("worker", "Run instances until SIGTERM (drains gracefully)");
  worker_cmd->add_option("--definitions", worker.definitions_dir, "Folder of definitions to register");
  worker_cmd->add_option("--workers", worker.workers, "Worker threads")->capture_default_str();
  worker_cmd->add_flag("--exit-when-idle", worker.exit_when_idle,
                       "Exit once no instance is runnable now or later");
  worker_cmd->add_option("--relay-config", worker.relay_config,
                         "Also deliver outbox events with this relay config");
  add_global(worker_cmd);
  add_engine(worker_cmd);

  StartOptions start;
  CLI::App* start_cmd = app.add_subcommand("start", "Start instances without running them");
  start_cmd->add_option("definition", start.definition, "Workflow definition")->required();
  auto* input_opt = start_cmd->add_option("--input", start.input, "Input JSON object, or @file");
  auto* inputs_opt = start_cmd->add_option("--inputs", start.inputs_file,
                                           "File with one input JSON object per line");
  input_opt->excludes(inputs_opt);
  start_cmd->add_option("--event-source", start.event_source, "Source of the starting event");
  start_cmd->add_option("--event-id", start.event_id, "Id of the starting event (claimed once)");
  add_global(start_cmd);
  add_engine(start_cmd);

  StatusOptions status;
  CLI::App* status_cmd = app.add_subcommand("status", "Show one instance, or a summary of all");
  status_cmd->add_option("key", status.key, "Business key of the instance");
  status_cmd->add_flag("--json", status.json, "Print JSON");
  status_cmd->add_option("--sim", status.sim_url, "Add the counts of the simulator at this URL");
  add_global(status_cmd);

  ListOptions list;
  CLI::App* list_cmd = app.add_subcommand("list", "List instances");
  list_cmd->add_option("--state", list.state, "Only instances in this state");
  list_cmd->add_option("--workflow", list.workflow, "Only instances of this workflow");
  list_cmd->add_option("--limit", list.limit, "At most this many")->capture_default_str();
  list_cmd->add_flag("--json", list.json, "Print JSON");
  add_global(list_cmd);

  TokenOptions token;
  CLI::App* token_cmd = app.add_subcommand("token", "Manage API tokens");
  CLI::App* token_create = token_cmd->add_subcommand("create", "Create a token (shown once)");
  token_cmd->require_subcommand(1);
  token_create->add_option("--tenant", token.tenant, "Tenant, or '*' for all")->required();
  token_create->add_option("--role", token.role, "viewer, operator or admin")->required();
  token_create->add_option("--name", token.name, "A name for the audit trail")->capture_default_str();
  token_create->add_option("--db", global.db, "Database (default $WAYSTONE_DB or ./waystone.db)");

  ServeOptions serve;
  CLI::App* serve_cmd = app.add_subcommand("serve", "Serve the HTTP API and run workers");
  serve_cmd->add_option("--listen", serve.listen, "host:port of the API")->capture_default_str();
  auto* api_only = serve_cmd->add_flag("--api-only", serve.api_only, "Serve the API, run no workers");
  auto* workers_only = serve_cmd->add_flag("--workers-only", serve.workers_only, "Run workers, serve no API");
  api_only->excludes(workers_only);
  serve_cmd->add_option("--definitions", serve.worker.definitions_dir, "Folder of definitions to register");
  serve_cmd->add_option("--workers", serve.worker.workers, "Worker threads")->capture_default_str();
  serve_cmd->add_option("--relay-config", serve.worker.relay_config, "Also deliver outbox events");
  add_global(serve_cmd);
  add_engine(serve_cmd);

  GcOptions gc;
  CLI::App* gc_cmd = app.add_subcommand(
      "gc", "Remove finished instances whose events are delivered, and expired idempotency keys");
  gc_cmd->add_option("--older-than", gc.older_than, "Finished before this long ago (30d, 12h)")
      ->capture_default_str();
  gc_cmd->add_flag("--dry-run", gc.dry_run, "Only count what would be removed");
  add_global(gc_cmd);

  std::vector<std::string> lint_files;
  CLI::App* lint_cmd = app.add_subcommand("lint", "Validate definitions");
  lint_cmd->add_option("files", lint_files, "Definition files")->required();

  std::string plan_file;
  CLI::App* plan_cmd = app.add_subcommand("plan", "Print the recovery plan of a definition");
  plan_cmd->add_option("file", plan_file, "Definition file")->required();

  RelayOptions relay;
  CLI::App* relay_cmd = app.add_subcommand("relay", "Deliver outbox events to webhooks and NATS");
  relay_cmd->add_option("--config", relay.config, "Relay config (YAML)")->required();
  relay_cmd->add_option("--enable-sink", relay.enable_sink,
                        "Re-enable a sink that was disabled after HTTP 410, then exit");
  relay_cmd->add_flag("--until-drained", relay.until_drained,
                      "Exit once nothing is left to deliver now");
  relay_cmd->add_option("--metrics-listen", relay.metrics_listen,
                        "Serve Prometheus /metrics on host:port (port 0 picks one)");
  add_global(relay_cmd);

  SimOptions sim;
  CLI::App* sim_cmd = app.add_subcommand("sim", "Serve simulated CRM/ERP/LINE/email endpoints");
  sim_cmd->add_option("--host", sim.host, "Address to listen on")->capture_default_str();
  sim_cmd->add_option("--port", sim.port, "Port (0 picks one)")->capture_default_str();
  sim_cmd->add_option("--faults", sim.faults, "Fault knobs as JSON, or @file");
  sim_cmd->add_option("--seed", sim.seed, "Seed for probabilistic faults")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  if (global.verbose) SetLogThreshold(LogLevel::kInfo);

  if (*run_cmd) return Run(global, run);
  if (*worker_cmd) return Worker(global, worker);
  if (*start_cmd) return Start(global, start);
  if (*status_cmd) return Status(global, status);
  if (*list_cmd) return List(global, list);
  if (*lint_cmd) return Lint(lint_files);
  if (*gc_cmd) return Gc(global, gc);
  if (*token_create) return TokenCreate(global, token);
  if (*serve_cmd) return Serve(global, serve);
  if (*plan_cmd) return Plan(plan_file);
  if (*sim_cmd) return Sim(sim);
  if (*relay_cmd) return Relay(global, relay);
  return kExitUsage;
}

}  // namespace waystone::cli
