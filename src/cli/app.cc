#include <map>

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
    sub->add_option("--db", global.db,
                    "SQLite database file (default $WAYSTONE_DB or ./waystone.db)");
    sub->add_option("--tenant", global.tenant, "Tenant of the instances")->capture_default_str();
    sub->add_flag("-v,--verbose", global.verbose, "Log what the engine does");
  };
  auto add_engine = [&](CLI::App* sub) {
    sub->add_option("--secrets", global.secrets_file,
                    "File of NAME=value secrets for {{secret.NAME}}");
    sub->add_option("--files", global.files_dir,
                    "Folder whose files uploads may send: each tenant's in DIR/<tenant>/ (a "
                    "request's path: is relative to it)");
    sub->add_option("--lease", global.lease, "Lease duration, e.g. 30s")->capture_default_str();
    sub->add_option("--step-key-retention", global.step_key_retention,
                    "How long a step's idempotency key stays pinned to its request (a workflow's "
                    "retention.step_keys wins)")
        ->capture_default_str();
    sub->add_option("--attempts-per-step", global.attempts_per_step,
                    "Attempt records kept per step (the oldest go; the counts stay)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1'000'000));
  };

  RunOptions run;
  CLI::App* run_cmd =
      app.add_subcommand("run", "Start or resume one instance and drive it until it rests");
  run_cmd->add_option("definition", run.definition, "Workflow definition (YAML or JSON)")
      ->required();
  run_cmd->add_option("--input", run.input, "Input JSON object, or @file")->required();
  run_cmd->add_option("--event-source", run.event_source, "Source of the event that starts it");
  run_cmd->add_option("--event-id", run.event_id, "Id of that event (claimed once)");
  add_global(run_cmd);
  add_engine(run_cmd);
  auto add_tenants = [&](CLI::App* sub) {
    sub->add_option("--config", global.config,
                    "Server config whose tenants: apply here too (default $WAYSTONE_CONFIG)");
  };
  add_tenants(run_cmd);

  WorkerOptions worker;
  CLI::App* worker_cmd =
      app.add_subcommand("worker", "Run instances until SIGTERM (drains gracefully)");
  worker_cmd->add_option("--definitions", worker.definitions_dir,
                         "Folder of definitions to register");
  worker_cmd->add_option("--workers", worker.workers, "Worker threads")->capture_default_str();
  worker_cmd
      ->add_option("--max-in-flight", worker.max_in_flight,
                   "Most instances held at once, those waiting on a call included")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  worker_cmd->add_flag("--exit-when-idle", worker.exit_when_idle,
                       "Exit once no instance is runnable now or later");
  worker_cmd->add_option("--relay-config", worker.relay_config,
                         "Also deliver outbox events with this relay config");
  add_global(worker_cmd);
  add_engine(worker_cmd);
  add_tenants(worker_cmd);

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
  add_tenants(start_cmd);

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
  token_create->add_option("--tenant", token.tenant, "Tenant, or '*' for all (admin only)")
      ->required();
  token_create->add_option("--role", token.role, "viewer, operator or admin")->required();
  token_create->add_option("--name", token.name, "A unique name, shown in the audit trail")
      ->required();
  token_create->add_option("--expires", token.expires,
                           "Valid for this long (e.g. 90d, 12h); default until revoked");
  token_create->add_option("--db", global.db, "Database (default $WAYSTONE_DB or ./waystone.db)");
  bool token_list_json = false;
  CLI::App* token_list = token_cmd->add_subcommand("list", "List tokens (never their secrets)");
  token_list->add_flag("--json", token_list_json, "Print JSON");
  token_list->add_option("--db", global.db, "Database (default $WAYSTONE_DB or ./waystone.db)");
  std::string revoke_name;
  CLI::App* token_revoke = token_cmd->add_subcommand("revoke", "Revoke a token by name, at once");
  token_revoke->add_option("--name", revoke_name, "The token's name")->required();
  token_revoke->add_option("--db", global.db, "Database (default $WAYSTONE_DB or ./waystone.db)");

  ServeOptions serve;
  CLI::App* serve_cmd = app.add_subcommand("serve", "Serve the HTTP API and run workers");
  serve_cmd->add_option("--config", serve.config, "Server config (YAML; default $WAYSTONE_CONFIG)");
  serve_cmd->add_option("--listen", serve.listen,
                        "host:port of the API (default $WAYSTONE_LISTEN, config, 127.0.0.1:8080)");
  serve_cmd->add_option(
      "--tls-cert", serve.tls_cert,
      "PEM certificate (chain) file: serve HTTPS (with --tls-key; default config tls)");
  serve_cmd->add_option("--tls-key", serve.tls_key, "PEM private key file of --tls-cert");
  auto* api_only =
      serve_cmd->add_flag("--api-only", serve.api_only, "Serve the API, run no workers");
  auto* workers_only =
      serve_cmd->add_flag("--workers-only", serve.workers_only, "Run workers, serve no API");
  api_only->excludes(workers_only);
  serve_cmd->add_option("--definitions", serve.worker.definitions_dir,
                        "Folder of definitions to register");
  auto* serve_workers = serve_cmd->add_option("--workers", serve.worker.workers, "Worker threads")
                            ->capture_default_str();
  auto* serve_in_flight =
      serve_cmd
          ->add_option("--max-in-flight", serve.worker.max_in_flight,
                       "Most instances held at once, those waiting on a call included")
          ->capture_default_str()
          ->check(CLI::Range(1, 1'000'000));
  serve_cmd->add_option("--relay-config", serve.worker.relay_config, "Also deliver outbox events");
  serve_cmd->add_option("--metrics-listen", serve.worker.metrics_listen,
                        "host:port of /metrics without a token, for scrapers (internal address)");
  add_global(serve_cmd);
  add_engine(serve_cmd);

  ApiOptions api;
  auto add_api = [&](CLI::App* sub) {
    sub->add_option("--server", api.server,
                    "API base URL (default $WAYSTONE_SERVER or http://127.0.0.1:8080)");
    sub->add_option("--tenant", api.tenant, "Tenant, for a token of all tenants");
  };
  InstancesOptions instances;
  CLI::App* instances_cmd = app.add_subcommand("instances", "List instances (over the API)");
  instances_cmd->add_option("--state", instances.state, "Only this state");
  instances_cmd->add_option("--workflow", instances.workflow, "Only this workflow");
  instances_cmd->add_option("--error-class", instances.error_class,
                            "Only with a step whose last error is transient, rejected or unknown");
  instances_cmd->add_option("--alert", instances.alert, "Only with an open alert: any or a kind");
  instances_cmd->add_option("--created-after", instances.created_after, "RFC 3339 time");
  instances_cmd->add_option("--created-before", instances.created_before, "RFC 3339 time");
  instances_cmd->add_option("--limit", instances.limit, "Page size")->capture_default_str();
  instances_cmd->add_option("--cursor", instances.cursor, "Next page, as printed");
  instances_cmd->add_flag("--json", instances.json, "Print JSON");
  add_api(instances_cmd);

  ShowOptions show;
  CLI::App* show_cmd = app.add_subcommand("show", "Show one instance in full (over the API)");
  show_cmd->add_option("key", show.key, "Business key")->required();
  show_cmd->add_flag("--json", show.json, "Print JSON");
  add_api(show_cmd);

  ActOptions act;
  std::vector<CLI::App*> act_cmds;
  for (const char* action : {"retry", "confirm", "compensate", "skip", "close"}) {
    static const std::map<std::string, std::string> kHelp = {
        {"retry", "Retry the step an instance stopped at, now"},
        {"confirm", "Confirm whether an unknown step's call happened"},
        {"compensate", "Undo an instance's completed steps"},
        {"skip", "Skip a manual step"},
        {"close", "Close the case"}};
    CLI::App* cmd = app.add_subcommand(action, kHelp.at(action) + " (over the API)");
    cmd->add_option("key", act.key, "Business key")->required();
    cmd->add_option("--reason", act.reason, "Why (kept in the audit trail)")->required();
    if (std::string(action) == "retry" || std::string(action) == "confirm" ||
        std::string(action) == "skip") {
      cmd->add_option("--step", act.step, "Step name")->required();
    }
    if (std::string(action) == "confirm") {
      auto* yes = cmd->add_flag("--happened", act.happened, "The call took effect");
      auto* no = cmd->add_flag("--not-happened", act.not_happened, "The call did not take effect");
      yes->excludes(no);
      cmd->add_option("--external-id", act.external_id, "With --happened: the id it created");
    }
    cmd->add_flag("--dry-run", act.dry_run, "Show what would happen; change nothing");
    cmd->add_flag("--json", act.json, "Print JSON");
    add_api(cmd);
    act_cmds.push_back(cmd);
  }

  DecideOptions decide;
  CLI::App* decide_cmd =
      app.add_subcommand("decide", "Approve or reject an approval step's request (over the API)");
  decide_cmd->add_option("key", decide.key, "Business key")->required();
  decide_cmd->add_option("--step", decide.step, "The approval step")->required();
  auto* approve = decide_cmd->add_flag("--approve", decide.approve, "Approve");
  auto* reject = decide_cmd->add_flag("--reject", decide.reject, "Reject");
  approve->excludes(reject);
  decide_cmd
      ->add_option("--data-version", decide.data_version,
                   "The data version you decide on (waystone show prints it)")
      ->required();
  decide_cmd->add_option("--request", decide.request,
                         "The request's number (default: the open one)");
  decide_cmd->add_option("--comment", decide.comment, "Why (kept with the decision)");
  decide_cmd->add_flag("--json", decide.json, "Print JSON");
  add_api(decide_cmd);

  ReviseOptions revise;
  CLI::App* revise_cmd = app.add_subcommand("revise", "Revise an instance's input (over the API)");
  revise_cmd->add_option("key", revise.key, "Business key")->required();
  revise_cmd->add_option("--input", revise.input, "The new input: JSON, or @FILE")->required();
  revise_cmd->add_option("--reason", revise.reason, "Why (kept in the audit trail)")->required();
  revise_cmd->add_flag("--json", revise.json, "Print JSON");
  add_api(revise_cmd);

  AlertsOptions alerts;
  CLI::App* alerts_cmd = app.add_subcommand("alerts", "List alerts (over the API)");
  alerts_cmd->add_option("--state", alerts.state, "open, acknowledged or resolved");
  alerts_cmd->add_flag("--json", alerts.json, "Print JSON");
  add_api(alerts_cmd);

  AckOptions ack;
  CLI::App* ack_cmd = app.add_subcommand("ack", "Acknowledge an alert (over the API)");
  ack_cmd->add_option("id", ack.id, "Alert id")->required();
  ack_cmd->add_option("--reason", ack.reason, "Why")->required();
  ack_cmd->add_flag("--dry-run", ack.dry_run, "Check only");
  add_api(ack_cmd);

  bool targets_json = false;
  CLI::App* targets_cmd = app.add_subcommand(
      "targets", "List the targets, their limits, pauses and circuits (over the API)");
  targets_cmd->add_flag("--json", targets_json, "Print JSON");
  add_api(targets_cmd);
  TargetOptions target;
  CLI::App* target_cmd =
      app.add_subcommand("target", "Pause or resume every call to a target (over the API)");
  target_cmd->require_subcommand(1);
  std::map<std::string, CLI::App*> target_verbs;
  for (const char* verb : {"pause", "resume"}) {
    CLI::App* cmd = target_cmd->add_subcommand(
        verb, std::string(verb) == "pause"
                  ? "Stop every call to the target, from every worker, until resumed"
                  : "Let calls to the target go again");
    cmd->add_option("name", target.name, "Target name (the definitions' targets:)")->required();
    cmd->add_option("--reason", target.reason, "Why (kept in the audit trail)")->required();
    cmd->add_flag("--json", target.json, "Print JSON");
    add_api(cmd);
    target_verbs[verb] = cmd;
  }

  GcOptions gc;
  CLI::App* gc_cmd = app.add_subcommand(
      "gc", "Remove finished instances whose events are delivered, and expired idempotency keys");
  gc_cmd->add_option("--older-than", gc.older_than, "Finished before this long ago (30d, 12h)")
      ->capture_default_str();
  gc_cmd->add_flag("--dry-run", gc.dry_run, "Only count what would be removed");
  gc_cmd->add_option("--keep-protection", gc.keep_protection,
                     "Keep inbox claims and tombstones of removed instances this long (default "
                     "400d; must exceed the longest upstream redelivery period)");
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

  VerifyCommandOptions verify;
  CLI::App* verify_cmd = app.add_subcommand(
      "verify",
      "Prove a definition recovers: every boundary and outcome against simulated targets");
  verify_cmd->add_option("definition", verify.definition, "Workflow definition")->required();
  verify_cmd->add_option("--input", verify.input,
                         "Input JSON object, or @file (default: synthesized)");
  verify_cmd->add_option("--seed", verify.seed, "Seed of the random schedules")
      ->capture_default_str();
  verify_cmd
      ->add_option("--schedules", verify.schedules,
                   "Run this many random schedules instead of every boundary and outcome")
      ->check(CLI::Range(0, 10'000'000));
  verify_cmd->add_option("--replay", verify.replay, "Run exactly this schedule (a failure's spec)");
  verify_cmd->add_flag("--json", verify.json, "Print the report as JSON");
  verify_cmd->add_option("--jobs", verify.jobs, "Schedules run at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  verify_cmd->add_option("--work-dir", verify.work_dir, "Folder for the schedules' databases");
  verify_cmd->add_flag("--keep", verify.keep, "Keep every schedule's database and worker log");
  verify_cmd->add_option("--against", verify.against,
                         "NAME=URL: send {{env.NAME}}'s requests to this sandbox through a "
                         "fault-injecting proxy (repeatable)");
  verify_cmd->add_flag(
      "--allow-uncovered", verify.allow_uncovered,
      "Exit 0 though some branch or schedule was not reached (listed all the same)");
  verify_cmd->add_option("--contract", verify.contract,
                         "Contract file: what cannot be inferred of the systems (docs/verify.md)");

  VerifyWorkerOptions verify_worker;
  CLI::App* verify_worker_cmd = app.add_subcommand("verify-worker", "");  // verify's own, hidden
  verify_worker_cmd->group("");
  verify_worker_cmd->add_option("definition", verify_worker.definition)->required();
  verify_worker_cmd->add_option("--input", verify_worker.input)->required();
  verify_worker_cmd->add_option("--result", verify_worker.result)->required();
  verify_worker_cmd->add_option("--crash-at", verify_worker.crash_at);
  verify_worker_cmd->add_option("--crash-occurrence", verify_worker.crash_occurrence);
  verify_worker_cmd->add_option("--event-source", verify_worker.event_source);
  verify_worker_cmd->add_option("--event-id", verify_worker.event_id);
  verify_worker_cmd->add_option("--relay-config", verify_worker.relay_config);
  verify_worker_cmd->add_flag("--observe-lookups", verify_worker.observe_lookups);
  verify_worker_cmd->add_flag("--operator-compensate", verify_worker.operator_compensate);
  add_global(verify_worker_cmd);
  verify_worker_cmd->add_option("--lease", global.lease);

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
  if (*token_list) return TokenList(global, token_list_json);
  if (*token_revoke) return TokenRevoke(global, revoke_name);
  if (*serve_cmd) {
    serve.workers_given = serve_workers->count() > 0;
    serve.max_in_flight_given = serve_in_flight->count() > 0;
    serve.lease_given = serve_cmd->get_option("--lease")->count() > 0;
    serve.step_key_retention_given = serve_cmd->get_option("--step-key-retention")->count() > 0;
    return Serve(global, serve);
  }
  if (*instances_cmd) return Instances(api, instances);
  if (*show_cmd) return Show(api, show);
  for (CLI::App* cmd : act_cmds) {
    if (*cmd) {
      act.action = cmd->get_name();
      return Act(api, act);
    }
  }
  if (*decide_cmd) return Decide(api, decide);
  if (*revise_cmd) return Revise(api, revise);
  if (*alerts_cmd) return Alerts(api, alerts);
  if (*ack_cmd) return Ack(api, ack);
  if (*targets_cmd) return Targets(api, targets_json);
  for (const auto& [verb, cmd] : target_verbs) {
    if (*cmd) return ChangeTarget(api, verb, target);
  }
  if (*plan_cmd) return Plan(plan_file);
  if (*sim_cmd) return Sim(sim);
  if (*verify_cmd) return Verify(verify);
  if (*verify_worker_cmd) return VerifyWorker(global, verify_worker);
  if (*relay_cmd) return Relay(global, relay);
  return kExitUsage;
}

}  // namespace waystone::cli
