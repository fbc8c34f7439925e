#include "server/metrics_server.h"

#include <thread>

#include <httplib.h>

#include "server/metrics.h"

namespace waystone {

class MetricsServer::Impl {
 public:
  Impl(Store* store, const Clock* clock) : store_(store), clock_(clock) {}
  ~Impl() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Listen(const std::string& listen) {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError("--metrics-listen '" + listen + "' is not host:port");
    }
    const std::string host = listen.substr(0, colon);
    const int port = std::atoi(listen.substr(colon + 1).c_str());
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      auto text = RenderMetrics(*store_, clock_->NowMillis());
      if (!text.ok()) {
        res.status = 503;
        res.set_content("metrics unavailable\n", "text/plain");
        return;
      }
      res.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.set_tcp_nodelay(true);
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    port_ = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ <= 0) return absl::UnavailableError("cannot listen on " + listen);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op before the loop runs: wait for it so destruction cannot hang.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::OkStatus();
  }

  int port() const { return port_; }

 private:
  Store* store_;
  const Clock* clock_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    Store* store,
                                                                    const Clock* clock) {
  auto impl = std::make_unique<Impl>(store, clock);
  if (auto status = impl->Listen(listen); !status.ok()) return status;
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

int MetricsServer::port() const { return impl_->port(); }

}  // namespace waystone
