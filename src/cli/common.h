#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "messaging/relay_config.h"
#include "store/store.h"

namespace waystone::cli {

// Returns the database named by --db, else WAYSTONE_DB, else ./waystone.db.
std::string DatabasePath(const GlobalOptions& global);

// Opens the store for a command.
absl::StatusOr<std::unique_ptr<Store>> OpenStoreFor(const GlobalOptions& global);

// Opens the store, retrying with backoff for up to `patience` while the database
// is unreachable (a long-running worker that starts before its database does).
absl::StatusOr<std::unique_ptr<Store>> OpenStoreWaiting(const GlobalOptions& global,
                                                        Millis patience);

// The server config this command obeys: --config, else WAYSTONE_CONFIG; "" for none.
std::string ServerConfigPath(const GlobalOptions& global);

// The tenants of that config (GlobalOptions::tenants once read); empty without one,
// or without `tenants:`.
absl::StatusOr<std::map<std::string, TenantPolicy>> ConfiguredTenants(const GlobalOptions& global);

// CheckSinkTenants against the configured tenants: with `tenants:`, each sink of
// `relay` lists its own.
absl::Status CheckRelayTenants(const GlobalOptions& global, const RelayConfig& relay);

// Returns `arg` itself, or the contents of the file when it starts with '@'.
absl::StatusOr<std::string> TextOrFile(const std::string& arg, size_t max_bytes);

// Prints "waystone: <message>" to stderr and returns kExitError.
int Fail(const absl::Status& status);

}  // namespace waystone::cli

namespace waystone::cli {

// Prints an instance with its steps, alerts and reason; JSON when `json`.
absl::Status PrintInstance(Store& store, const InstanceRecord& instance, bool json);

}  // namespace waystone::cli
