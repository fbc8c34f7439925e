#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "base/time_format.h"
#include "engine/catalog.h"
#include "model/duration.h"
#include "server/api_handlers.h"
#include "server/request_bodies.h"
#include "server/request_helpers.h"

// GET /v1/targets and POST /v1/targets/{name}/pause|resume: the protection of the
// targets the definitions declare (limits, circuit breaker) and an operator's pause
// of every call to one, shared by every worker on the database.

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr char kPauseAction[] = "target.pause";
constexpr char kResumeAction[] = "target.resume";
constexpr size_t kMaxReasonBytes = 500;

std::string CircuitOf(const TargetLimits& limits, const TargetControl& control, Millis now) {
  if (limits.breaker_failures <= 0) return "none";
  if (control.failures < limits.breaker_failures) return "closed";
  return now < control.open_until ? "open" : "half_open";
}

// One target as the API shows it: what its definition says and its shared state.
Json TargetJson(const std::string& name, const TargetSpec* spec, const TargetControl& control,
                Millis now) {
  Json out = {{"name", name}, {"declared", spec != nullptr}};
  if (!control.tenant.empty()) out["tenant"] = control.tenant;
  const TargetLimits limits = spec != nullptr ? spec->limits : TargetLimits{};
  if (limits.rate > 0) out["rate"] = limits.rate;
  if (limits.concurrency > 0) out["concurrency"] = limits.concurrency;
  if (limits.breaker_failures > 0) {
    out["circuit_breaker"] = {{"failures", limits.breaker_failures},
                              {"cool_down", FormatDuration(limits.cool_down)}};
  }
  out["paused"] = control.paused;
  if (control.paused) {
    out["paused_by"] = control.paused_by;
    out["pause_reason"] = control.pause_reason;
    out["paused_at"] = FormatRfc3339(control.paused_at);
  }
  out["circuit"] = CircuitOf(limits, control, now);
  if (limits.breaker_failures > 0) {
    out["consecutive_failures"] = control.failures;
    if (control.open_until > now) out["open_until"] = FormatRfc3339(control.open_until);
  }
  out["calls_under_way"] = control.calls;
  return out;
}

// With `tenants:` configured, the targets a principal of `tenant` may see and act on
// are those its workflows declare; the others' names and limits are theirs. Null:
// every target (one trust domain, or an all-tenant principal listing them all).
const std::vector<std::string>* WorkflowsOf(const ApiContext& ctx,
                                            const std::optional<std::string>& tenant) {
  static const std::vector<std::string> kNone;
  if (!tenant || ctx.options.tenants.empty()) return nullptr;
  auto policy = ctx.options.tenants.find(*tenant);
  return policy == ctx.options.tenants.end() ? &kNone : &policy->second.workflows;
}

}  // namespace

void ListTargets(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                 ServerResponse& res) {
  const std::optional<std::string> tenant = TenantOf(principal, req);
  const Millis now = ctx.clock->NowMillis();
  auto controls = ctx.store->ListTargetControls(tenant.value_or(""), now);
  if (!controls.ok()) return Send(res, ProblemFromStatus(controls.status()), req.path);
  const std::map<std::string, TargetSpec> declared =
      ctx.definitions->CurrentTargets(WorkflowsOf(ctx, tenant));
  Json items = Json::array();
  std::set<std::string> shown;
  for (const TargetControl& control : *controls) {
    auto spec = declared.find(control.target);
    items.push_back(
        TargetJson(control.target, spec == declared.end() ? nullptr : &spec->second, control, now));
    shown.insert(control.target);
  }
  for (const auto& [name, spec] : declared) {
    if (shown.contains(name)) continue;
    TargetControl untouched;  // never called nor paused
    untouched.tenant = tenant.value_or("");
    untouched.target = name;
    items.push_back(TargetJson(name, &spec, untouched, now));
  }
  SendJson(res, 200, {{"items", std::move(items)}});
}

void ChangeTarget(const ApiContext& ctx, const Principal& principal, const std::string& name,
                  const std::string& verb, const ServerRequest& req, ServerResponse& res) {
  auto reason = JsonBody(req, res, ParseReasonBody);
  if (!reason) return;
  if (reason->size() > kMaxReasonBytes) {
    return Send(res,
                BadRequest("'reason' is longer than " + std::to_string(kMaxReasonBytes) +
                           " bytes: every waiting instance repeats it"),
                req.path);
  }
  if (reason->find_first_not_of(" \t\r\n") == std::string::npos) {
    return Send(res,
                BadRequest("'reason' is required: say why calls to target '" + name + "' " +
                           (verb == "pause" ? "stop" : "go again")),
                req.path);
  }
  const std::optional<std::string> tenant = WriteTenant(principal, Param(req, "tenant"), req, res);
  if (!tenant) return;
  if (!Permitted(ctx.options.permissions, principal, *tenant, Permission::kPauseTarget, req, res)) {
    return;
  }
  const std::map<std::string, TargetSpec> declared =
      ctx.definitions->CurrentTargets(WorkflowsOf(ctx, *tenant));
  auto spec = declared.find(name);
  if (spec == declared.end()) {
    // Not this server's, but on record: the targets of workflows written as C++
    // functions are declared by the programs that run them (Engine::RegisterTargets),
    // and a call to a limited one leaves its row.
    auto controls = ctx.store->ListTargetControls(*tenant, ctx.clock->NowMillis());
    if (!controls.ok()) return Send(res, ProblemFromStatus(controls.status()), req.path);
    const bool on_record =
        std::any_of(controls->begin(), controls->end(),
                    [&](const TargetControl& control) { return control.target == name; });
    if (!on_record) {
      std::string known;
      for (const auto& [target, unused] : declared) known += (known.empty() ? "" : ", ") + target;
      return Send(res,
                  NotFound("no workflow this server runs declares target '" + name + "'" +
                           (known.empty() ? " (none declares any)" : " (declared: " + known + ")") +
                           ", and no call to it is on record"),
                  req.path);
    }
  }
  const bool pause = verb == "pause";
  AuditRecord audit;
  audit.at = ctx.clock->NowMillis();
  audit.actor = principal.token_name;
  audit.tenant = *tenant;
  audit.action = pause ? kPauseAction : kResumeAction;
  audit.reason = *reason;
  audit.detail_json = Json{{"target", name}}.dump();
  auto control = ctx.store->PauseTarget(*tenant, name, pause, audit);
  if (!control.ok()) return Send(res, ProblemFromStatus(control.status()), req.path);
  SendJson(res, 200,
           TargetJson(name, spec == declared.end() ? nullptr : &spec->second, *control, audit.at));
}

}  // namespace waystone
