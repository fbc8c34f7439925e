#pragma once

// For .cc files that already use nlohmann/json (it includes it): keep it out of
// widely included headers.

#include <string>

#include <nlohmann/json.hpp>

namespace waystone {

// Serializes `value` as JSON text. Strings from outside (a downstream answer, a
// CloudEvent header, a definition) may hold invalid UTF-8; nlohmann's dump() throws
// on it, which would take a worker or the server down. Here each invalid byte
// becomes U+FFFD instead: the text is always produced.
inline std::string JsonText(const nlohmann::json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace waystone
