#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "engine/tenant_policy.h"
#include "server/permissions.h"

namespace waystone {

// Where an incoming CloudEvent goes, chosen by its `type`.
struct EventRoute {
  std::string type;
  std::string start;       // start this workflow with the event's data as input, or
  std::string signal_key;  // complete the waiting step of the instance whose business
                           // key is at this JSON pointer into the data ("/order_ref"),
  int line = 0;            // in the config file
  // What a keyed route does: `signal:`, or (`decide:` / `revise:` with the same
  // `key`) decide its approval with the data's step, request, data_version, decision
  // and comment (as the token that sent the event), or revise its input with the
  // data's input and reason.
  std::string act = "signal";  // signal | decide | revise
};

// `waystone serve --config FILE`: the server's settings. Flags and environment
// variables override the file. Secrets never go here: the database password comes
// from WAYSTONE_DB or libpq's own PGPASSWORD/.pgpass, step secrets from
// WAYSTONE_SECRET_* or --secrets. A value type.
struct ServerConfig {
  std::string database;        // SQLite path or postgresql:// URI; "" = not set
  std::string listen;          // host:port; "" = not set
  int workers = 0;             // 0 = not set
  int max_in_flight = 0;       // instances held at once, calls under way included; 0 = not set
  std::string definitions;     // folder of workflow definitions
  std::string relay_config;    // relay config file: deliver outbox events too
  std::string metrics_listen;  // host:port of a token-less /metrics; "" = none
  std::string tls_cert_file;   // `tls: {cert_file, key_file}`: serve HTTPS; "" = HTTP
  std::string tls_key_file;
  // `tls.hsts_max_age`: seconds of Strict-Transport-Security on every HTTPS answer; 0 = none.
  int64_t tls_hsts_max_age = 0;
  std::string secrets_file;
  std::string files_dir;           // uploads' files (EngineOptions::files_dir)
  std::string lease;               // duration text, e.g. "30s"
  std::string step_key_retention;  // duration text; "" = not set
  size_t max_body_bytes = 1 << 20;
  int read_timeout_seconds = 10;
  Millis idempotency_retention = 24LL * 3600 * 1000;  // Idempotency-Key records
  std::vector<EventRoute> events;
  int max_connections = 1024;
  int max_connections_per_client = 256;  // api.max_connections_per_client
  int handler_threads = 8;
  // `tenants:`: per tenant, the workflows it may start, its secrets file and env.
  // Empty: one trust domain.
  std::map<std::string, TenantPolicy> tenants;
  std::map<std::string, int> tenant_lines;  // where each is named, for errors
  // `permissions:`: what each role may do, per tenant; empty = the defaults
  // (permissions.h).
  std::vector<PermissionRule> permissions;
  // `groups:`: per tenant, the token names of each approver group.
  std::vector<ApproverGroup> groups;
};

// Parses a config; errors name the file and line. Relative paths are taken from
// the config file's folder.
absl::StatusOr<ServerConfig> ParseServerConfig(const std::string& text, const std::string& source);
absl::StatusOr<ServerConfig> LoadServerConfig(const std::string& path);

}  // namespace waystone
