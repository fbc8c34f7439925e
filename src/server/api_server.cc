#include "server/api_server.h"

#include <algorithm>

#include "engine/catalog.h"
#include "engine/engine.h"
#include "http/http_front.h"
#include "server/api_handlers.h"
#include "server/idempotency.h"
#include "server/request_helpers.h"
#include "server/routes.h"
#include "server/wire.h"
#include "store/lease_owners.h"

namespace waystone {

// The server: the front, the screen that routes a request and checks its token
// before its body is read, and the dispatch to the handlers (api_handlers.h).
class ApiServer::Impl {
 public:
  Impl(const ApiServerOptions& options, Store* store, const Clock* clock, Engine* engine) {
    ctx_.options = options;
    ctx_.store = store;
    ctx_.clock = clock;
    ctx_.engine = engine;
    ctx_.owner = engine != nullptr ? engine->owner() + "/api" : MakeOwnerName("api");
    for (const EventRoute& route : options.events) ctx_.event_routes[route.type] = route;
    if (engine != nullptr) {
      ctx_.definitions = &engine->catalog();
    } else {
      own_definitions_ = std::make_unique<DefinitionCatalog>(store);
      ctx_.definitions = own_definitions_.get();
    }
  }

  absl::Status Listen() {
    auto ids = PublicIdsOf(*ctx_.store);
    if (!ids.ok()) return ids.status();
    ctx_.ids = std::move(*ids);
    auto hash_key = ctx_.store->ServerKey("public_ids");
    if (!hash_key.ok()) return hash_key.status();
    ctx_.hash_key = "input_hash/" + *hash_key;  // its own use of the key
    const ApiServerOptions& options = ctx_.options;
    front_options_.listen = options.listen;
    front_options_.max_body_bytes = options.max_body_bytes;
    front_options_.request_deadline_seconds = options.read_timeout_seconds;
    front_options_.max_connections = options.max_connections;
    front_options_.max_connections_per_client = options.max_connections_per_client;
    front_options_.handler_threads = options.handler_threads;
    front_options_.health_path = "/healthz";
    front_options_.tls_cert_file = options.tls_cert_file;
    front_options_.tls_key_file = options.tls_key_file;
    auto started = HttpFront::Start(front_options_, MakeScreen(), MakeHandle());
    if (!started.ok()) return started.status();
    front_ = std::move(*started);
    return absl::OkStatus();
  }

  ScreenFn MakeScreen() {
    return [this](ServerRequest& head, ServerResponse& res) { return Screen(head, res); };
  }
  HandleFn MakeHandle() {
    return [this](const ServerRequest& req, ServerResponse& res) { Handle(req, res); };
  }

  std::string ServeBytesForTest(std::string_view raw) {
    return ServeBytes(raw, front_options_, MakeScreen(), MakeHandle());
  }

  int port() const { return front_->port(); }

  // Everything a request can be refused for before its body is read: its route,
  // method, query, token and role. Keeps the match and the principal for Handle.
  bool Screen(ServerRequest& head, ServerResponse& res) {
    std::vector<Screened> matches = MatchPath(head.path);
    if (matches.empty()) {
      Send(res, NotFound("no route " + head.method + " " + head.path), head.path);
      return true;
    }
    // HEAD is GET without the body (the front drops it).
    const std::string method = head.method == "HEAD" ? "GET" : head.method;
    auto match = std::find_if(matches.begin(), matches.end(),
                              [&](const Screened& m) { return method == m.route->method; });
    if (match == matches.end()) {
      std::string allow;
      for (const Screened& m : matches) {
        const std::string route_method = m.route->method;
        allow +=
            (allow.empty() ? "" : ", ") + route_method + (route_method == "GET" ? ", HEAD" : "");
      }
      res.SetHeader("Allow", allow);
      Send(res,
           MakeProblem(ProblemKind::kMethodNotAllowed,
                       head.method + " " + head.path + " is not served; use " + allow),
           head.path);
      return true;
    }
    if (auto why = CheckQuery(head, *match->route)) {
      Send(res, BadRequest(*why), head.path);
      return true;
    }
    if (!match->route->open) {
      const std::string* authorization = head.Header("authorization");
      auto principal =
          Authenticate(*ctx_.store, authorization ? *authorization : "", ctx_.clock->NowMillis());
      if (!principal.ok()) {
        Send(res, ProblemFromStatus(principal.status()), head.path);
        return true;
      }
      const Role need = match->route->role;
      if (static_cast<int>(principal->role) < static_cast<int>(need)) {
        Send(res, Forbidden("this route needs the " + std::string(RoleName(need)) + " role"),
             head.path);
        return true;
      }
      match->principal = *principal;
    }
    if (match->route->writes && ctx_.engine == nullptr) {
      Send(res, ProblemFromStatus(absl::UnavailableError("read-only server")), head.path);
      return true;
    }
    head.screened = std::move(*match);
    return false;
  }

