#include "messaging/relay_config.h"

#include <cstdlib>
#include <set>

#include "base/redact.h"
#include "definition/loader.h"
#include "definition/yaml_config.h"

namespace waystone {
namespace {

bool Matches(const std::string& pattern, const std::string& type) {
  if (pattern == "*") return true;
  if (!pattern.empty() && pattern.back() == '*') {
    return type.starts_with(pattern.substr(0, pattern.size() - 1));
  }
  return pattern == type;
}

class ConfigReader : public YamlConfig {
 public:
  using YamlConfig::YamlConfig;

  absl::StatusOr<RelayConfig> Read(const YAML::Node& root) {
    RelayConfig config;
    if (!root.IsMap()) return Error(root, "a relay config is a mapping with 'sinks'");
    static const std::set<std::string> kFields = {"deployment", "sinks",    "alert_sink",
                                                  "retry",      "lease",    "unknown_alert_after",
                                                  "batch",      "parallel", "poll_interval"};
    if (auto status = CheckFields(root, kFields); !status.ok()) return status;
    if (root["deployment"]) config.deployment = root["deployment"].Scalar();
    if (root["alert_sink"]) config.alert_sink = root["alert_sink"].Scalar();
    if (auto s = Duration(root, "lease", config.lease); !s.ok())
      return s.status();
    else
      config.lease = *s;
    if (auto s = Duration(root, "unknown_alert_after", config.unknown_alert_after); !s.ok()) {
      return s.status();
    } else {
      config.unknown_alert_after = *s;
    }
    if (auto s = Duration(root, "poll_interval", config.poll_interval); !s.ok())
      return s.status();
    else
      config.poll_interval = *s;
    if (const YAML::Node batch = root["batch"]) {
      if (!YAML::convert<int>::decode(batch, config.batch) || config.batch < 1) {
        return Error(batch, "'batch' must be a positive whole number");
      }
    }
    if (const YAML::Node parallel = root["parallel"]) {
      if (!YAML::convert<int>::decode(parallel, config.parallel) || config.parallel < 1 ||
          config.parallel > 256) {
        return Error(parallel, "'parallel' must be a whole number from 1 to 256");
      }
    }
    if (const YAML::Node retry = root["retry"]) {
      if (!retry.IsMap()) return Error(retry, "'retry' must be a mapping");
      if (const YAML::Node n = retry["max_attempts"]) {
        if (!YAML::convert<int>::decode(n, config.retry.max_attempts) ||
            config.retry.max_attempts < 1) {
          return Error(n, "'max_attempts' must be a positive whole number");
        }
      }
      auto initial = Duration(retry, "initial_interval", config.retry.initial_interval);
      if (!initial.ok()) return initial.status();
      config.retry.initial_interval = *initial;
      auto max = Duration(retry, "max_interval", config.retry.max_interval);
      if (!max.ok()) return max.status();
      config.retry.max_interval = *max;
    }
    const YAML::Node sinks = root["sinks"];
    if (!sinks || !sinks.IsSequence() || sinks.size() == 0) {
      return Error(root, "'sinks' must be a non-empty list");
    }
    std::set<std::string> names;
    for (const auto& node : sinks) {
      auto sink = ReadSink(node);
      if (!sink.ok()) return sink.status();
      if (!names.insert(sink->name).second)
        return Error(node, "duplicate sink '" + sink->name + "'");
      config.sinks.push_back(std::move(*sink));
    }
    if (!config.alert_sink.empty() && !names.contains(config.alert_sink)) {
      return Error(root["alert_sink"], "alert_sink '" + config.alert_sink + "' is not a sink");
    }
    return config;
  }

 private:
  absl::StatusOr<std::vector<std::string>> List(const YAML::Node& node) {
    std::vector<std::string> out;
    if (!node) return out;
    if (!node.IsSequence()) return Error(node, "expected a list of strings");
    for (const auto& item : node) out.push_back(item.Scalar());
    return out;
  }

