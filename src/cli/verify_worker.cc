// `waystone verify-worker`: the worker process `waystone verify` runs for each
// schedule (verify/verifier.h). It starts (or finds) the instance, drives it to
// rest, answers what it waits for, lets an operator compensate it when asked,
// delivers its events, and writes how it ended. Its kill points are armed here.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/status_macros.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/runtime.h"
#include "cli/signals.h"
#include "definition/loader.h"
#include "engine/context.h"
#include "engine/operate/operations.h"
#include "messaging/relay.h"
#include "model/template.h"
#include "rules/approvals.h"

namespace waystone::cli {

namespace {

// Delivers what a waiting step of `instance` waits for, twice, unless `answered`
// holds it; returns what went wrong ("" = nothing). Kill points around it:
// during-wait (the instance waits, nothing delivered) and after-signal.
std::string AnswerWaits(Runtime& rt, const WorkflowDefinition& definition,
                        const InstanceRecord& instance, std::set<std::string>* answered) {
  auto steps = rt.store->GetSteps(instance.id);
  if (!steps.ok()) return "";
  for (const StepRecord& step : *steps) {
    const StepDefinition& def = definition.steps[step.index];
    if (step.state != StepState::kWaiting || answered->contains(step.name)) continue;
    CrashPoint("during-wait", step.name);
    for (int delivery = 1; delivery <= 2; ++delivery) {
      bool duplicate = false;
      if (def.kind == StepKind::kWait) {
        // The event's data holds what the templates read of it.
        nlohmann::json data{{"verified", true}};
        for (const std::string& pointer : def.kept_pointers) {
          if (pointer.empty()) continue;
          try {
            nlohmann::json::json_pointer at(pointer);
            if (!data.contains(at)) data[at] = "verify" + pointer;
          } catch (const nlohmann::json::exception&) {
          }
        }
        Signal signal{instance.tenant,      instance.key, def.wait_event, "verify",
                      step.name + "-event", data.dump(),  "verify"};
        auto delivered = rt.engine->operations().Deliver(signal);
        if (!delivered.ok())
          return absl::IsAborted(delivered.status()) ? ""
                                                     : std::string(delivered.status().message());
        duplicate = delivered->outcome == SignalOutcome::kDuplicate;
      } else if (def.kind == StepKind::kApproval) {
        Decision decision;
        decision.step = step.name;
        decision.data_version = step.request_hash;
        decision.approve = true;
        decision.comment = "approved by waystone verify";
        decision.actor = "verify-approver";
        decision.role = "admin";
        if (!def.approval.group.empty()) decision.groups.push_back(def.approval.group);
        decision.inbox = InboxClaim{instance.tenant, "verify", step.name + "-decision",
                                    EventDataHash(R"({"decision":"approve"})")};
        auto decided = rt.engine->operations().Decide(instance.tenant, instance.key, decision);
        if (!decided.ok())
          return absl::IsAborted(decided.status()) ? "" : std::string(decided.status().message());
        duplicate = decided->duplicate || decided->replayed;
      } else {
        break;
      }
      if (delivery == 1) CrashPoint("after-signal", step.name);
      if (delivery == 2 && !duplicate) {
        return "the " + std::string(def.kind == StepKind::kWait ? "event" : "decision") +
               " for step '" + step.name + "' delivered a second time was applied again";
      }
    }
    answered->insert(step.name);
  }
  return "";
}

// Asks each step's own lookup what the target holds now, as the engine would ask
// it: step -> the external ids of the candidates that match. A paged lookup reads
// its first page only.
absl::StatusOr<nlohmann::json> ObserveLookups(Runtime& rt, const WorkflowDefinition& definition,
                                              const InstanceRecord& instance,
                                              const std::vector<StepRecord>& steps,
                                              const std::string& secrets_file) {
  using Json = nlohmann::json;
  WS_ASSIGN_OR_RETURN(TemplateEnvironment environment, TemplateEnvironment::Load(secrets_file));
  auto render = [](const std::string& text, const Json& context) -> absl::StatusOr<std::string> {
    WS_ASSIGN_OR_RETURN(Template parsed, Template::Parse(text));
    return parsed.RenderText(context);
  };
  Json looked_up = Json::object();
  for (const StepDefinition& def : definition.steps) {
    if (!def.lookup) continue;
    const Json context = environment.Build(instance, steps, def.name, "");
    HttpRequest request;
    request.method = def.lookup->request.method;
    request.timeout = def.lookup->request.timeout;
    WS_ASSIGN_OR_RETURN(request.url, render(def.lookup->request.url, context));
    for (const auto& [name, value] : def.lookup->request.headers) {
      WS_ASSIGN_OR_RETURN(std::string text, render(value, context));
      request.headers.emplace_back(name, text);
    }
    request.headers.emplace_back("X-Verify-Observe", "1");  // verify's proxy injects no fault
    const HttpResponse answer = rt.http->Send(request);
    if (answer.outcome.kind != CallOutcome::Kind::kResponse) {
      return absl::UnavailableError("the lookup of '" + def.name +
                                    "' got no answer: " + answer.error);
    }
    Json ids = Json::array();
    const Json body =
        answer.outcome.status == 404 ? Json(nullptr) : Json::parse(answer.body, nullptr, false);
    std::vector<Json> candidates;
    try {
      if (!def.lookup->items.empty() && body.contains(Json::json_pointer(def.lookup->items))) {
        for (const Json& item : body.at(Json::json_pointer(def.lookup->items)))
          candidates.push_back(item);
      } else if (!def.lookup->found.empty() &&
                 body.contains(Json::json_pointer(def.lookup->found)) &&
                 !body.at(Json::json_pointer(def.lookup->found)).is_null()) {
        candidates.push_back(body.at(Json::json_pointer(def.lookup->found)));
      }
      for (const Json& candidate : candidates) {
        bool matches = true;
        for (const auto& [pointer, value] : def.lookup->match) {
          WS_ASSIGN_OR_RETURN(std::string expected, render(value, context));
          const Json::json_pointer at(pointer);
          const Json* field = candidate.contains(at) ? &candidate.at(at) : nullptr;
          matches = matches && field != nullptr &&
                    (field->is_string() ? field->get<std::string>() : field->dump()) == expected;
        }
        if (!matches) continue;
        const Json::json_pointer id_at(def.lookup->external_id.empty() ? "/id"
                                                                       : def.lookup->external_id);
        const Json& within = def.lookup->items.empty() ? body : candidate;
        const Json id = within.contains(id_at) ? within.at(id_at) : Json(nullptr);
        ids.push_back(id.is_string() ? id.get<std::string>() : id.dump());
      }
    } catch (const Json::exception& e) {
      return absl::InvalidArgumentError("the lookup of '" + def.name +
                                        "' answered what it cannot read: " + e.what());
    }
    looked_up[def.name] = std::move(ids);
  }
  return looked_up;
}

}  // namespace

int VerifyWorker(const GlobalOptions& global, const VerifyWorkerOptions& options) {
  // Armed before any thread can reach a crash point.
  if (!options.crash_at.empty()) ArmCrashPoint(options.crash_at, options.crash_occurrence);
  std::stop_token stop = StopOnSignals();
  auto definition = LoadDefinitionFile(options.definition);
  if (!definition.ok()) return Fail(definition.status());
  // Killed (SIGKILL), never powered off: each commit it made is in the operating
  // system's cache and survives the kill, so waiting for the disk (FULL) would only
  // slow every schedule down, most of all on a machine with slow fsync.
  GlobalOptions killed_not_unplugged = global;
  killed_not_unplugged.sqlite_synchronous = "NORMAL";
  auto runtime = OpenRuntime(killed_not_unplugged, 1, 0);
  if (!runtime.ok()) return Fail(runtime.status());
  Runtime& rt = **runtime;
  StartRequest request{global.tenant, options.input, options.event_source, options.event_id};
  auto started = rt.engine->StartInstance(*definition, request);
  if (!started.ok()) return Fail(started.status());
  if (started->outcome == StartOutcome::kEventConflict)
    return Fail(EventConflict(request, *started));
  // Whatever the instance waits for comes, twice (the second must change nothing):
  // a wait step's event, an approval's approving decision.
  // While RunUntilRest watches a wait with a deadline, a thread answers it; a wait
  // without one makes RunUntilRest return `running`, and it is answered here.
  std::mutex answering;
  std::string violation;
  std::set<std::string> answered;
  auto answer = [&] {
    std::lock_guard<std::mutex> lock(answering);
    if (auto problem = AnswerWaits(rt, *definition, started->instance, &answered);
        !problem.empty()) {
      violation = problem;
    }
  };
  std::jthread responder([&](std::stop_token done) {
    while (!done.stop_requested()) {
      answer();
      SystemClock::Get()->SleepFor(50, done);
    }
  });
  absl::StatusOr<InstanceState> state = InstanceState::kRunning;
  auto violated = [&] {
    std::lock_guard<std::mutex> lock(answering);
    return !violation.empty();
  };
  for (int round = 0; round < 200 && !violated(); ++round) {
    state = rt.engine->RunUntilRest(started->instance.id, stop);
    if (!state.ok() || stop.stop_requested()) break;
    if (*state == InstanceState::kCompleted && options.operator_compensate) {
      // As an operator would from the console (after a restart too: a compensated
      // instance is refused, and that is the end of it).
      OperatorRequest compensate;
      compensate.action = OperatorAction::kCompensate;
      compensate.reason = "waystone verify: an operator undoes the completed instance";
      compensate.actor = "verify-operator";
      auto applied = rt.engine->operations().Apply(started->instance.tenant, started->instance.key,
                                                   compensate);
      if (applied.ok() || absl::IsAborted(applied.status())) continue;
      return Fail(applied.status());
    }
    if (*state != InstanceState::kRunning) break;
    answer();
    SystemClock::Get()->SleepFor(20, stop);
  }
  responder.request_stop();
  responder.join();  // `violation` is this thread's alone from here on
  if (!state.ok()) return Fail(state.status());
  if (!violation.empty()) return Fail(absl::InternalError(violation));
  if (!options.relay_config.empty()) {
    // Its events too, as a relay would deliver them (verify kills it in between).
    auto config = LoadRelayConfig(options.relay_config);
    if (!config.ok()) return Fail(config.status());
    auto relay = waystone::Relay::Create(rt.store.get(), rt.http.get(), SystemClock::Get(),
                                         &rt.random, *config, rt.engine->owner() + "/relay");
    if (!relay.ok()) return Fail(relay.status());
    if (auto drained = DrainRelay(**relay, *rt.store, config->poll_interval, stop); !drained.ok()) {
      return Fail(drained);
    }
  }
  auto record = rt.store->GetInstance(started->instance.id);
  if (!record.ok()) return Fail(record.status());
  auto steps = rt.store->GetSteps(started->instance.id);
  if (!steps.ok()) return Fail(steps.status());
  nlohmann::json result{{"state", ToString(record->state)},
                        {"reason", record->status_reason},
                        {"steps", nlohmann::json::array()}};
  // The typed reasons an operator is given: every open alert, "kind:step".
  auto alerts = rt.store->ListAlerts(started->instance.id);
  if (!alerts.ok()) return Fail(alerts.status());
  result["open_alerts"] = nlohmann::json::array();
  for (const AlertRecord& alert : *alerts) {
    if (alert.state != AlertState::kOpen) continue;
    result["open_alerts"].push_back(std::string(ToString(alert.kind)) + ":" + alert.step);
  }
  if (options.observe_lookups) {
    auto looked_up = ObserveLookups(rt, *definition, *record, *steps, global.secrets_file);
    if (!looked_up.ok()) return Fail(looked_up.status());
    result["looked_up"] = std::move(*looked_up);
  }
  for (const StepRecord& step : *steps) {
    result["steps"].push_back(
        {{"name", step.name}, {"state", ToString(step.state)}, {"external_id", step.external_id}});
  }
  // Two workers may finish at once (concurrent starts): each writes its own file.
  const std::string temporary = options.result + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << result.dump() << "\n";
    if (!out.good()) return Fail(absl::InternalError("cannot write " + temporary));
  }
  std::error_code renamed;
  std::filesystem::rename(temporary, options.result, renamed);
  if (renamed)
    return Fail(absl::InternalError("cannot write " + options.result + ": " + renamed.message()));
  return kExitOk;
}

}  // namespace waystone::cli
