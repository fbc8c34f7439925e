#pragma once

// The one way Waystone's YAML config files are read (`waystone serve --config`,
// the relay config): parsed with yaml-cpp, and every error, malformed YAML too,
// as "FILE:LINE: message". Includes yaml-cpp: for the config readers' .cc files
// only.

#include <set>
#include <string>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"
#include "base/clock.h"

namespace waystone {

// What a config reader needs besides yaml-cpp: errors at a node's line, unknown
// fields, scalars, durations and paths relative to the file. A reader derives
// from it (or holds one).
class YamlConfig {
 public:
  explicit YamlConfig(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  // "SOURCE:LINE: message", at `node`'s line (0 when the node is not there).
  absl::Status Error(const YAML::Node& node, const std::string& message) const;

  // Refuses the first key of `map` not in `fields`: "unknown field 'x'", and
  // " in WHERE" when `where` is given.
  absl::Status CheckFields(const YAML::Node& map, const std::set<std::string>& fields,
                           const std::string& where = "") const;

  // The scalar at `field`, or "" when absent or not a scalar.
  static std::string Text(const YAML::Node& map, const char* field);

  // `field` as a duration ("5s"); `fallback` when absent.
  absl::StatusOr<Millis> Duration(const YAML::Node& map, const char* field, Millis fallback) const;

  // `field` as true or false; `fallback` when absent. Anything else is an error
  // "OWNER: FIELD is true or false, not 'x'", `owner` naming what holds the field.
  absl::StatusOr<bool> Flag(const YAML::Node& map, const char* field, bool fallback,
                            const std::string& owner) const;

  // `path` taken from the config file's folder when relative; "" stays "".
  std::string Path(const std::string& path) const;

 private:
  std::string source_;
};

// "SOURCE:LINE: malformed YAML: ..." for an exception of yaml-cpp's.
absl::Status MalformedYaml(const std::string& source, const YAML::Exception& e);

// Reads a config file of at most 1 MiB into `text`.
absl::Status ReadConfigFile(const std::string& path, std::string* text);

// Parses `text`, the config named `source`, and returns what `read` makes of its
// root; malformed YAML (and anything yaml-cpp throws while reading) is an error at
// its line.
template <typename Read>
auto ParseYamlConfig(const std::string& text, const std::string& source, Read read)
    -> decltype(read(YAML::Node())) {
  try {
    return read(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    return MalformedYaml(source, e);
  }
}

// Reads the config file at `path` and returns `parse(text, path)`.
template <typename Parse>
auto LoadYamlConfig(const std::string& path, Parse parse)
    -> decltype(parse(std::string(), std::string())) {
  std::string text;
  if (auto status = ReadConfigFile(path, &text); !status.ok()) return status;
  return parse(text, path);
}

}  // namespace waystone