  void Handle(const ServerRequest& req, ServerResponse& res) {
    Dispatch(req, res);
    const auto& match = std::any_cast<const Screened&>(req.screened);
    // The console's files are tagged by the build and public (no Vary).
    if ((req.method == "GET" || req.method == "HEAD") && match.route->id != RouteId::kConsole) {
      Revalidate(req, res);
    } else if (req.method != "GET" && req.method != "HEAD") {
      // An answer to a write (a new token's secret among them, and its replay) is kept by
      // no cache.
      res.SetHeader("Cache-Control", "no-store");
    }
    if (ctx_.options.hsts_max_age > 0 && !ctx_.options.tls_cert_file.empty()) {
      res.SetHeader("Strict-Transport-Security",
                    "max-age=" + std::to_string(ctx_.options.hsts_max_age));
    }
  }

  void Dispatch(const ServerRequest& req, ServerResponse& res) {
    const auto& match = std::any_cast<const Screened&>(req.screened);
    const Principal& principal = match.principal;
    switch (match.route->id) {
      case RouteId::kHealth:
      case RouteId::kReady:
      case RouteId::kMetrics:
      case RouteId::kOpenApi:
        return HandleHealth(ctx_, principal, match.route->id, req, res);
      case RouteId::kListInstances:
        return ListInstances(ctx_, principal, req, res);
      case RouteId::kStart:
        return RunIdempotent(ctx_, principal, req, res,
                             [&] { StartInstance(ctx_, principal, req, res); });
      case RouteId::kShow:
        return ShowInstance(ctx_, principal, match.key, req, res);
      case RouteId::kAct:
        return RunIdempotent(ctx_, principal, req, res, [&] {
          ApplyAction(ctx_, principal, match.key, match.action, req, res);
        });
      case RouteId::kDecide:
        return RunIdempotent(ctx_, principal, req, res,
                             [&] { DecideApproval(ctx_, principal, match.key, req, res); });
      case RouteId::kRevise:
        return RunIdempotent(ctx_, principal, req, res,
                             [&] { ReviseInstance(ctx_, principal, match.key, req, res); });
      case RouteId::kListAlerts:
        return ListAlerts(ctx_, principal, req, res);
      case RouteId::kAcknowledge:
        return RunIdempotent(ctx_, principal, req, res,
                             [&] { AcknowledgeAlert(ctx_, principal, match.key, req, res); });
      case RouteId::kEvents:
        return RunIdempotent(ctx_, principal, req, res,
                             [&] { ReceiveEvents(ctx_, principal, req, res); });
      case RouteId::kMe:
        return ShowMe(ctx_, principal, req, res);
      case RouteId::kTriage:
        return ShowTriage(ctx_, principal, req, res);
      case RouteId::kAttempts:
        return ListAttemptsOf(ctx_, principal, req, res);
      case RouteId::kCreateBatch:
        return RunIdempotent(ctx_, principal, req, res,
                             [&] { PreviewOrCreateBatch(ctx_, principal, req, res); });
      case RouteId::kListBatches:
        return ListBatches(ctx_, principal, req, res);
      case RouteId::kShowBatch:
        return ShowBatch(ctx_, principal, match.key, req, res);
      case RouteId::kChangeBatch:
        return RunIdempotent(ctx_, principal, req, res, [&] {
          ChangeBatch(ctx_, principal, match.key, match.action, req, res);
        });
      case RouteId::kListTokens:
        return ListTokens(ctx_, principal, req, res);
      case RouteId::kCreateToken:
        // Not under Idempotency-Key: a stored answer would keep the token's secret.
        return CreateTokenOf(ctx_, principal, req, res);
      case RouteId::kRevokeToken:
        return RunIdempotent(ctx_, principal, req, res,
                             [&] { RevokeTokenOf(ctx_, principal, match.key, req, res); });
      case RouteId::kListTargets:
        return ListTargets(ctx_, principal, req, res);
      case RouteId::kChangeTarget:
        return RunIdempotent(ctx_, principal, req, res, [&] {
          ChangeTarget(ctx_, principal, match.key, match.action, req, res);
        });
      case RouteId::kConsole:
        return ServeConsole(ctx_, match.key, req, res);
    }
  }

 private:
  std::unique_ptr<DefinitionCatalog> own_definitions_;  // a read-only server's
  ApiContext ctx_;
  HttpFrontOptions front_options_;
  // Last: destroyed first, so no handler runs once the rest is gone.
  std::unique_ptr<HttpFront> front_;
};

ApiServer::ApiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ApiServer::~ApiServer() = default;

absl::StatusOr<std::unique_ptr<ApiServer>> ApiServer::Start(const ApiServerOptions& options,
                                                            Store* store, const Clock* clock,
                                                            Engine* engine) {
  auto impl = std::make_unique<Impl>(options, store, clock, engine);
  if (auto status = impl->Listen(); !status.ok()) return status;
  return std::unique_ptr<ApiServer>(new ApiServer(std::move(impl)));
}

int ApiServer::port() const { return impl_->port(); }

std::string ApiServer::ServeBytesForTest(std::string_view raw) {
  return impl_->ServeBytesForTest(raw);
}

}  // namespace waystone
