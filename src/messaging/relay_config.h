#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "model/retry_policy.h"

namespace waystone {

enum class SinkKind : uint8_t { kWebhook = 1, kNats = 2 };

// One destination of outbox events. A value type.
struct SinkConfig {
  std::string name;
  SinkKind kind = SinkKind::kWebhook;
  // Event types this sink receives: exact types or prefixes ending in '*'
  // ("waystone.step.*"); default: every type except alerts.
  std::vector<std::string> events;
  // Workflows whose events it receives; empty: all.
  std::vector<std::string> workflows;
  // Tenants whose events it receives; empty: all, which a server with `tenants:`
  // refuses (CheckSinkTenants): a sink belongs to its tenants.
  std::vector<std::string> tenants;
  // Webhook: endpoint, signing secret ("whsec_…", read from secret_env or
  // secret_file, never written in the config), timeout.
  std::string url;
  std::string secret;
  Millis timeout = 5'000;
  // Reuse kept-alive connections to the endpoint. Off: each delivery on a connection
  // of its own, which libcurl never sends twice. On: much cheaper per event, but a
  // request on a connection the endpoint closed as it was sent may be sent again by
  // libcurl, unrecorded: one more copy of that event, same webhook-id, which a
  // receiver that deduplicates (as at-least-once delivery requires) drops.
  bool keep_alive = false;
  // NATS JetStream: server URL and stream (created with subjects "waystone.>"
  // when missing); each event is published on a subject equal to its type.
  std::string nats_url;
  std::string stream = "WAYSTONE";

  // Returns true when this sink takes an event of `type` from `workflow`.
  bool Wants(const std::string& type, const std::string& workflow) const;
  // Returns true when this sink takes events of `tenant` at all.
  bool Serves(const std::string& tenant) const;
};

struct RelayConfig {
  // Names this deployment in CloudEvents `source`: waystone://<deployment>/<workflow>.
  std::string deployment = "waystone";
  std::vector<SinkConfig> sinks;
  // The sink that receives alert events (waystone.alert.*); empty: none.
  std::string alert_sink;
  // Delivery retries; a delivery failing this many times is parked and alerted.
  RetryPolicy retry{10, 500, 60'000, 2.0};
  // How long a relay owns a claimed delivery.
  Millis lease = 30'000;
  // An unknown step outcome unresolved for this long raises an alert.
  Millis unknown_alert_after = 15 * 60'000;
  // Deliveries claimed per round (at most one per instance and sink); their
  // outcomes are marked in one transaction.
  int batch = 256;
  // Deliveries in flight at once (threads of the relay's delivery pool); each is
  // of another instance or sink, so order per instance and sink is kept.
  int parallel = 16;
  // Idle polling interval.
  Millis poll_interval = 100;
};

// Loads a relay config (YAML). Errors name the file and line; secrets are read from
// the environment variable or file each sink names.
absl::StatusOr<RelayConfig> LoadRelayConfig(const std::string& path);
absl::StatusOr<RelayConfig> ParseRelayConfig(const std::string& text, const std::string& source);

// With tenants configured (the server config's `tenants:`, here their names), every
// sink must list the tenants it serves, each of them configured: a sink without
// `tenants:` would receive every tenant's events. InvalidArgument naming the sink.
absl::Status CheckSinkTenants(const RelayConfig& config, const std::vector<std::string>& tenants);

}  // namespace waystone
