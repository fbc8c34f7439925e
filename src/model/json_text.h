#pragma once

// For .cc files that already use nlohmann/json (it includes it): keep it out of
// widely included headers.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "base/json_depth.h"
#include "base/redact.h"

namespace waystone {

// Serializes `value` as JSON text. Strings from outside (a downstream answer, a
// CloudEvent header, a definition) may hold invalid UTF-8; nlohmann's dump() throws
// on it, which would take a worker or the server down. Here each invalid byte
// becomes U+FFFD instead: the text is always produced.
inline std::string JsonText(const nlohmann::json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Replaces every registered secret inside the strings (and member names) of
// `value`: the JSON stays JSON whatever a secret looks like. What we hold nests at
// most kMaxJsonDepth levels inside a few of our own; anything deeper still is
// redacted as text (it becomes a string) rather than walked.
inline void RedactStrings(nlohmann::json& value, int depth = 0) {
  if (depth > kMaxJsonDepth + 16 && value.is_structured()) {
    value = RedactSecrets(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else if (value.is_string()) {
    value = RedactSecrets(value.get_ref<const std::string&>());
  } else if (value.is_array()) {
    for (auto& element : value) RedactStrings(element, depth + 1);
  } else if (value.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      nlohmann::json member = std::move(it.value());
      RedactStrings(member, depth + 1);
      out[RedactSecrets(it.key())] = std::move(member);
    }
    value = std::move(out);
  }
}

// RedactStrings on JSON text; text that is not JSON is redacted as text.
inline std::string RedactJsonText(const std::string& text) {
  if (text.empty() || !HaveSecrets()) return text;
  if (JsonNestsDeeperThan(text)) return RedactSecrets(text);
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return RedactSecrets(text);
  RedactStrings(value);
  return JsonText(value);
}

// Returns the value at JSON pointer `pointer` in `root`, or nullptr when it is absent
// or the pointer is malformed or does not fit (an index into an object).
inline const nlohmann::json* AtPointer(const nlohmann::json& root, const std::string& pointer) {
  try {
    const nlohmann::json::json_pointer at(pointer);
    return root.contains(at) ? &root.at(at) : nullptr;
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
}

// Parses JSON that came from outside: refused, with `what` named, when it is not
// JSON (nlohmann also refuses ill-formed UTF-8 in strings) or nests deeper than
// kMaxJsonDepth. Never throws; bounded whatever the input.
inline absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text,
                                                       std::string_view what) {
  if (JsonNestsDeeperThan(text)) {
    return absl::InvalidArgumentError(std::string(what) + " nests arrays and objects deeper than " +
                                      std::to_string(kMaxJsonDepth) + " levels");
  }
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return absl::InvalidArgumentError(std::string(what) + " is not valid JSON");
  return parsed;
}

}  // namespace waystone
