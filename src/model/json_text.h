#pragma once

// For .cc files that already use nlohmann/json (it includes it): keep it out of
// widely included headers.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "base/json_depth.h"

namespace waystone {

// Serializes `value` as JSON text. Strings from outside (a downstream answer, a
// CloudEvent header, a definition) may hold invalid UTF-8; nlohmann's dump() throws
// on it, which would take a worker or the server down. Here each invalid byte
// becomes U+FFFD instead: the text is always produced.
inline std::string JsonText(const nlohmann::json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
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
  if (parsed.is_discarded()) return absl::InvalidArgumentError(std::string(what) + " is not valid JSON");
  return parsed;
}

}  // namespace waystone
