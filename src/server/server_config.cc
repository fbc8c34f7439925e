#include "server/server_config.h"

#include <set>
#include <tuple>

#include "definition/yaml_config.h"
#include "model/duration.h"
#include "model/keys.h"

namespace waystone {
namespace {

class ConfigReader : public YamlConfig {
 public:
  using YamlConfig::YamlConfig;

  absl::StatusOr<ServerConfig> Read(const YAML::Node& root) {
    ServerConfig config;
    if (!root.IsMap()) return Error(root, "a server config is a mapping");
    static const std::set<std::string> kFields = {
        "database",     "listen",       "workers",   "max_in_flight",  "definitions",
        "relay_config", "secrets_file", "files_dir", "lease",          "step_key_retention",
        "api",          "events",       "tenants",   "metrics_listen", "permissions",
        "tls",          "groups"};
    if (auto status = CheckFields(root, kFields); !status.ok()) return status;
    config.database = Text(root, "database");
    config.listen = Text(root, "listen");
    config.definitions = Path(Text(root, "definitions"));
    config.relay_config = Path(Text(root, "relay_config"));
    config.metrics_listen = Text(root, "metrics_listen");
    config.secrets_file = Path(Text(root, "secrets_file"));
    config.files_dir = Path(Text(root, "files_dir"));
    config.lease = Text(root, "lease");
    if (!config.lease.empty() && !ParseDuration(config.lease)) {
      return Error(root["lease"], "'lease' must be a duration such as 30s");
    }
    config.step_key_retention = Text(root, "step_key_retention");
    if (!config.step_key_retention.empty()) {
      auto parsed = ParseDuration(config.step_key_retention);
      if (!parsed || *parsed < 1000) {
        return Error(root["step_key_retention"],
                     "'step_key_retention' must be a duration of at least 1s, such as 30d");
      }
    }
    if (const YAML::Node tls = root["tls"]) {
      if (!tls.IsMap()) return Error(tls, "'tls' is a mapping with 'cert_file' and 'key_file'");
      if (auto status = CheckFields(tls, {"cert_file", "key_file", "hsts_max_age"}, "tls");
          !status.ok()) {
        return status;
      }
      if (const YAML::Node hsts = tls["hsts_max_age"]) {
        if (!YAML::convert<int64_t>::decode(hsts, config.tls_hsts_max_age) ||
            config.tls_hsts_max_age < 0) {
          return Error(hsts,
                       "'tls.hsts_max_age' must be a whole number of seconds from 0 "
                       "(0: no Strict-Transport-Security header)");
        }
      }
      config.tls_cert_file = Path(Text(tls, "cert_file"));
      config.tls_key_file = Path(Text(tls, "key_file"));
      if (config.tls_cert_file.empty() || config.tls_key_file.empty()) {
        return Error(tls, "'tls' needs both 'cert_file' and 'key_file' (PEM files)");
      }
    }
    if (const YAML::Node workers = root["workers"]) {
      if (!YAML::convert<int>::decode(workers, config.workers) || config.workers < 1) {
        return Error(workers, "'workers' must be a whole number from 1");
      }
    }
    if (const YAML::Node most = root["max_in_flight"]) {
      if (!YAML::convert<int>::decode(most, config.max_in_flight) || config.max_in_flight < 1 ||
          config.max_in_flight > 1'000'000) {
        return Error(most, "'max_in_flight' must be a whole number from 1 to 1000000");
      }
    }
    if (const YAML::Node api = root["api"]) {
      if (!api.IsMap()) return Error(api, "'api' is a mapping");
      static const std::set<std::string> kApiFields = {"max_body_bytes",
                                                       "read_timeout",
                                                       "idempotency_retention",
                                                       "max_connections",
                                                       "max_connections_per_client",
                                                       "handler_threads"};
      if (auto status = CheckFields(api, kApiFields, "api"); !status.ok()) return status;
      if (const YAML::Node bytes = api["max_body_bytes"]) {
        long long value = 0;
        if (!YAML::convert<long long>::decode(bytes, value) || value < 1024 ||
            value > (64LL << 20)) {
          return Error(bytes, "'max_body_bytes' must be from 1024 to 67108864");
        }
        config.max_body_bytes = static_cast<size_t>(value);
      }
      if (const YAML::Node timeout = api["read_timeout"]) {
        auto parsed = timeout.IsScalar() ? ParseDuration(timeout.Scalar()) : std::nullopt;
        if (!parsed || *parsed < 1000) return Error(timeout, "'read_timeout' must be at least 1s");
        config.read_timeout_seconds = static_cast<int>(*parsed / 1000);
      }
      for (const auto& [field, out, low, high] :
           {std::tuple{"max_connections", &config.max_connections, 8, 100000},
            std::tuple{"max_connections_per_client", &config.max_connections_per_client, 1, 100000},
            std::tuple{"handler_threads", &config.handler_threads, 1, 256}}) {
        if (const YAML::Node value = api[field]) {
          if (!YAML::convert<int>::decode(value, *out) || *out < low || *out > high) {
            return Error(value, "'" + std::string(field) + "' must be a whole number from " +
                                    std::to_string(low) + " to " + std::to_string(high));
          }
        }
      }
      if (const YAML::Node retention = api["idempotency_retention"]) {
        auto parsed = retention.IsScalar() ? ParseDuration(retention.Scalar()) : std::nullopt;
        if (!parsed || *parsed < 1000) {
          return Error(retention, "'idempotency_retention' must be a duration of at least 1s");
        }
        config.idempotency_retention = *parsed;
      }
    }
    if (const YAML::Node events = root["events"]) {
      if (!events.IsSequence()) return Error(events, "'events' is a list of routes");
      std::set<std::string> types;
      for (const auto& node : events) {
        auto route = ReadRoute(node);
        if (!route.ok()) return route.status();
        if (!types.insert(route->type).second) {
          return Error(node, "event type '" + route->type + "' is routed twice");
        }
        config.events.push_back(*route);
      }
    }
    if (const YAML::Node tenants = root["tenants"]) {
      if (!tenants.IsMap() || tenants.size() == 0) {
        return Error(tenants, "'tenants' maps each tenant to its workflows, secrets_file, env");
      }
      for (const auto& entry : tenants) {
        auto policy = ReadTenant(entry.first, entry.second);
        if (!policy.ok()) return policy.status();
        config.tenant_lines[entry.first.Scalar()] = entry.first.Mark().line + 1;
        config.tenants[entry.first.Scalar()] = std::move(*policy);
      }
    }
    if (const YAML::Node permissions = root["permissions"]) {
      if (!permissions.IsSequence()) {
        return Error(permissions, "'permissions' is a list of { role, tenant, actions }");
      }
      for (const auto& node : permissions) {
        auto rule = ReadPermission(node);
        if (!rule.ok()) return rule.status();
        for (const PermissionRule& other : config.permissions) {
          if (other.role == rule->role && other.tenant == rule->tenant) {
            return Error(node, "role '" + Text(node, "role") + "' has permissions for " +
                                   (rule->tenant.empty() ? "every tenant"
                                                         : "tenant '" + rule->tenant + "'") +
                                   " already, at line " + std::to_string(other.line));
          }
        }
        config.permissions.push_back(std::move(*rule));
      }
    }
    if (const YAML::Node groups = root["groups"]) {
      if (!groups.IsSequence()) {
        return Error(groups, "'groups' is a list of { tenant, name, tokens }");
      }
      for (const auto& node : groups) {
        auto group = ReadGroup(node);
        if (!group.ok()) return group.status();
        for (const ApproverGroup& other : config.groups) {
          if (other.tenant == group->tenant && other.name == group->name) {
            return Error(node, "group '" + group->name + "' of tenant '" + group->tenant +
                                   "' is named already, at line " + std::to_string(other.line));
          }
        }
        config.groups.push_back(std::move(*group));
      }
    }
    return config;
  }

