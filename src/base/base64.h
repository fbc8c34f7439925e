#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace waystone {

// Returns `bytes` in base64 (RFC 4648 §4, padded).
std::string Base64Encode(std::string_view bytes);

// Decodes base64 (RFC 4648 §4; padding optional; whitespace between groups, as in
// MIME's 76-column lines, ignored); nullopt for any other character or a bad length.
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace waystone
