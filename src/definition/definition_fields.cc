// DefinitionFields: the fields of a definition's YAML, with their problems recorded.

#include <optional>

#include "base/json_depth.h"
#include "definition/definition_readers.h"
#include "model/duration.h"

namespace waystone {

using Json = nlohmann::json;

bool ValidJsonPointer(const std::string& text) {
  if (text.size() < 2 || text.front() != '/') return false;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '~' && (i + 1 == text.size() || (text[i + 1] != '0' && text[i + 1] != '1'))) {
      return false;
    }
  }
  return true;
}

bool DefinitionFields::ValidName(const std::string& name) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return !name.empty();
}

void DefinitionFields::Error(const YAML::Node& node, const std::string& step,
                             const std::string& message) {
  const int line = node.IsDefined() ? node.Mark().line + 1 : 0;
  diagnostics_->push_back({std::string(source_), line, step, message});
}

void DefinitionFields::CheckFields(const YAML::Node& map, const std::string& step,
                                   std::initializer_list<std::string_view> allowed,
                                   const std::string& where) {
  if (!map.IsMap()) return;
  for (const auto& entry : map) {
    const std::string key = entry.first.Scalar();
    bool known = false;
    for (auto name : allowed) known = known || key == name;
    if (!known) {
      std::string list;
      for (auto name : allowed) list += (list.empty() ? "" : ", ") + std::string(name);
      Error(entry.first, step,
            "unknown field '" + key + "' in " + where + " (allowed: " + list + ")");
    }
  }
}

std::string DefinitionFields::RequiredString(const YAML::Node& map, const char* field,
                                             const std::string& step) {
  const YAML::Node node = map[field];
  if (!node) {
    Error(map, step, std::string("missing field '") + field + "'");
    return "";
  }
  if (!node.IsScalar() || node.Scalar().empty()) {
    Error(node, step, std::string("'") + field + "' must be a non-empty string");
    return "";
  }
  return node.Scalar();
}

std::string DefinitionFields::OptionalString(const YAML::Node& map, const char* field,
                                             const std::string& step) {
  const YAML::Node node = map[field];
  if (!node) return "";
  if (!node.IsScalar()) {
    Error(node, step, std::string("'") + field + "' must be a string");
    return "";
  }
  return node.Scalar();
}

Millis DefinitionFields::Duration(const YAML::Node& map, const char* field, Millis fallback,
                                  const std::string& step) {
  const YAML::Node node = map[field];
  if (!node) return fallback;
  auto parsed = node.IsScalar() ? ParseDuration(node.Scalar()) : std::nullopt;
  if (!parsed.has_value()) {
    Error(node, step, std::string("'") + field + "' must be a duration such as 200ms, 2s or 1m");
    return fallback;
  }
  return *parsed;
}

Json DefinitionFields::ToJson(const YAML::Node& node, const std::string& step, int depth) {
  if ((node.IsMap() || node.IsSequence()) && depth >= kMaxJsonDepth) {
    Error(node, step,
          "nests mappings and lists deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return nullptr;
  }
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& entry : node) {
        out[entry.first.Scalar()] = ToJson(entry.second, step, depth + 1);
      }
      return out;
    }
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& element : node) out.push_back(ToJson(element, step, depth + 1));
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "?") {
        if (text == "true") return true;
        if (text == "false") return false;
        if (text == "null" || text == "~") return nullptr;
        Json number = Json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (number.is_number()) return number;
      }
      return text;
    }
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
  }
  return nullptr;
}

int DefinitionFields::WholeNumber(const YAML::Node& map, const char* field, int low, int high,
                                  const std::string& what) {
  const YAML::Node node = map[field];
  if (!node) return 0;
  int value = 0;
  if (!YAML::convert<int>::decode(node, value) || value < low || value > high) {
    Error(node, "",
          what + " must be a whole number from " + std::to_string(low) + " to " +
              std::to_string(high));
    return 0;
  }
  return value;
}

std::vector<std::pair<std::string, std::string>> DefinitionFields::PointerValues(
    const YAML::Node& map, const std::string& name, const std::string& what) {
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& entry : map) {
    const std::string pointer = entry.first.Scalar();
    CheckPointer(entry.first, name, pointer);
    if (!entry.second.IsScalar()) {
      Error(entry.second, name, what + " " + pointer + " must be a string");
      continue;
    }
    values.emplace_back(pointer, entry.second.Scalar());
  }
  return values;
}

void DefinitionFields::CheckPointer(const YAML::Node& node, const std::string& step,
                                    const std::string& pointer) {
  if (pointer.empty()) return;
  if (pointer[0] != '/') {
    Error(node, step, "'" + pointer + "' is not a JSON pointer (it must start with '/')");
  }
}

}  // namespace waystone