 private:
  absl::StatusOr<ApproverGroup> ReadGroup(const YAML::Node& node) {
    ApproverGroup group;
    group.line = node.Mark().line + 1;
    if (!node.IsMap()) return Error(node, "a group is a mapping with 'tenant', 'name', 'tokens'");
    for (const auto& entry : node) {
      const std::string field = entry.first.Scalar();
      if (field != "tenant" && field != "name" && field != "tokens") {
        return Error(entry.first, "unknown field '" + field +
                                      "' in a group (allowed: tenant, "
                                      "name, tokens)");
      }
    }
    group.tenant = Text(node, "tenant");
    group.name = Text(node, "name");
    if (group.tenant.empty()) return Error(node, "a group needs its 'tenant'");
    if (group.name.empty()) return Error(node, "a group needs a 'name'");
    const YAML::Node tokens = node["tokens"];
    if (!tokens || !tokens.IsSequence() || tokens.size() == 0) {
      return Error(tokens ? tokens : node, "group '" + group.name +
                                               "' lists its members' token "
                                               "names in 'tokens', such as [alice, bob]");
    }
    for (const auto& token : tokens) {
      if (!token.IsScalar() || token.Scalar().empty()) {
        return Error(token, "group '" + group.name + "': a member is a token's name");
      }
      group.tokens.push_back(token.Scalar());
    }
    return group;
  }

