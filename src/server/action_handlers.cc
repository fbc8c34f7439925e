#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "server/api_handlers.h"
#include "server/redaction.h"
#include "server/request_bodies.h"
#include "server/request_helpers.h"
#include "server/wire_json.h"

// POST /v1/instances/{key}/{action}: an operator action, or its dry run (the plan
// it would carry out).

namespace waystone {

using Json = nlohmann::json;

Json PlanJson(const ActionPlan& plan) {
  Json changed = Json::array();
  for (const StepRecord& s : plan.changed_steps) {
    changed.push_back({{"name", s.name}, {"state", ToString(s.state)}});
  }
  Json execute = Json::array();
  for (const PlannedCall& c : plan.would_execute) {
    Json call = {{"step", c.step}, {"phase", c.phase}};
    if (!c.method.empty()) call["method"] = c.method;
    if (!c.url.empty()) call["url"] = c.url;
    if (!c.rendered_url.empty()) call["rendered_url"] = c.rendered_url;
    if (!c.idempotency_key.empty()) call["idempotency_key"] = c.idempotency_key;
    if (!c.event.empty()) call["event"] = c.event;
    execute.push_back(std::move(call));
  }
  Json skip = Json::array();
  for (const SkippedStep& s : plan.would_skip) skip.push_back({{"step", s.step}, {"why", s.why}});
  return {{"state_before", ToString(plan.state_before)},
          {"state_after", ToString(plan.state_after)},
          {"changed_steps", changed},
          {"would_execute", execute},
          {"would_skip", skip}};
}

void ApplyAction(const ApiContext& ctx, const Principal& principal, const std::string& key,
                 const std::string& action_name, const ServerRequest& req, ServerResponse& res) {
  auto body = JsonBody(req, res, ParseActionBody);
  if (!body) return;
  auto tenant = WriteTenant(principal, Param(req, "tenant"), req, res);
  if (!tenant) return;
  OperatorRequest request = *body;
  request.action = *ParseOperatorAction(action_name);
  // Before anything is read or planned: a refused action has no dry run either.
  if (!Permitted(ctx.options.permissions, principal, *tenant, PermissionOf(request.action), req,
                 res)) {
    return;
  }
  request.actor = principal.token_name;
  request.dry_run = DryRun(req).value_or(false);
  auto result = ctx.engine->operations().Apply(*tenant, key, request);
  if (!result.ok()) return Send(res, ProblemFromStatus(result.status()), req.path);
  Json out = PlanJson(result->plan);
  out["action"] = action_name;
  out["dry_run"] = request.dry_run;
  out["applied"] = result->applied;
  out["instance"] = wire::InstanceSummary(result->instance);
  // A planned call's rendered URL and the instance's reason may hold what the
  // definition's redact: list hides.
  auto steps = ctx.store->GetSteps(result->instance.id);
  if (!steps.ok()) return Send(res, ProblemFromStatus(steps.status()), req.path);
  RedactFor(ctx, principal, result->instance, *steps, out);
  SendJson(res, 200, out);
}

}  // namespace waystone
