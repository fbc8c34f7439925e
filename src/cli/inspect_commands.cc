#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "cli/common.h"
#include "connectors/http/http_client.h"
#include "definition/loader.h"
#include "definition/plan.h"
#include "model/duration.h"
#include "model/json_text.h"
#include "server/wire.h"

namespace waystone::cli {
namespace {

using Json = nlohmann::json;

}  // namespace

absl::Status PrintInstance(Store& store, const InstanceRecord& instance, bool json) {
  WS_ASSIGN_OR_RETURN(std::vector<StepRecord> steps, store.GetSteps(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<AlertRecord> alerts, store.ListAlerts(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<DeliveryRecord> deliveries, store.ListDeliveries(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<AttemptRecord> attempts, store.ListAttempts(instance.id));
  if (json) {
    WS_ASSIGN_OR_RETURN(PublicIds ids, PublicIdsOf(store));
    WS_ASSIGN_OR_RETURN(std::string view, InstanceViewJson(store, instance, ids));
    std::printf("%s\n", view.c_str());
    return absl::OkStatus();
  }
  std::printf("instance  %s  (tenant %s, workflow %s)\n", instance.key.c_str(),
              instance.tenant.c_str(), instance.workflow.c_str());
  std::printf("state     %s — %s\n", std::string(ToString(instance.state)).c_str(),
              Printable(instance.status_reason).c_str());
  std::printf("trace     %s\n\n", instance.trace_id.c_str());
  std::printf("  %-20s %-20s %8s  %-22s %s\n", "step", "state", "attempts", "external id", "note");
  for (const auto& s : steps) {
    std::string note;
    if (s.resolution != Resolution::kNone) note = std::string(ToString(s.resolution));
    if (!s.error_message.empty()) {
      note += (note.empty() ? "" : "; ");
      if (s.error_class != ErrorClass::kNone) note += std::string(ToString(s.error_class)) + ": ";
      note += s.error_message.substr(0, 80);
    }
    if (s.compensation_attempts > 0) {
      note += (note.empty() ? "" : "; ") + std::string("compensation attempts ") +
              std::to_string(s.compensation_attempts);
    }
    std::printf("  %-20s %-20s %8d  %-22s %s\n", s.name.c_str(),
                std::string(ToString(s.state)).c_str(), s.attempts,
                Printable(s.external_id).c_str(), Printable(note).c_str());
  }
  if (!attempts.empty()) {
    // Every request sent: which step and phase, whether it left, on which connection,
    // and what came back.
    std::printf("\n  %-20s %3s  %-10s %-4s %-6s %6s  %s\n", "request of", "#", "phase", "sent",
                "conn", "status", "outcome");
    for (const auto& a : attempts) {
      const std::string step = a.step_index < static_cast<int>(steps.size())
                                   ? steps[a.step_index].name
                                   : std::to_string(a.step_index);
      const std::string outcome =
          a.error_class == ErrorClass::kNone
              ? "ok"
              : std::string(ToString(a.error_class)) + ": " + a.detail.substr(0, 60);
      std::printf("  %-20s %3d  %-10s %-4s %-6s %6s  %s\n", step.c_str(), a.seq,
                  std::string(ToString(a.phase)).c_str(), a.sent ? "yes" : "no",
                  std::string(ToString(a.connection)).c_str(),
                  a.status == 0 ? "-" : std::to_string(a.status).c_str(),
                  Printable(outcome).c_str());
    }
  }
  for (const auto& alert : alerts) {
    std::printf("\n  alert [%s, %s] %s", std::string(ToString(alert.kind)).c_str(),
                std::string(ToString(alert.state)).c_str(), Printable(alert.message).c_str());
  }
  if (!alerts.empty()) std::printf("\n");
  if (!deliveries.empty()) {
    std::printf("\n  %-36s %-12s %-10s %8s  %s\n", "event", "sink", "delivery", "attempts",
                "last error");
    for (const auto& d : deliveries) {
      std::printf("  %-36s %-12s %-10s %8d  %s\n", d.event_type.c_str(), d.sink.c_str(),
                  std::string(ToString(d.state)).c_str(), d.attempts,
                  Printable(d.last_error).c_str());
    }
  }
  return absl::OkStatus();
}

int Status(const GlobalOptions& global, const StatusOptions& options) {
  auto store = OpenStoreFor(global);
  if (!store.ok()) return Fail(store.status());
  if (!options.key.empty()) {
    auto instance = (*store)->FindInstance(global.tenant, options.key);
    if (!instance.ok()) return Fail(instance.status());
    auto printed = PrintInstance(**store, *instance, options.json);
    return printed.ok() ? kExitOk : Fail(printed);
  }
  auto summary = (*store)->Summary();
  if (!summary.ok()) return Fail(summary.status());
  Json sim;
  if (!options.sim_url.empty()) {
    auto http = NewCurlHttpClient({});
    HttpResponse response = http->Send({"GET", options.sim_url + "/_sim/stats", {}, "", 5000});
    if (response.outcome.kind != CallOutcome::Kind::kResponse || response.outcome.status != 200) {
      return Fail(absl::UnavailableError("simulator at " + options.sim_url +
                                         " did not answer: " + response.error));
    }
    sim = Json::parse(response.body, nullptr, false);
  }
  Json out = Json::object();
  int64_t total = 0;
  for (const auto& [state, count] : summary->instances_by_state) {
    out["instances"][std::string(ToString(state))] = count;
    total += count;
  }
  out["instances"]["total"] = total;
  out["retries"] = summary->retries;
  out["unknown_outcomes"] = summary->unknown_outcomes;
  out["unknown_resolved_by_lookup"] = summary->resolved_by_lookup;
  out["resubmitted_after_unknown"] = summary->resubmitted_after_lookup;
  out["steps_compensated"] = summary->compensations;
  out["open_alerts"] = summary->open_alerts;
  out["outbox_events"] = summary->outbox_events;
  if (!sim.is_null()) out["simulator"] = sim;
  auto sinks = (*store)->DeliveryStats();
  if (!sinks.ok()) return Fail(sinks.status());
  const Millis now = SystemClock::Get()->NowMillis();
  for (const auto& sink : *sinks) {
    out["relay"][sink.sink] = {
        {"pending", sink.pending},
        {"delivered", sink.delivered},
        {"parked", sink.parked},
        {"failed_attempts", sink.failed_attempts},
        {"lag_seconds",
         sink.oldest_pending_at == 0 ? 0.0 : (now - sink.oldest_pending_at) / 1000.0},
        {"disabled", sink.disabled}};
  }
  if (options.json) {
    std::printf("%s\n", JsonText(out, 2).c_str());
    return kExitOk;
  }
  auto count = [&](const char* state) { return out["instances"].value(state, 0); };
  std::printf("+------------------------------------------+----------+\n");
  std::printf("| %-40s | %8s |\n", "waystone summary", "count");
  std::printf("+------------------------------------------+----------+\n");
  std::printf("| %-40s | %8lld |\n", "instances", static_cast<long long>(total));
  for (const char* state : {"completed", "compensated", "needs_attention", "failed", "running",
                            "compensating", "closed"}) {
    std::printf("|   %-38s | %8d |\n", state, count(state));
  }
  std::printf("| %-40s | %8lld |\n", "retries", static_cast<long long>(summary->retries));
  std::printf("| %-40s | %8lld |\n", "unknown outcomes",
              static_cast<long long>(summary->unknown_outcomes));
  std::printf("|   %-38s | %8lld |\n", "resolved by lookup (adopted)",
              static_cast<long long>(summary->resolved_by_lookup));
  std::printf("|   %-38s | %8lld |\n", "resubmitted under the same key",
              static_cast<long long>(summary->resubmitted_after_lookup));
  std::printf("| %-40s | %8lld |\n", "steps compensated",
              static_cast<long long>(summary->compensations));
  std::printf("| %-40s | %8lld |\n", "open alerts", static_cast<long long>(summary->open_alerts));
  std::printf("| %-40s | %8lld |\n", "outbox events",
              static_cast<long long>(summary->outbox_events));
  for (const auto& sink : *sinks) {
    std::printf("+------------------------------------------+----------+\n");
    std::printf("| relay sink %-29s | %8s |\n", sink.sink.c_str(), sink.disabled ? "DISABLED" : "");
    std::printf("|   %-38s | %8lld |\n", "delivered", static_cast<long long>(sink.delivered));
    std::printf("|   %-38s | %8lld |\n", "pending", static_cast<long long>(sink.pending));
    std::printf("|   %-38s | %8lld |\n", "parked", static_cast<long long>(sink.parked));
    std::printf("|   %-38s | %8lld |\n", "failed attempts",
                static_cast<long long>(sink.failed_attempts));
  }
  if (!sim.is_null()) {
    std::printf("+------------------------------------------+----------+\n");
    for (const char* field : {"orders", "orders_cancelled", "shipments", "line_messages", "emails",
                              "crm_writebacks", "duplicate_orders", "duplicate_shipments",
                              "duplicate_line_messages", "duplicate_emails"}) {
      std::printf("| sim %-36s | %8lld |\n", field,
                  static_cast<long long>(sim.value(field, int64_t{-1})));
    }
  }
  std::printf("+------------------------------------------+----------+\n");
  return kExitOk;
}

int List(const GlobalOptions& global, const ListOptions& options) {
  auto store = OpenStoreFor(global);
  if (!store.ok()) return Fail(store.status());
  InstanceFilter filter;
  filter.tenant = global.tenant;
  filter.limit = options.limit;
  if (!options.workflow.empty()) filter.workflow = options.workflow;
  if (!options.state.empty()) {
    auto state = ParseInstanceState(options.state);
    if (!state) {
      return Fail(absl::InvalidArgumentError(
          "--state '" + options.state +
          "' is not one of running, completed, compensating, compensated, failed, "
          "needs_attention, closed"));
    }
    filter.state = *state;
  }
  auto instances = (*store)->ListInstances(filter);
  if (!instances.ok()) return Fail(instances.status());
  if (options.json) {
    Json out = Json::array();
    for (const auto& r : *instances) out.push_back(Json::parse(InstanceSummaryJson(r)));
    std::printf("%s\n", JsonText(out, 2).c_str());
    return kExitOk;
  }
  for (const auto& r : *instances) {
    std::printf("%-32s %-16s %-16s %s\n", r.key.c_str(), r.workflow.c_str(),
                std::string(ToString(r.state)).c_str(), Printable(r.status_reason).c_str());
  }
  return kExitOk;
}

int Lint(const std::vector<std::string>& files) {
  int problems = 0;
  int warnings = 0;
  for (const std::string& file : files) {
    std::string text;
    if (auto status = ReadFileText(file, kMaxDefinitionBytes, &text); !status.ok()) {
      std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
      ++problems;
      continue;
    }
    for (const Diagnostic& d : LintDefinitionText(text, file, nullptr)) {
      std::fprintf(stderr, "%s\n", d.ToString().c_str());
      ++(d.severity == Severity::kWarning ? warnings : problems);
    }
  }
  if (problems == 0) {
    std::printf("%zu definition(s) ok%s\n", files.size(),
                warnings == 0 ? "" : (", " + std::to_string(warnings) + " warning(s)").c_str());
    return kExitOk;
  }
  std::fprintf(stderr, "%d problem(s)\n", problems);
  return kExitError;
}

int Gc(const GlobalOptions& global, const GcOptions& options) {
  auto age = ParseDuration(options.older_than);
  if (!age) {
    return Fail(absl::InvalidArgumentError("--older-than '" + options.older_than +
                                           "' is not a duration such as 30d or 12h"));
  }
  auto protection = ParseDuration(options.keep_protection);
  if (!protection) {
    return Fail(absl::InvalidArgumentError("--keep-protection '" + options.keep_protection +
                                           "' is not a duration such as 400d"));
  }
  auto store = OpenStoreFor(global);
  if (!store.ok()) return Fail(store.status());
  const Millis now = SystemClock::Get()->NowMillis();
  auto report = (*store)->CollectGarbage(now - *age, now, now - *protection, options.dry_run);
  if (!report.ok()) return Fail(report.status());
  std::printf(
      "%s %lld instances (%lld steps, %lld events, %lld deliveries, %lld alerts) and "
      "%lld expired idempotency keys; %s %lld tombstones; %s %lld inbox claims and %lld "
      "tombstones older than %s\n",
      options.dry_run ? "would remove" : "removed", static_cast<long long>(report->instances),
      static_cast<long long>(report->steps), static_cast<long long>(report->events),
      static_cast<long long>(report->deliveries), static_cast<long long>(report->alerts),
      static_cast<long long>(report->idempotency_keys), options.dry_run ? "would keep" : "kept",
      static_cast<long long>(report->tombstones_written),
      options.dry_run ? "would remove" : "removed", static_cast<long long>(report->inbox_claims),
      static_cast<long long>(report->tombstones), options.keep_protection.c_str());
  return kExitOk;
}

int Plan(const std::string& file) {
  auto definition = LoadDefinitionFile(file);
  if (!definition.ok()) return Fail(definition.status());
  std::printf("%s", RenderPlan(*definition).c_str());
  return kExitOk;
}

}  // namespace waystone::cli
