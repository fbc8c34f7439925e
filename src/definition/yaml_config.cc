#include "definition/yaml_config.h"

#include <filesystem>

#include "definition/loader.h"
#include "model/duration.h"

namespace waystone {

absl::Status YamlConfig::Error(const YAML::Node& node, const std::string& message) const {
  const int line = node.IsDefined() ? node.Mark().line + 1 : 0;
  return absl::InvalidArgumentError(source_ + ":" + std::to_string(line) + ": " + message);
}

absl::Status YamlConfig::CheckFields(const YAML::Node& map, const std::set<std::string>& fields,
                                     const std::string& where) const {
  for (const auto& entry : map) {
    if (!fields.contains(entry.first.Scalar())) {
      return Error(entry.first, "unknown field '" + entry.first.Scalar() + "'" +
                                    (where.empty() ? "" : " in " + where));
    }
  }
  return absl::OkStatus();
}

std::string YamlConfig::Text(const YAML::Node& map, const char* field) {
  const YAML::Node node = map[field];
  return node && node.IsScalar() ? node.Scalar() : "";
}

absl::StatusOr<Millis> YamlConfig::Duration(const YAML::Node& map, const char* field,
                                            Millis fallback) const {
  const YAML::Node node = map[field];
  if (!node) return fallback;
  auto parsed = node.IsScalar() ? ParseDuration(node.Scalar()) : std::nullopt;
  if (!parsed) return Error(node, std::string("'") + field + "' must be a duration such as 5s");
  return *parsed;
}

absl::StatusOr<bool> YamlConfig::Flag(const YAML::Node& map, const char* field, bool fallback,
                                      const std::string& owner) const {
  const YAML::Node node = map[field];
  if (!node) return fallback;
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  if (text == "true" || text == "false") return text == "true";
  return Error(node, owner + ": " + field + " is true or false" +
                         (node.IsScalar() ? ", not '" + text + "'" : ""));
}

std::string YamlConfig::Path(const std::string& path) const {
  if (path.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(source_).parent_path() / path).lexically_normal().string();
}

absl::Status MalformedYaml(const std::string& source, const YAML::Exception& e) {
  return absl::InvalidArgumentError(source + ":" + std::to_string(e.mark.line + 1) +
                                    ": malformed YAML: " + e.msg);
}

absl::Status ReadConfigFile(const std::string& path, std::string* text) {
  return ReadFileText(path, 1 << 20, text);
}

}  // namespace waystone
