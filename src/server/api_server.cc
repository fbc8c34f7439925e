#include "server/api_server.h"

#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/problem.h"
#include "server/wire.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

void Send(httplib::Response& res, const Problem& problem, const std::string& path) {
  res.status = problem.status;
  res.set_content(problem.ToJson(path), "application/problem+json");
}

}  // namespace

class ApiServer::Impl {
 public:
  Impl(Store* store, const Clock* clock) : store_(store), clock_(clock) {}
  ~Impl() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Listen(const ApiServerOptions& options) {
    const size_t colon = options.listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError("--listen '" + options.listen + "' is not host:port");
    }
    const std::string host = options.listen.substr(0, colon);
    const int port = std::atoi(options.listen.substr(colon + 1).c_str());
    server_.set_payload_max_length(options.max_body_bytes);
    server_.set_read_timeout(options.read_timeout_seconds, 0);
    server_.set_keep_alive_timeout(2);
    server_.set_exception_handler([](const httplib::Request& req, httplib::Response& res,
                                     std::exception_ptr) {
      Send(res, ProblemFromStatus(absl::InternalError("handler threw")), req.path);
    });
    server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler already wrote a problem
      if (res.status == 413) {
        Send(res, {413, "urn:waystone:problem:payload-too-large", "Request body too large", ""},
             req.path);
      } else if (res.status == 404) {
        Send(res, NotFound("no route " + req.method + " " + req.path), req.path);
      }
    });
    Routes();
    port_ = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ <= 0) return absl::UnavailableError("cannot listen on " + options.listen);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op before the loop runs: wait for it so destruction cannot hang.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::OkStatus();
  }

  int port() const { return port_; }

 private:
  // Authenticates the request and checks the role; writes the problem and returns
  // nullopt when refused.
  std::optional<Principal> Allow(const httplib::Request& req, httplib::Response& res, Role need) {
    auto principal = Authenticate(*store_, req.get_header_value("Authorization"));
    if (!principal.ok()) {
      Send(res, ProblemFromStatus(principal.status()), req.path);
      return std::nullopt;
    }
    if (static_cast<int>(principal->role) < static_cast<int>(need)) {
      Send(res, Forbidden("this route needs a higher role than the token's"), req.path);
      return std::nullopt;
    }
    return *principal;
  }

  // The tenant a request reads: the token's, or ?tenant= for an all-tenants token.
  std::optional<std::string> TenantOf(const Principal& p, const httplib::Request& req) {
    const std::string asked = req.get_param_value("tenant");
    if (p.tenant == "*") return asked.empty() ? std::nullopt : std::optional<std::string>(asked);
    return p.tenant;
  }

  void Routes() {
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    server_.Get("/readyz", [this](const httplib::Request& req, httplib::Response& res) {
      auto summary = store_->Summary();
      if (!summary.ok()) return Send(res, ProblemFromStatus(summary.status()), req.path);
      res.set_content("ready\n", "text/plain");
    });
    server_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      auto text = RenderMetrics(*store_, clock_->NowMillis());
      if (!text.ok()) return Send(res, ProblemFromStatus(text.status()), req.path);
      res.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/v1/instances", [this](const httplib::Request& req, httplib::Response& res) {
      auto principal = Allow(req, res, Role::kViewer);
      if (!principal) return;
      InstanceFilter filter;
      filter.tenant = TenantOf(*principal, req);
      if (req.has_param("workflow")) filter.workflow = req.get_param_value("workflow");
      if (req.has_param("state")) {
        auto state = ParseInstanceState(req.get_param_value("state"));
        if (!state) {
          return Send(res, BadRequest("state '" + req.get_param_value("state") +
                                      "' is not an instance state"),
                      req.path);
        }
        filter.state = *state;
      }
      if (req.has_param("limit")) {
        const int limit = std::atoi(req.get_param_value("limit").c_str());
        if (limit < 1 || limit > 1000) {
          return Send(res, BadRequest("limit must be from 1 to 1000"), req.path);
        }
        filter.limit = limit;
      }
      auto instances = store_->ListInstances(filter);
      if (!instances.ok()) return Send(res, ProblemFromStatus(instances.status()), req.path);
      Json items = Json::array();
      for (const auto& i : *instances) items.push_back(Json::parse(InstanceSummaryJson(i)));
      res.set_content(Json{{"items", items}}.dump(), "application/json");
    });
    server_.Get(R"(/v1/instances/(.+))", [this](const httplib::Request& req,
                                                httplib::Response& res) {
      auto principal = Allow(req, res, Role::kViewer);
      if (!principal) return;
      auto tenant = TenantOf(*principal, req);
      const std::string key = req.matches[1];
      if (!tenant) return Send(res, BadRequest("an all-tenants token must name ?tenant="), req.path);
      auto instance = store_->FindInstance(*tenant, key);
      // Another tenant's instance and a missing one look the same.
      if (!instance.ok()) return Send(res, ProblemFromStatus(instance.status()), req.path);
      auto view = InstanceViewJson(*store_, *instance);
      if (!view.ok()) return Send(res, ProblemFromStatus(view.status()), req.path);
      res.set_content(*view, "application/json");
    });
    server_.Get("/v1/alerts", [this](const httplib::Request& req, httplib::Response& res) {
      auto principal = Allow(req, res, Role::kViewer);
      if (!principal) return;
      auto alerts = store_->ListAlerts(0);
      if (!alerts.ok()) return Send(res, ProblemFromStatus(alerts.status()), req.path);
      auto tenant = TenantOf(*principal, req);
      Json items = Json::array();
      for (const auto& a : *alerts) {
        if (tenant && a.tenant != *tenant) continue;
        items.push_back({{"id", a.id}, {"instance_id", a.instance_id}, {"tenant", a.tenant},
                         {"step", a.step}, {"kind", ToString(a.kind)}, {"state", ToString(a.state)},
                         {"message", a.message}, {"created_at", Rfc3339(a.created_at)}});
      }
      res.set_content(Json{{"items", items}}.dump(), "application/json");
    });
  }

  Store* store_;
  const Clock* clock_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
};

ApiServer::ApiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ApiServer::~ApiServer() = default;

absl::StatusOr<std::unique_ptr<ApiServer>> ApiServer::Start(const ApiServerOptions& options,
                                                           Store* store, const Clock* clock) {
  auto impl = std::make_unique<Impl>(store, clock);
  if (auto status = impl->Listen(options); !status.ok()) return status;
  return std::unique_ptr<ApiServer>(new ApiServer(std::move(impl)));
}

int ApiServer::port() const { return impl_->port(); }

}  // namespace waystone
