#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "store/store.h"

namespace waystone {

struct ApiServerOptions {
  // "host:port"; port 0 picks one.
  std::string listen = "127.0.0.1:8080";
  // Request bodies larger than this are refused with 413.
  size_t max_body_bytes = 1 << 20;
  // Seconds a client may take to send a request.
  int read_timeout_seconds = 10;
};

// ApiServer serves Waystone's HTTP API (the read side so far): /healthz, /readyz,
// /metrics, GET /v1/instances, GET /v1/instances/{key}, GET /v1/alerts. Every /v1
// route needs a bearer token; a token sees only its tenant, and another tenant's
// instance is a 404. Errors are RFC 9457 application/problem+json. Owns its server
// threads until destroyed. Thread-safe.
class ApiServer {
 public:
  static absl::StatusOr<std::unique_ptr<ApiServer>> Start(const ApiServerOptions& options,
                                                         Store* store, const Clock* clock);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;
  int port() const;

 private:
  class Impl;
  explicit ApiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace waystone