  absl::StatusOr<SinkConfig> ReadSink(const YAML::Node& node) {
    SinkConfig sink;
    if (!node.IsMap()) return Error(node, "a sink is a mapping with 'name' and 'type'");
    static const std::set<std::string> kFields = {
        "name",       "type",        "events",  "workflows",  "tenants", "url",
        "secret_env", "secret_file", "timeout", "keep_alive", "stream"};
    if (auto status = CheckFields(node, kFields, "sink"); !status.ok()) return status;
    if (!node["name"]) return Error(node, "sink needs 'name'");
    sink.name = node["name"].Scalar();
    const std::string type = node["type"] ? node["type"].Scalar() : "";
    if (type == "webhook") {
      sink.kind = SinkKind::kWebhook;
    } else if (type == "nats") {
      sink.kind = SinkKind::kNats;
    } else {
      return Error(node["type"] ? node["type"] : node,
                   "sink '" + sink.name + "': type must be webhook or nats");
    }
    auto events = List(node["events"]);
    if (!events.ok()) return events.status();
    sink.events = *events;
    auto workflows = List(node["workflows"]);
    if (!workflows.ok()) return workflows.status();
    sink.workflows = *workflows;
    auto tenants = List(node["tenants"]);
    if (!tenants.ok()) return tenants.status();
    sink.tenants = *tenants;
    if (!node["url"]) return Error(node, "sink '" + sink.name + "' needs 'url'");
    const std::string url = node["url"].Scalar();
    // A field of the other kind would be ignored: said instead.
    static const std::set<std::string> kWebhookOnly = {"secret_env", "secret_file", "timeout",
                                                       "keep_alive"};
    for (const auto& field : node) {
      const std::string name = field.first.Scalar();
      const bool other =
          sink.kind == SinkKind::kNats ? kWebhookOnly.contains(name) : name == "stream";
      if (other) {
        return Error(field.first, "sink '" + sink.name + "': '" + name + "' is for " +
                                      (sink.kind == SinkKind::kNats ? "webhook" : "nats") +
                                      " sinks, and this one is " +
                                      (sink.kind == SinkKind::kNats ? "nats" : "a webhook"));
      }
    }
    if (sink.kind == SinkKind::kNats) {
      sink.nats_url = url;
      if (node["stream"]) sink.stream = node["stream"].Scalar();
      return sink;
    }
    sink.url = url;
    auto timeout = Duration(node, "timeout", sink.timeout);
    if (!timeout.ok()) return timeout.status();
    sink.timeout = *timeout;
    auto keep_alive = Flag(node, "keep_alive", sink.keep_alive, "sink '" + sink.name + "'");
    if (!keep_alive.ok()) return keep_alive.status();
    sink.keep_alive = *keep_alive;
    if (const YAML::Node env = node["secret_env"]) {
      const char* value = std::getenv(env.Scalar().c_str());
      if (value == nullptr || *value == '\0') {
        return Error(
            env, "sink '" + sink.name + "': environment variable " + env.Scalar() + " is not set");
      }
      sink.secret = value;
      RegisterSecretValue(sink.secret);
    } else if (const YAML::Node file = node["secret_file"]) {
      std::string text;
      auto status = ReadFileText(file.Scalar(), 4096, &text);
      if (!status.ok()) return Error(file, std::string(status.message()));
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
      sink.secret = text;
      RegisterSecretValue(sink.secret);
    } else {
      return Error(node, "webhook sink '" + sink.name + "' needs 'secret_env' or 'secret_file'");
    }
    if (sink.secret.size() < kMinRedactedSecret + 6) {
      return Error(node, "webhook sink '" + sink.name +
                             "': the secret is too short to be told "
                             "apart when echoed (whsec_ and at least " +
                             std::to_string(kMinRedactedSecret) + " characters)");
    }
    if (!sink.secret.starts_with("whsec_")) {
      return Error(node, "webhook sink '" + sink.name + "': the secret must start with whsec_");
    }
    return sink;
  }
};

}  // namespace

bool SinkConfig::Wants(const std::string& type, const std::string& workflow) const {
  if (!workflows.empty() &&
      std::find(workflows.begin(), workflows.end(), workflow) == workflows.end()) {
    return false;
  }
  if (events.empty()) return !type.starts_with("waystone.alert.");
  for (const auto& pattern : events) {
    if (Matches(pattern, type)) return true;
  }
  return false;
}

bool SinkConfig::Serves(const std::string& tenant) const {
  return tenants.empty() || std::find(tenants.begin(), tenants.end(), tenant) != tenants.end();
}

absl::Status CheckSinkTenants(const RelayConfig& config, const std::vector<std::string>& tenants) {
  if (tenants.empty()) return absl::OkStatus();
  for (const SinkConfig& sink : config.sinks) {
    if (sink.tenants.empty()) {
      return absl::InvalidArgumentError(
          "sink '" + sink.name +
          "' names no 'tenants': with tenants configured, each sink "
          "lists the tenants whose events it receives (it would receive every tenant's)");
    }
    for (const std::string& tenant : sink.tenants) {
      if (std::find(tenants.begin(), tenants.end(), tenant) == tenants.end()) {
        return absl::InvalidArgumentError("sink '" + sink.name + "' names tenant '" + tenant +
                                          "', which is not configured (tenants:)");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RelayConfig> ParseRelayConfig(const std::string& text, const std::string& source) {
  return ParseYamlConfig(text, source,
                         [&](const YAML::Node& root) { return ConfigReader(source).Read(root); });
}

absl::StatusOr<RelayConfig> LoadRelayConfig(const std::string& path) {
  return LoadYamlConfig(path, ParseRelayConfig);
}

}  // namespace waystone
