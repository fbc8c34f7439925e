#include "server/routes.h"

#include "engine/operate/operator_plan.h"

namespace waystone {
namespace {

const RouteSpec kRoutes[] = {
    {RouteId::kHealth, "GET", Role::kViewer, true, false, {}},
    {RouteId::kReady, "GET", Role::kViewer, true, false, {}},
    {RouteId::kMetrics, "GET", Role::kAdmin, false, false, {}},
    {RouteId::kOpenApi, "GET", Role::kViewer, true, false, {}},
    {RouteId::kListInstances,
     "GET",
     Role::kViewer,
     false,
     false,
     {"tenant", "workflow", "state", "error_class", "alert", "created_after", "created_before",
      "limit", "cursor", "key_prefix", "external_id", "updated_after", "updated_before",
      "definition", "step", "step_state", "http_status"}},
    {RouteId::kStart, "POST", Role::kOperator, false, true, {}},
    {RouteId::kShow, "GET", Role::kViewer, false, false, {"tenant"}},
    {RouteId::kAct, "POST", Role::kOperator, false, true, {"tenant", "dry_run"}},
    // Any role may decide an approval: the step says who (approvals.h, MayDecide).
    {RouteId::kDecide, "POST", Role::kViewer, false, true, {"tenant"}},
    {RouteId::kRevise, "POST", Role::kOperator, false, true, {"tenant"}},
    {RouteId::kListAlerts, "GET", Role::kViewer, false, false, {"tenant", "state"}},
    {RouteId::kAcknowledge, "POST", Role::kOperator, false, true, {"tenant", "dry_run"}},
    {RouteId::kEvents, "POST", Role::kOperator, false, true, {}},
    {RouteId::kMe, "GET", Role::kViewer, false, false, {}},
    {RouteId::kAttempts,
     "GET",
     Role::kViewer,
     false,
     false,
     {"tenant", "key", "step", "limit", "cursor"}},
    {RouteId::kTriage,
     "GET",
     Role::kViewer,
     false,
     false,
     {"tenant", "workflow", "stuck_after", "limit"}},
    // A batch needs the role its action needs on one instance (kAct's).
    {RouteId::kCreateBatch, "POST", Role::kOperator, false, true, {"dry_run"}},
    {RouteId::kListBatches, "GET", Role::kViewer, false, false, {"tenant", "limit", "cursor"}},
    {RouteId::kShowBatch, "GET", Role::kViewer, false, false, {"limit", "cursor"}},
    {RouteId::kChangeBatch, "POST", Role::kOperator, false, true, {}},
    // Pausing a target takes the permission pause_target too (target_handlers.cc).
    {RouteId::kListTargets, "GET", Role::kViewer, false, false, {"tenant"}},
    {RouteId::kChangeTarget, "POST", Role::kOperator, false, true, {"tenant"}},
    // Tokens are managed without an engine: a read-only server serves them too.
    {RouteId::kListTokens, "GET", Role::kAdmin, false, false, {}},
    {RouteId::kCreateToken, "POST", Role::kAdmin, false, false, {}},
    {RouteId::kRevokeToken, "POST", Role::kAdmin, false, false, {}},
    // The console's static files: public, they hold no data (every call they make
    // carries the token).
    {RouteId::kConsole, "GET", Role::kViewer, true, false, {}},
};

const RouteSpec& Spec(RouteId id) {
  for (const RouteSpec& spec : kRoutes) {
    if (spec.id == id) return spec;
  }
  return kRoutes[0];
}

}  // namespace

std::vector<Screened> MatchPath(const std::string& path) {
  std::vector<Screened> out;
  auto add = [&out](RouteId id, std::string key = "", std::string action = "") {
    out.push_back({&Spec(id), std::move(key), std::move(action), {}});
  };
  if (path == "/healthz")
    add(RouteId::kHealth);
  else if (path == "/readyz")
    add(RouteId::kReady);
  else if (path == "/metrics")
    add(RouteId::kMetrics);
  else if (path == "/v1/openapi.json")
    add(RouteId::kOpenApi);
  else if (path == "/v1/me")
    add(RouteId::kMe);
  else if (path == "/v1/triage")
    add(RouteId::kTriage);
  // A resource of its own, not /v1/instances/{key}/attempts: a key may end in "/attempts".
  else if (path == "/v1/attempts")
    add(RouteId::kAttempts);
  else if (path == "/console")
    add(RouteId::kConsole);
  else if (path.starts_with("/console/"))
    add(RouteId::kConsole, path.substr(9));
  else if (path == "/v1/instances") {
    add(RouteId::kListInstances);
    add(RouteId::kStart);
  } else if (path == "/v1/alerts") {
    add(RouteId::kListAlerts);
  } else if (path == "/v1/batches") {
    add(RouteId::kListBatches);
    add(RouteId::kCreateBatch);
  } else if (path.starts_with("/v1/batches/") && path.size() > 12) {
    const std::string rest = path.substr(12);
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) {
      add(RouteId::kShowBatch, rest);
    } else {
      const std::string verb = rest.substr(slash + 1);
      if (verb == "pause" || verb == "resume" || verb == "cancel") {
        add(RouteId::kChangeBatch, rest.substr(0, slash), verb);
      }
    }
  } else if (path == "/v1/targets") {
    add(RouteId::kListTargets);
  } else if (path.starts_with("/v1/targets/") && path.size() > 12) {
    const std::string rest = path.substr(12);
    const size_t slash = rest.find('/');
    if (slash != std::string::npos && slash > 0) {
      const std::string verb = rest.substr(slash + 1);
      if (verb == "pause" || verb == "resume") {
        add(RouteId::kChangeTarget, rest.substr(0, slash), verb);
      }
    }
  } else if (path == "/v1/tokens") {
    add(RouteId::kListTokens);
    add(RouteId::kCreateToken);
  } else if (path.starts_with("/v1/tokens/") && path.ends_with("/revoke") && path.size() > 11 + 7) {
    add(RouteId::kRevokeToken, path.substr(11, path.size() - 11 - 7));
  } else if (path == "/v1/events") {
    add(RouteId::kEvents);
  } else if (path.starts_with("/v1/alerts/") && path.ends_with("/acknowledge") &&
             path.size() > 11 + 12) {
    // The public id; decoded by the handler (an id it did not make is a 404).
    add(RouteId::kAcknowledge, path.substr(11, path.size() - 11 - 12));
  } else if (path.starts_with("/v1/instances/") && path.size() > 14) {
    const std::string rest = path.substr(14);
    add(RouteId::kShow, rest);
    const size_t slash = rest.rfind('/');
    if (slash != std::string::npos && slash > 0) {
      const std::string action = rest.substr(slash + 1);
      if (ParseOperatorAction(action)) add(RouteId::kAct, rest.substr(0, slash), action);
      if (action == "decide") add(RouteId::kDecide, rest.substr(0, slash), action);
      if (action == "revise") add(RouteId::kRevise, rest.substr(0, slash), action);
    }
  }
  return out;
}

std::optional<bool> DryRun(const ServerRequest& req) {
  const std::string* value = req.Query("dry_run");
  if (value == nullptr) return false;
  if (*value == "true") return true;
  if (*value == "false") return false;
  return std::nullopt;
}

std::optional<std::string> CheckQuery(const ServerRequest& req, const RouteSpec& route) {
  for (const auto& [name, value] : req.query) {
    if (!route.params.contains(name)) {
      return "unknown query parameter '" + name + "'" +
             (route.params.empty() ? std::string(" (this route takes none)") : std::string());
    }
    if (req.QueryCount(name) > 1) return "query parameter '" + name + "' is given more than once";
  }
  if (!DryRun(req)) return "dry_run must be exactly true or false";
  return std::nullopt;
}

std::string Param(const ServerRequest& req, std::string_view name) {
  const std::string* value = req.Query(name);
  return value == nullptr ? "" : *value;
}

}  // namespace waystone
