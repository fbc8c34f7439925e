// Commands that talk to a running `waystone serve` over its HTTP API.

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "connectors/http/http_client.h"
#include "model/json_text.h"

namespace waystone::cli {
namespace {

using Json = nlohmann::json;

std::string Encode(const std::string& text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == ':') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Sends one request to the server; returns the parsed JSON body of a 2xx answer,
// or prints the problem and returns nullopt.
std::optional<Json> Call(const ApiOptions& api, const std::string& method, std::string path,
                         const Json* body) {
  std::string server = api.server;
  if (server.empty()) {
    const char* env = std::getenv("WAYSTONE_SERVER");
    server = env != nullptr && *env != '\0' ? env : "http://127.0.0.1:8080";
  }
  while (!server.empty() && server.back() == '/') server.pop_back();
  const char* token = std::getenv("WAYSTONE_TOKEN");
  if (token == nullptr || *token == '\0') {
    Fail(absl::InvalidArgumentError("set WAYSTONE_TOKEN to an API token (waystone token create)"));
    return std::nullopt;
  }
  if (!api.tenant.empty()) {
    path += (path.find('?') == std::string::npos ? "?" : "&") + std::string("tenant=") +
            Encode(api.tenant);
  }
  HttpRequest request{
      method, server + path, {{"Authorization", std::string("Bearer ") + token}}, "", 30'000};
  if (body != nullptr) {
    request.body = body->dump();
    request.headers.emplace_back("Content-Type", "application/json");
  }
  auto http = NewCurlHttpClient({});
  HttpResponse response = http->Send(request);
  if (response.outcome.kind != CallOutcome::Kind::kResponse) {
    Fail(absl::UnavailableError("no answer from " + server + ": " + response.error));
    return std::nullopt;
  }
  Json parsed = Json::parse(response.body, nullptr, false);
  const int status = response.outcome.status;
  if (status < 200 || status >= 300) {
    std::string text = "HTTP " + std::to_string(status);
    if (parsed.is_object()) {
      text = parsed.value("title", text) + ": " + parsed.value("detail", "") + " (HTTP " +
             std::to_string(status) + ")";
    }
    std::fprintf(stderr, "waystone: %s\n", text.c_str());
    return std::nullopt;
  }
  if (parsed.is_discarded()) {
    Fail(absl::DataLossError("the server answered with something that is not JSON"));
    return std::nullopt;
  }
  return parsed;
}

std::string Str(const Json& object, const char* name) {
  if (!object.contains(name) || object[name].is_null()) return "";
  return object[name].is_string() ? object[name].get<std::string>() : JsonText(object[name]);
}

void PrintPlan(const Json& plan) {
  std::printf("%s %s %s: %s -> %s\n", plan.value("applied", false) ? "APPLIED" : "DRY RUN",
              Str(plan, "action").c_str(), Str(plan["instance"], "key").c_str(),
              Str(plan, "state_before").c_str(), Str(plan, "state_after").c_str());
  const bool applied = plan.value("applied", false);
  std::printf("%s:%s\n", applied ? "runs next" : "would execute",
              plan["would_execute"].empty() ? " nothing" : "");
  for (const Json& call : plan["would_execute"]) {
    std::string what = Str(call, "method") + " " + Str(call, "url");
    if (call.contains("event")) what = "event " + Str(call, "event");
    if (Str(call, "phase") == "transform") what = "(computed, no call)";
    std::printf(
        "  %-20s %-18s %s%s\n", Str(call, "step").c_str(), Str(call, "phase").c_str(), what.c_str(),
        call.contains("idempotency_key") ? ("  key " + Str(call, "idempotency_key")).c_str() : "");
  }
  std::printf("%s:%s\n", applied ? "skips" : "would skip",
              plan["would_skip"].empty() ? " nothing" : "");
  for (const Json& skip : plan["would_skip"]) {
    std::printf("  %-20s %s\n", Str(skip, "step").c_str(), Str(skip, "why").c_str());
  }
}

}  // namespace

int Instances(const ApiOptions& api, const InstancesOptions& options) {
  std::string path = "/v1/instances?limit=" + std::to_string(options.limit);
  for (const auto& [name, value] :
       {std::pair{"state", options.state}, std::pair{"workflow", options.workflow},
        std::pair{"error_class", options.error_class}, std::pair{"alert", options.alert},
        std::pair{"created_after", options.created_after},
        std::pair{"created_before", options.created_before}, std::pair{"cursor", options.cursor}}) {
    if (!value.empty()) path += std::string("&") + name + "=" + Encode(value);
  }
  auto page = Call(api, "GET", path, nullptr);
  if (!page) return kExitError;
  if (options.json) {
    std::printf("%s\n", page->dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-28s %-18s %-16s %-24s %s\n", "key", "workflow", "state", "updated", "reason");
  for (const Json& item : (*page)["items"]) {
    std::printf("%-28s %-18s %-16s %-24s %s\n", Str(item, "key").c_str(),
                Str(item, "workflow").c_str(), Str(item, "state").c_str(),
                Str(item, "updated_at").c_str(), Str(item, "status_reason").substr(0, 80).c_str());
  }
  if (!(*page)["next_cursor"].is_null()) {
    std::printf("more: --cursor %s\n", Str(*page, "next_cursor").c_str());
  }
  return kExitOk;
}

int Show(const ApiOptions& api, const ShowOptions& options) {
  auto view = Call(api, "GET", "/v1/instances/" + Encode(options.key), nullptr);
  if (!view) return kExitError;
  if (options.json) {
    std::printf("%s\n", view->dump(2).c_str());
    return kExitOk;
  }
  const Json& v = *view;
  std::printf("instance  %s  (tenant %s, workflow %s)\n", Str(v, "key").c_str(),
              Str(v, "tenant").c_str(), Str(v, "workflow").c_str());
  std::printf("state     %s — %s\n", Str(v, "state").c_str(), Str(v, "status_reason").c_str());
  std::printf("trace     %s\n\n", Str(v, "trace_id").c_str());
  std::printf("  %-20s %-20s %8s  %-22s %s\n", "step", "state", "attempts", "external id", "note");
  for (const Json& s : v["steps"]) {
    std::string note = Str(s, "resolution") == "none" ? "" : Str(s, "resolution");
    if (!Str(s, "error_message").empty()) {
      const std::string error_class = Str(s, "error_class");
      note += (note.empty() ? "" : "; ") + (error_class == "none" ? "" : error_class + ": ") +
              Str(s, "error_message").substr(0, 80);
    }
    if (s.contains("next_attempt_at"))
      note += (note.empty() ? "" : "; ") + std::string("next ") + Str(s, "next_attempt_at");
    std::printf("  %-20s %-20s %8s  %-22s %s\n", Str(s, "name").c_str(), Str(s, "state").c_str(),
                Str(s, "attempts").c_str(), Str(s, "external_id").c_str(), note.c_str());
  }
  for (const Json& e : v.value("kept_events", Json::array())) {
    std::printf("\n  kept event %s (%s %s, %s): its function has not waited for it yet",
                Str(e, "type").c_str(), Str(e, "source").c_str(), Str(e, "id").c_str(),
                Str(e, "received_at").c_str());
  }
  if (v.contains("kept_events")) std::printf("\n");
  for (const Json& a : v.value("approvals", Json::array())) {
    const bool open = a.contains("request") && Str(a, "state") != "pending";
    std::printf("\n  approval %s: %s", Str(a, "step").c_str(), Str(a, "state").c_str());
    if (open) std::printf(", request %s", Str(a, "request").c_str());
    if (!open) std::printf(", next request %s", Str(a, "next_request").c_str());
    std::printf(" on data version %s\n", Str(a, "data_version").substr(0, 16).c_str());
    if (a.contains("snapshot")) {
      const Json& snapshot = a["snapshot"];
      if (snapshot.contains("summary")) std::printf("    %s\n", Str(snapshot, "summary").c_str());
      for (auto it = snapshot["fields"].begin(); it != snapshot["fields"].end(); ++it) {
        std::printf("    %-16s %s\n", it.key().c_str(),
                    JsonText(it.value()).substr(0, 100).c_str());
      }
    }
    if (a.contains("decision")) {
      std::printf("    decided: %s by %s — %s\n", Str(a["decision"], "outcome").c_str(),
                  Str(a["decision"], "by").c_str(), Str(a["decision"], "comment").c_str());
    }
    if (a.contains("next_deadline_in_seconds")) {
      std::printf("    next deadline in %ss\n", Str(a, "next_deadline_in_seconds").c_str());
    }
  }
  for (const Json& a : v["alerts"]) {
    std::printf("\n  alert %s [%s, %s] %s", Str(a, "id").c_str(), Str(a, "kind").c_str(),
                Str(a, "state").c_str(), Str(a, "message").c_str());
  }
  if (!v["alerts"].empty()) std::printf("\n");
  if (!v["audit"].empty()) std::printf("\n  audit\n");
  for (const Json& a : v["audit"]) {
    std::printf("  %s  %-10s %-12s %s\n", Str(a, "at").c_str(), Str(a, "actor").c_str(),
                Str(a, "action").c_str(), Str(a, "reason").c_str());
  }
  return kExitOk;
}

int Act(const ApiOptions& api, const ActOptions& options) {
  Json body = {{"reason", options.reason}};
  if (!options.step.empty()) body["step"] = options.step;
  if (options.action == "confirm") {
    if (options.happened == options.not_happened) {
      return Fail(absl::InvalidArgumentError("confirm needs --happened or --not-happened"));
    }
    body["happened"] = options.happened;
  }
  if (!options.external_id.empty()) body["external_id"] = options.external_id;
  std::string path = "/v1/instances/" + Encode(options.key) + "/" + options.action;
  if (options.dry_run) path += "?dry_run=true";
  auto result = Call(api, "POST", path, &body);
  if (!result) return kExitError;
  if (options.json) {
    std::printf("%s\n", result->dump(2).c_str());
  } else {
    PrintPlan(*result);
  }
  return kExitOk;
}

int Decide(const ApiOptions& api, const DecideOptions& options) {
  if (options.approve == options.reject) {
    return Fail(absl::InvalidArgumentError("decide needs --approve or --reject"));
  }
  // The version shown may be given short; it must be the start of the one shown now.
  std::string version = options.data_version;
  int request = options.request;
  if (version.size() < 64) {
    if (version.size() < 8) {
      return Fail(absl::InvalidArgumentError("--data-version needs at least 8 characters"));
    }
    auto view = Call(api, "GET", "/v1/instances/" + Encode(options.key), nullptr);
    if (!view) return kExitError;
    for (const Json& a : view->value("approvals", Json::array())) {
      if (Str(a, "step") != options.step) continue;
      if (Str(a, "data_version").starts_with(version)) version = Str(a, "data_version");
      if (request == 0 && a.contains("request")) request = a["request"].get<int>();
    }
  }
  Json body = {{"step", options.step},
               {"data_version", version},
               {"decision", options.approve ? "approve" : "reject"}};
  if (request > 0) body["request"] = request;
  if (!options.comment.empty()) body["comment"] = options.comment;
  auto result = Call(api, "POST", "/v1/instances/" + Encode(options.key) + "/decide", &body);
  if (!result) return kExitError;
  if (options.json) {
    std::printf("%s\n", result->dump(2).c_str());
    return kExitOk;
  }
  const Json& approval = (*result)["approval"];
  std::printf("%s %s %s: step %s is %s; instance %s\n",
              result->value("replayed", false) ? "ALREADY" : "DECIDED",
              options.approve ? "approve" : "reject", options.key.c_str(), options.step.c_str(),
              Str(*result, "step_state").c_str(), Str((*result)["instance"], "state").c_str());
  if (approval.is_object() && approval.contains("request")) {
    std::printf("request %s on data version %s\n", Str(approval, "request").c_str(),
                Str(approval, "data_version").substr(0, 16).c_str());
  }
  return kExitOk;
}

int Revise(const ApiOptions& api, const ReviseOptions& options) {
  auto text = TextOrFile(options.input, 1 << 20);
  if (!text.ok()) return Fail(text.status());
  Json input = Json::parse(*text, nullptr, false);
  if (!input.is_object()) {
    return Fail(absl::InvalidArgumentError("--input must be a JSON object (or @FILE holding one)"));
  }
  Json body = {{"input", input}, {"reason", options.reason}};
  auto result = Call(api, "POST", "/v1/instances/" + Encode(options.key) + "/revise", &body);
  if (!result) return kExitError;
  if (options.json) {
    std::printf("%s\n", result->dump(2).c_str());
    return kExitOk;
  }
  auto list = [](const Json& names) {
    std::string out;
    for (const Json& n : names) out += (out.empty() ? "" : ", ") + n.get<std::string>();
    return out.empty() ? std::string("none") : out;
  };
  if (result->value("unchanged", false)) {
    std::printf("UNCHANGED %s: the input is this already\n", options.key.c_str());
    return kExitOk;
  }
  std::printf("REVISED %s: input %s\n", options.key.c_str(),
              Str(*result, "input_hash").substr(0, 16).c_str());
  std::printf("material to:   %s\n", list((*result)["material"]).c_str());
  std::printf("cancelled:     %s (asked again on the new data)\n",
              list((*result)["cancelled"]).c_str());
  std::printf("runs again:    %s\n", list((*result)["reruns"]).c_str());
  return kExitOk;
}

int Alerts(const ApiOptions& api, const AlertsOptions& options) {
  std::string path = "/v1/alerts";
  if (!options.state.empty()) path += "?state=" + Encode(options.state);
  auto alerts = Call(api, "GET", path, nullptr);
  if (!alerts) return kExitError;
  if (options.json) {
    std::printf("%s\n", alerts->dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-6s %-24s %-20s %-13s %s\n", "id", "instance", "kind", "state", "message");
  for (const Json& a : (*alerts)["items"]) {
    std::printf("%-6s %-24s %-20s %-13s %s\n", Str(a, "id").c_str(), Str(a, "instance").c_str(),
                Str(a, "kind").c_str(), Str(a, "state").c_str(),
                Str(a, "message").substr(0, 100).c_str());
  }
  return kExitOk;
}

int Ack(const ApiOptions& api, const AckOptions& options) {
  Json body = {{"reason", options.reason}};
  std::string path = "/v1/alerts/" + options.id + "/acknowledge";
  if (options.dry_run) path += "?dry_run=true";
  auto alert = Call(api, "POST", path, &body);
  if (!alert) return kExitError;
  std::printf("%s alert %s (%s): %s\n", options.dry_run ? "would acknowledge" : "acknowledged",
              Str(*alert, "id").c_str(), Str(*alert, "kind").c_str(),
              Str(*alert, "message").c_str());
  return kExitOk;
}

int Targets(const ApiOptions& api, bool json) {
  auto targets = Call(api, "GET", "/v1/targets", nullptr);
  if (!targets) return kExitError;
  if (json) {
    std::printf("%s\n", targets->dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-16s %-10s %-10s %-6s %s\n", "target", "state", "circuit", "calls", "limits");
  for (const Json& t : (*targets)["items"]) {
    std::string limits;
    if (t.contains("rate")) limits += "rate " + t["rate"].dump() + "/s ";
    if (t.contains("concurrency")) limits += "concurrency " + t["concurrency"].dump() + " ";
    if (t.contains("circuit_breaker")) {
      limits += "breaker " + t["circuit_breaker"]["failures"].dump() + " failures";
    }
    std::printf("%-16s %-10s %-10s %-6s %s\n", Str(t, "name").c_str(),
                t.value("paused", false) ? "paused" : "calling", Str(t, "circuit").c_str(),
                t.value("calls_under_way", Json(0)).dump().c_str(), limits.c_str());
    if (t.value("paused", false)) {
      std::printf("  paused by %s at %s: %s\n", Str(t, "paused_by").c_str(),
                  Str(t, "paused_at").c_str(), Str(t, "pause_reason").c_str());
    }
  }
  return kExitOk;
}

int ChangeTarget(const ApiOptions& api, const std::string& verb, const TargetOptions& options) {
  Json body = {{"reason", options.reason}};
  auto target = Call(api, "POST", "/v1/targets/" + Encode(options.name) + "/" + verb, &body);
  if (!target) return kExitError;
  if (options.json) {
    std::printf("%s\n", target->dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s target %s: %s\n", verb == "pause" ? "paused" : "resumed",
              Str(*target, "name").c_str(), options.reason.c_str());
  return kExitOk;
}

}  // namespace waystone::cli
