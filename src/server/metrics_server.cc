#include "server/metrics_server.h"

#include "http/http_front.h"
#include "server/metrics.h"

namespace waystone {

// The metrics listener: /metrics and /healthz only, no token. Meant for an internal
// address that only the scraper reaches; the numbers carry no tenant names.
class MetricsServer::Impl {
 public:
  Impl(Store* store, const Clock* clock, const CallMetrics* calls)
      : store_(store), clock_(clock), calls_(calls) {}

  absl::Status Listen(const std::string& listen) {
    HttpFrontOptions options;
    options.listen = listen;
    options.max_body_bytes = 0;
    options.handler_threads = 2;
    options.max_connections = 64;
    options.health_path = "/healthz";
    auto started = HttpFront::Start(
        options, [](ServerRequest& head, ServerResponse& res) { return Screen(head, res); },
        [this](const ServerRequest& req, ServerResponse& res) { Handle(req, res); });
    if (!started.ok()) return started.status();
    front_ = std::move(*started);
    return absl::OkStatus();
  }

  int port() const { return front_->port(); }

 private:
  static bool Screen(const ServerRequest& head, ServerResponse& res) {
    if ((head.method == "GET" || head.method == "HEAD") &&
        (head.path == "/metrics" || head.path == "/healthz")) {
      return false;
    }
    res.status = 404;
    res.SetContent("not found\n", "text/plain");
    return true;
  }

  void Handle(const ServerRequest& req, ServerResponse& res) {
    if (req.path == "/healthz") return res.SetContent("ok\n", "text/plain");
    auto text = RenderMetrics(*store_, clock_->NowMillis(), calls_);
    if (!text.ok()) {
      res.status = 503;
      return res.SetContent("metrics unavailable\n", "text/plain");
    }
    res.SetContent(*text, kMetricsContentType);
  }

  Store* store_;
  const Clock* clock_;
  const CallMetrics* calls_;
  std::unique_ptr<HttpFront> front_;  // last: destroyed first
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    Store* store,
                                                                    const Clock* clock,
                                                                    const CallMetrics* calls) {
  auto impl = std::make_unique<Impl>(store, clock, calls);
  if (auto status = impl->Listen(listen); !status.ok()) return status;
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

int MetricsServer::port() const { return impl_->port(); }

}  // namespace waystone
