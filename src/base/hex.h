#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace waystone {

// `bytes` as lowercase hex, two characters each.
std::string HexOf(std::string_view bytes);

// The bytes of lowercase hex text; nullopt for anything else.
std::optional<std::string> FromHex(std::string_view hex);

}  // namespace waystone
