#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "server/server_config.h"
#include "store/store.h"

namespace waystone {

class Engine;

struct ApiServerOptions {
  // "host:port"; port 0 picks one.
  std::string listen = "127.0.0.1:8080";
  // Request bodies larger than this are refused with 413.
  size_t max_body_bytes = 1 << 20;
  // Seconds a client may take to send a whole request, head and body.
  int read_timeout_seconds = 10;
  // Open connections at most; more are answered 503 and closed.
  int max_connections = 1024;
  // Of one client address (HttpFrontOptions::max_connections_per_client).
  int max_connections_per_client = 256;
  // Threads that run handlers; slow clients never hold one.
  int handler_threads = 8;
  // How long an Idempotency-Key pins its request and stored response.
  Millis idempotency_retention = 24LL * 3600 * 1000;
  // A key still in flight after this long belongs to a server that died: reclaimed.
  Millis idempotency_stale_after = 60'000;
  // Where POST /v1/events sends each event type.
  std::vector<EventRoute> events;
  // HTTPS: PEM certificate (chain) and private key files; both "" = plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
  // `tenants:` of the server config: a tenant sees only the targets its workflows
  // declare. Empty: one trust domain.
  std::map<std::string, TenantPolicy> tenants;
  // Strict-Transport-Security's max-age on every answer over HTTPS; 0 = no header.
  int64_t hsts_max_age = 0;
  // What each role may do, per tenant (permissions.h); empty = the defaults.
  std::vector<PermissionRule> permissions;
  // Who is in which group of which tenant: the approvers of approval steps that
  // name a group.
  std::vector<ApproverGroup> groups;
};

// ApiServer serves Waystone's HTTP API: health, metrics, the OpenAPI document,
// instances (list, show, start with Idempotency-Key), operator actions with
// dry runs, alerts, and the CloudEvents inbox. Every /v1 route needs a bearer
// token with the route's role; a token sees only its tenant, and another tenant's
// instance is a 404. Errors are RFC 9457 application/problem+json. Owns its server
// threads until destroyed. Thread-safe.
class ApiServer {
 public:
  // `engine` starts instances and applies actions; when null the server answers
  // the write routes with 503 (a read-only API).
  static absl::StatusOr<std::unique_ptr<ApiServer>> Start(const ApiServerOptions& options,
                                                          Store* store, const Clock* clock,
                                                          Engine* engine);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;
  int port() const;

  // Answers `raw`, the bytes a client sent on one connection, exactly as a served
  // connection would (the same parser, limits, screen and handlers), and returns
  // the bytes of the answers. For the fuzzer and for tests of the parser's edges.
  std::string ServeBytesForTest(std::string_view raw);

 private:
  class Impl;
  explicit ApiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The OpenAPI 3 document of this API (docs/openapi.json, built in).
std::string_view OpenApiDocument();

}  // namespace waystone