  absl::StatusOr<PermissionRule> ReadPermission(const YAML::Node& node) {
    PermissionRule rule;
    rule.line = node.Mark().line + 1;
    if (!node.IsMap()) return Error(node, "a permission is a mapping with 'role' and 'actions'");
    if (auto status = CheckFields(node, {"role", "tenant", "actions"}, "permission");
        !status.ok()) {
      return status;
    }
    auto role = ParseRole(Text(node, "role"));
    if (!role) return Error(node, "a permission needs 'role': viewer, operator or admin");
    rule.role = *role;
    rule.tenant = Text(node, "tenant");
    if (node["tenant"] && !ValidTenantName(rule.tenant)) {
      return Error(node["tenant"],
                   "'" + rule.tenant +
                       "' is not a tenant name (1 to 64 letters, "
                       "digits, '.', '_' or '-'); leave 'tenant' out for every tenant");
    }
    const YAML::Node actions = node["actions"];
    if (!actions || !actions.IsSequence()) {
      return Error(actions ? actions : node,
                   "a permission needs 'actions', the list of all the role may do (retry, "
                   "confirm, compensate, skip, close, acknowledge, pause_target, revise, "
                   "see_redacted)");
    }
    for (const auto& action : actions) {
      auto permission = action.IsScalar() ? ParsePermission(action.Scalar()) : std::nullopt;
      if (!permission) {
        return Error(action, "'" + (action.IsScalar() ? action.Scalar() : std::string("?")) +
                                 "' is not one of retry, confirm, compensate, skip, close, "
                                 "acknowledge, pause_target, revise, see_redacted");
      }
      if (rule.role == Role::kViewer && *permission != Permission::kSeeRedacted) {
        return Error(action, "a viewer takes no actions; it may only be granted see_redacted");
      }
      rule.allowed.insert(*permission);
    }
    return rule;
  }

  absl::StatusOr<TenantPolicy> ReadTenant(const YAML::Node& name, const YAML::Node& node) {
    const std::string tenant = name.Scalar();
    if (!ValidTenantName(tenant)) {
      return Error(name, "'" + tenant +
                             "' is not a tenant name (1 to 64 letters, digits, '.', "
                             "'_' or '-')");
    }
    if (!node.IsMap()) return Error(node, "tenant '" + tenant + "' is a mapping with 'workflows'");
    if (auto status =
            CheckFields(node, {"workflows", "secrets_file", "env"}, "tenant '" + tenant + "'");
        !status.ok()) {
      return status;
    }
    TenantPolicy policy;
    const YAML::Node workflows = node["workflows"];
    if (!workflows || !workflows.IsSequence()) {
      return Error(workflows ? workflows : node,
                   "tenant '" + tenant + "' needs 'workflows', the list it may start");
    }
    for (const auto& workflow : workflows) {
      if (!workflow.IsScalar()) return Error(workflow, "a workflow is named by a string");
      policy.workflows.push_back(workflow.Scalar());
    }
    policy.secrets_file = Path(Text(node, "secrets_file"));
    if (const YAML::Node env = node["env"]) {
      if (!env.IsMap()) return Error(env, "'env' maps names to values");
      for (const auto& entry : env) {
        if (!entry.second.IsScalar()) return Error(entry.second, "an env value is a string");
        policy.env[entry.first.Scalar()] = entry.second.Scalar();
      }
    }
    return policy;
  }

  absl::StatusOr<EventRoute> ReadRoute(const YAML::Node& node) {
    EventRoute route;
    route.line = node.Mark().line + 1;
    if (!node.IsMap()) return Error(node, "an event route is a mapping with 'type'");
    if (auto status =
            CheckFields(node, {"type", "start", "signal", "decide", "revise"}, "event route");
        !status.ok()) {
      return status;
    }
    route.type = Text(node, "type");
    if (route.type.empty()) return Error(node, "event route needs 'type'");
    route.start = Text(node, "start");
    int acts = 0;
    for (const char* act : {"signal", "decide", "revise"}) {
      const YAML::Node signal = node[act];
      if (!signal) continue;
      ++acts;
      if (!signal.IsMap() || !signal["key"] || !signal["key"].IsScalar()) {
        return Error(signal,
                     "'" + std::string(act) + "' must be a mapping such as { key: /order_ref }");
      }
      route.act = act;
      route.signal_key = signal["key"].Scalar();
      if (!route.signal_key.starts_with("/")) {
        return Error(signal["key"], "'" + std::string(act) +
                                        ".key' is a JSON pointer into the event's data, "
                                        "starting with '/'");
      }
    }
    if ((route.start.empty() ? 0 : 1) + acts != 1) {
      return Error(node, "event route '" + route.type +
                             "' needs one of 'start', 'signal', 'decide' or 'revise'");
    }
    return route;
  }
};

}  // namespace

absl::StatusOr<ServerConfig> ParseServerConfig(const std::string& text, const std::string& source) {
  return ParseYamlConfig(text, source,
                         [&](const YAML::Node& root) { return ConfigReader(source).Read(root); });
}

absl::StatusOr<ServerConfig> LoadServerConfig(const std::string& path) {
  return LoadYamlConfig(path, ParseServerConfig);
}

}  // namespace waystone
