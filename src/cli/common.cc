#include "cli/common.h"

#include <cstdio>
#include <cstdlib>

#include "base/clock.h"
#include "definition/loader.h"
#include "server/server_config.h"

namespace waystone::cli {

std::string DatabasePath(const GlobalOptions& global) {
  if (!global.db.empty()) return global.db;
  if (const char* env = std::getenv("WAYSTONE_DB"); env != nullptr && *env != '\0') return env;
  return "waystone.db";
}

absl::StatusOr<std::unique_ptr<Store>> OpenStoreFor(const GlobalOptions& global) {
  StoreOptions options;
  options.path = DatabasePath(global);
  options.attempts_per_step = global.attempts_per_step;
  options.synchronous = global.sqlite_synchronous;
  return OpenStore(options);
}

absl::StatusOr<std::unique_ptr<Store>> OpenStoreWaiting(const GlobalOptions& global,
                                                        Millis patience) {
  const Millis deadline = SystemClock::Get()->NowMillis() + patience;
  Millis backoff = 100;
  while (true) {
    auto store = OpenStoreFor(global);
    if (store.ok() || !absl::IsUnavailable(store.status()) ||
        SystemClock::Get()->NowMillis() + backoff > deadline) {
      return store;
    }
    std::fprintf(stderr, "waystone: %s; retrying in %lldms\n",
                 std::string(store.status().message()).c_str(), static_cast<long long>(backoff));
    SystemClock::Get()->SleepFor(backoff, std::stop_token());
    backoff = std::min<Millis>(backoff * 2, 5000);
  }
}

absl::StatusOr<std::string> TextOrFile(const std::string& arg, size_t max_bytes) {
  if (!arg.starts_with("@")) {
    if (arg.size() > max_bytes) {
      return absl::InvalidArgumentError("input is " + std::to_string(arg.size()) +
                                        " bytes; the limit is " + std::to_string(max_bytes));
    }
    return arg;
  }
  std::string text;
  auto status = ReadFileText(arg.substr(1), max_bytes, &text);
  if (!status.ok()) return status;
  return text;
}

std::string ServerConfigPath(const GlobalOptions& global) {
  const char* env_config = std::getenv("WAYSTONE_CONFIG");
  return !global.config.empty() ? global.config : env_config != nullptr ? env_config : "";
}

absl::StatusOr<std::map<std::string, TenantPolicy>> ConfiguredTenants(const GlobalOptions& global) {
  if (global.tenants) return *global.tenants;
  const std::string path = ServerConfigPath(global);
  if (path.empty()) return std::map<std::string, TenantPolicy>();
  auto config = LoadServerConfig(path);
  if (!config.ok()) return config.status();
  return config->tenants;
}

absl::Status CheckRelayTenants(const GlobalOptions& global, const RelayConfig& relay) {
  auto tenants = ConfiguredTenants(global);
  if (!tenants.ok()) return tenants.status();
  std::vector<std::string> names;
  for (const auto& [name, policy] : *tenants) names.push_back(name);
  return CheckSinkTenants(relay, names);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "waystone: %s\n", std::string(status.message()).c_str());
  return kExitError;
}

}  // namespace waystone::cli
