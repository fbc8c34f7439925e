#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "base/time_format.h"
#include "engine/catalog.h"
#include "engine/operate/operator_plan.h"
#include "server/api_handlers.h"
#include "server/permissions.h"
#include "server/redaction.h"
#include "server/request_helpers.h"
#include "server/triage.h"
#include "server/wire.h"
#include "server/wire_json.h"

// GET /v1/me (who the token is), GET /v1/triage (the instances that are not
// finished, grouped by why they stopped) and what both share with
// GET /v1/instances/{key}: the reason in words and the actions allowed next.

namespace waystone {

using Json = nlohmann::json;

namespace {

// The most instances of one state the triage reads; beyond it the answer says
// `truncated` (paging by reason needs a store query of its own).
constexpr int kTriageScan = 1000;

}  // namespace

Json NextActionsJson(const ApiContext& ctx, const Principal& principal,
                     const InstanceRecord& instance, const std::vector<StepRecord>& steps,
                     int standing_step) {
  Json out = Json::array();
  // Only what this token may do: the console offers what it is given.
  const std::set<Permission> permitted =
      PermissionsOf(ctx.options.permissions, principal.role, instance.tenant);
  auto definition = ctx.definitions->Get(instance.definition_hash);
  if (!definition.ok()) return out;  // its definition is gone: nothing can be planned
  const Millis now = ctx.clock->NowMillis();
  auto allowed = [&](OperatorAction action, const std::string& step) {
    if (!permitted.contains(PermissionOf(action))) return;
    OperatorRequest request;
    request.action = action;
    request.step = step;
    request.reason = "preview";
    request.actor = "preview";
    request.happened = false;  // confirm: refused for the same states either way
    auto plan = PlanOperatorAction(**definition, instance, steps, request, now,
                                   [](int) { return std::string(); });
    if (!plan.ok()) return;
    Json item = {{"action", std::string(ToString(action))}};
    if (!step.empty()) item["step"] = step;
    out.push_back(std::move(item));
  };
  std::vector<std::string> step_names;
  if (standing_step >= 0 && standing_step < static_cast<int>(steps.size())) {
    step_names.push_back(steps[standing_step].name);
  }
  for (const StepRecord& s : steps) {
    if (s.state == StepState::kCompensationFailed && s.index != standing_step) {
      step_names.push_back(s.name);
    }
  }
  for (const std::string& name : step_names) {
    allowed(OperatorAction::kRetry, name);
    allowed(OperatorAction::kConfirm, name);
    allowed(OperatorAction::kSkip, name);
  }
  allowed(OperatorAction::kCompensate, "");
  allowed(OperatorAction::kClose, "");
  return out;
}

Json StopJson(const ApiContext& ctx, const Principal& principal, const InstanceRecord& instance,
              const std::vector<StepRecord>& steps, const std::vector<AlertRecord>& alerts,
              const TriageOptions& options) {
  const StopExplanation why = ExplainStop(instance, steps, alerts, ctx.clock->NowMillis(), options);
  Json out = {{"reason", std::string(ToString(why.reason))}, {"words", why.words}};
  if (why.step >= 0 && why.step < static_cast<int>(steps.size())) {
    out["step"] = steps[why.step].name;
    out["step_state"] = std::string(ToString(steps[why.step].state));
    out["attempt"] = why.attempt;
  }
  if (why.next_attempt_at > 0) out["next_attempt_at"] = Rfc3339(why.next_attempt_at);
  if (why.reason == StopReason::kWaitingForEvent) out["overdue"] = why.overdue;
  out["next_actions"] = NextActionsJson(ctx, principal, instance, steps, why.step);
  return out;
}

void ShowMe(const ApiContext& ctx, const Principal& principal, const ServerRequest&,
            ServerResponse& res) {
  const auto& rules = ctx.options.permissions;
  auto names = [&](const std::string& tenant) {
    Json out = Json::array();
    for (Permission p : PermissionsOf(rules, principal.role, tenant)) {
      out.push_back(std::string(ToString(p)));
    }
    return out;
  };
  Json me = {{"token", principal.token_name},
             {"tenant", principal.tenant},
             {"role", RoleName(principal.role)},
             {"actions", names(principal.tenant == "*" ? "" : principal.tenant)}};
  // An all-tenants token: `actions` holds in every tenant but these.
  if (principal.tenant == "*") {
    Json by_tenant = Json::object();
    for (const std::string& tenant : TenantsWithRules(rules, principal.role)) {
      by_tenant[tenant] = names(tenant);
    }
    me["actions_by_tenant"] = std::move(by_tenant);
  }
  SendJson(res, 200, me);
}

void ShowTriage(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                ServerResponse& res) {
  TriageOptions options;
  int stuck_after_s = 0;
  if (!WholeNumberParam(req, res, "stuck_after", 1, 30 * 24 * 3600, &stuck_after_s,
                        " of seconds")) {
    return;
  }
  if (stuck_after_s > 0) options.stuck_after = stuck_after_s * 1000LL;
  int per_group = 50;
  if (!WholeNumberParam(req, res, "limit", 1, 500, &per_group)) return;
  std::map<StopReason, Json> items;
  std::map<StopReason, int> counts;
  bool truncated = false;
  for (InstanceState state : {InstanceState::kNeedsAttention, InstanceState::kFailed,
                              InstanceState::kCompensating, InstanceState::kRunning}) {
    InstanceFilter filter;
    filter.tenant = TenantOf(principal, req);
    if (req.Query("workflow") != nullptr) filter.workflow = Param(req, "workflow");
    filter.state = state;
    filter.limit = kTriageScan + 1;
    auto instances = ctx.store->ListInstances(filter);
    if (!instances.ok()) return Send(res, ProblemFromStatus(instances.status()), req.path);
    if (static_cast<int>(instances->size()) > kTriageScan) {
      truncated = true;
      instances->resize(kTriageScan);
    }
    for (const InstanceRecord& instance : *instances) {
      auto steps = ctx.store->GetSteps(instance.id);
      if (!steps.ok()) return Send(res, ProblemFromStatus(steps.status()), req.path);
      auto alerts = ctx.store->ListAlerts(instance.id);
      if (!alerts.ok()) return Send(res, ProblemFromStatus(alerts.status()), req.path);
      const StopExplanation why =
          ExplainStop(instance, *steps, *alerts, ctx.clock->NowMillis(), options);
      if (++counts[why.reason] > per_group) continue;
      Json item = wire::InstanceSummary(instance);
      item["stopped"] = StopJson(ctx, principal, instance, *steps, *alerts, options);
      RedactFor(ctx, principal, instance, *steps, item);
      items[why.reason].push_back(std::move(item));
    }
  }
  Json groups = Json::array();
  for (StopReason reason : AllStopReasons()) {
    if (reason == StopReason::kFinished) continue;
    Json list = items.contains(reason) ? items[reason] : Json::array();
    groups.push_back({{"reason", std::string(ToString(reason))},
                      {"count", counts[reason]},
                      {"items", std::move(list)}});
  }
  Json out = {{"groups", std::move(groups)},
              {"truncated", truncated},
              {"stuck_after_seconds", options.stuck_after / 1000}};
  // Tagged without its "at": the console asks every second whether triage changed,
  // and the time it was read is not a change.
  TagAnswer(res, out.dump(), /*weak=*/true);
  out["at"] = Rfc3339(ctx.clock->NowMillis());
  SendJson(res, 200, std::move(out));
}

}  // namespace waystone
