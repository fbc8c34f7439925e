#pragma once

// Inside the API server (its own .cc files only): what every handler shares, and
// the handlers, one file per resource:
//   health_handlers.cc    /healthz, /readyz, /metrics, /v1/openapi.json
//   instance_handlers.cc  GET and POST /v1/instances, GET /v1/instances/{key}, GET /v1/attempts
//   action_handlers.cc    POST /v1/instances/{key}/{action} (operator actions, dry runs)
//   approval_handlers.cc  POST /v1/instances/{key}/decide (an approval's decision),
//                         POST /v1/instances/{key}/revise (a new version of the input)
//   alert_handlers.cc     GET /v1/alerts, POST /v1/alerts/{id}/acknowledge
//   event_handlers.cc     POST /v1/events (the CloudEvents inbox)
//   triage_handlers.cc    GET /v1/me, GET /v1/triage; why an instance stopped, what may follow
//   batch_handlers.cc     /v1/batches: one action over a filter's instances, its preview
//   token_handlers.cc     GET and POST /v1/tokens, POST /v1/tokens/{name}/revoke
//   console_handlers.cc   GET /console/{file}: the console's files, compiled in
// Routing, tokens and roles are decided before (api_server.cc, routes.h); the
// request helpers are request_helpers.h, Idempotency-Key is idempotency.h.

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/public_id.h"
#include "http/http_front.h"
#include "server/api_server.h"
#include "server/auth.h"
#include "server/routes.h"

namespace waystone {

class DefinitionCatalog;
class Engine;
struct ActionPlan;
struct TriageOptions;

// The server's state the handlers read. Set up once before the first request;
// read-only afterwards (the store and the engine are thread-safe).
struct ApiContext {
  ApiServerOptions options;
  Store* store = nullptr;
  const Clock* clock = nullptr;
  Engine* engine = nullptr;  // null: a read-only server (write routes are screened out)
  std::string owner;         // names this server on its Idempotency-Key claims
  std::map<std::string, EventRoute> event_routes;  // by event type
  std::optional<PublicIds> ids;                    // alert ids as the API shows them
  // The server's secret that keys the input hashes shown to a principal who may not
  // see redacted values (RedactFor).
  std::string hash_key;
  // The definitions instances are pinned to (the engine's catalog, or the server's
  // own on a read-only server): what the allowed next actions are planned against.
  DefinitionCatalog* definitions = nullptr;
  // Starts waiting for their outcome (Prefer: wait) now: each holds a handler thread,
  // so at most half of them wait and the rest stay free for everything else.
  mutable std::atomic<int> waiting_starts{0};
};

// The routes that need no token: health, readiness, the OpenAPI document; and
// /metrics (an admin of every tenant).
void HandleHealth(const ApiContext& ctx, const Principal& principal, RouteId route,
                  const ServerRequest& req, ServerResponse& res);

// Reads the instance list's filters (workflow, state, error_class, alert,
// created_after, created_before) from `get` (a query parameter or a body field by
// name; null when absent) into `filter`; the 400's text when one is bad.
std::optional<std::string> ReadInstanceFilter(
    const std::function<const std::string*(const char*)>& get, InstanceFilter& filter);

void ListInstances(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res);
void ShowInstance(const ApiContext& ctx, const Principal& principal, const std::string& key,
                  const ServerRequest& req, ServerResponse& res);
// GET /v1/attempts?key=K: every request one instance's steps sent, newest first, paged.
void ListAttemptsOf(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                    ServerResponse& res);
void StartInstance(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res);

void ApplyAction(const ApiContext& ctx, const Principal& principal, const std::string& key,
                 const std::string& action_name, const ServerRequest& req, ServerResponse& res);

void DecideApproval(const ApiContext& ctx, const Principal& principal, const std::string& key,
                    const ServerRequest& req, ServerResponse& res);
void ReviseInstance(const ApiContext& ctx, const Principal& principal, const std::string& key,
                    const ServerRequest& req, ServerResponse& res);
// Applies an event routed by `decide:` or `revise:` to instance `key`: its data
// holds the decision's fields (as the decide route's body) or {input, reason?}; the
// token that sent it decides. Returns the result's outcome: decided, revised,
// unchanged or duplicate (the event was received before).
absl::StatusOr<std::string> ActOnEvent(const ApiContext& ctx, const Principal& principal,
                                       const std::string& tenant, const std::string& key,
                                       const EventRoute& route, const std::string& source,
                                       const std::string& id, const std::string& data_json);
// The approval steps of an instance as its view shows them: each request's data
// version, snapshot and decision, or (not open yet) what a decision before it quotes.
nlohmann::json ApprovalsJson(const ApiContext& ctx, const InstanceRecord& instance,
                             const std::vector<StepRecord>& steps);

// GET /v1/targets and POST /v1/targets/{name}/pause|resume (target_handlers.cc).
void ListTargets(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                 ServerResponse& res);
void ChangeTarget(const ApiContext& ctx, const Principal& principal, const std::string& name,
                  const std::string& verb, const ServerRequest& req, ServerResponse& res);

void ListAlerts(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                ServerResponse& res);
void AcknowledgeAlert(const ApiContext& ctx, const Principal& principal,
                      const std::string& public_id, const ServerRequest& req, ServerResponse& res);

void ShowMe(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
            ServerResponse& res);
void ShowTriage(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                ServerResponse& res);
// Why `instance` stopped (reason code, words, step, attempt, next attempt) and the
// operator actions its state allows next and `principal` may take, as GET
// /v1/triage and /v1/instances/{key} show them.
nlohmann::json StopJson(const ApiContext& ctx, const Principal& principal,
                        const InstanceRecord& instance, const std::vector<StepRecord>& steps,
                        const std::vector<AlertRecord>& alerts, const TriageOptions& options);

void PreviewOrCreateBatch(const ApiContext& ctx, const Principal& principal,
                          const ServerRequest& req, ServerResponse& res);
void ListBatches(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                 ServerResponse& res);
void ShowBatch(const ApiContext& ctx, const Principal& principal, const std::string& id,
               const ServerRequest& req, ServerResponse& res);
// POST /v1/batches/{id}/{pause|resume|cancel}.
void ChangeBatch(const ApiContext& ctx, const Principal& principal, const std::string& id,
                 const std::string& verb, const ServerRequest& req, ServerResponse& res);

// The operator action's plan as the dry runs show it.
nlohmann::json PlanJson(const ActionPlan& plan);
// GET /v1/tokens, POST /v1/tokens (the secret shown once), POST
// /v1/tokens/{name}/revoke (with a reason, audited): admins only, each within its
// tenant.
void ListTokens(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                ServerResponse& res);
void CreateTokenOf(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res);
void RevokeTokenOf(const ApiContext& ctx, const Principal& principal, const std::string& name,
                   const ServerRequest& req, ServerResponse& res);

void ServeConsole(const ApiContext& ctx, const std::string& file, const ServerRequest& req,
                  ServerResponse& res);

void ReceiveEvents(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res);

}  // namespace waystone
