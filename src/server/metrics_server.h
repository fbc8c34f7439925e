#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "store/store.h"

namespace waystone {

class CallMetrics;

// Serves GET /metrics (Prometheus text format) and GET /healthz on `listen`
// ("host:port"; port 0 picks one), with the external calls counted in `calls`
// (null: this process makes none; else it outlives the server). Owns its server
// thread until destroyed.
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              Store* store, const Clock* clock,
                                                              const CallMetrics* calls);
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
