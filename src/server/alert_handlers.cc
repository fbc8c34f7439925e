#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "server/api_handlers.h"
#include "server/redaction.h"
#include "server/request_bodies.h"
#include "server/request_helpers.h"
#include "server/wire_json.h"

// GET /v1/alerts and POST /v1/alerts/{id}/acknowledge. Alerts are named by their
// public ids, never by database ids.

namespace waystone {

using Json = nlohmann::json;

void ListAlerts(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                ServerResponse& res) {
  std::optional<AlertState> state;
  if (req.Query("state") != nullptr) {
    state = ParseAlertState(Param(req, "state"));
    if (!state) {
      return Send(res, BadRequest("state must be open, acknowledged or resolved"), req.path);
    }
  }
  auto alerts = ctx.store->ListAlerts(0);
  if (!alerts.ok()) return Send(res, ProblemFromStatus(alerts.status()), req.path);
  auto tenant = TenantOf(principal, req);
  std::map<int64_t, std::optional<InstanceRecord>> instances;
  Json items = Json::array();
  for (const auto& a : *alerts) {
    if (tenant && a.tenant != *tenant) continue;
    if (state && a.state != *state) continue;
    auto [it, fresh] = instances.try_emplace(a.instance_id);
    if (fresh) {
      auto instance = ctx.store->GetInstance(a.instance_id);
      if (instance.ok()) it->second = *instance;
    }
    Json item = wire::Alert(a, it->second ? it->second->key : "", *ctx.ids);
    if (it->second) {  // its message is the instance's reason: it may quote a response
      absl::Status hidden = RedactShownInstance(ctx, principal, *it->second, item);
      if (!hidden.ok()) return Send(res, ProblemFromStatus(hidden), req.path);
    }
    items.push_back(std::move(item));
  }
  SendJson(res, 200, {{"items", items}});
}

void AcknowledgeAlert(const ApiContext& ctx, const Principal& principal,
                      const std::string& public_id, const ServerRequest& req, ServerResponse& res) {
  auto body = JsonBody(req, res, ParseReasonBody);
  if (!body) return;
  const std::optional<int64_t> decoded = ctx.ids->Decode(public_id);
  if (!decoded) return Send(res, NotFound("no alert " + public_id), req.path);
  const int64_t id = *decoded;
  // An all-tenants token acts in the alert's tenant: permissions may differ there.
  std::string tenant = principal.tenant;
  if (tenant == "*") {
    auto found = ctx.store->GetAlert(id);
    if (absl::IsNotFound(found.status())) {
      return Send(res, NotFound("no alert " + public_id), req.path);
    }
    if (!found.ok()) return Send(res, ProblemFromStatus(found.status()), req.path);
    tenant = found->tenant;
  }
  if (!Permitted(ctx.options.permissions, principal, tenant, Permission::kAcknowledge, req, res)) {
    return;
  }
  const std::string& reason = *body;
  const bool dry = DryRun(req).value_or(false);
  auto alert = ctx.engine->operations().AcknowledgeAlert(principal.tenant, id, principal.token_name,
                                                         reason, dry);
  if (absl::IsNotFound(alert.status())) {
    return Send(res, NotFound("no alert " + public_id), req.path);  // not the database id
  }
  if (!alert.ok()) return Send(res, ProblemFromStatus(alert.status()), req.path);
  auto instance = ctx.store->GetInstance(alert->instance_id);
  Json out = wire::Alert(*alert, instance.ok() ? instance->key : "", *ctx.ids);
  out["dry_run"] = dry;
  if (dry) out["state_after"] = "acknowledged";
  if (instance.ok()) {
    absl::Status hidden = RedactShownInstance(ctx, principal, *instance, out);
    if (!hidden.ok()) return Send(res, ProblemFromStatus(hidden), req.path);
  }
  SendJson(res, 200, out);
}

}  // namespace waystone
