#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "store/store.h"

namespace waystone {

// Serves GET /metrics (Prometheus text format) and GET /healthz on `listen`
// ("host:port"; port 0 picks one). Owns its server thread until destroyed.
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                             Store* store, const Clock* clock);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const;

 private:
  class Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace waystone
