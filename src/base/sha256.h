#pragma once

#include <string>
#include <string_view>

namespace waystone {

// Returns the SHA-256 digest of `data` as 64 lowercase hex characters.
std::string Sha256Hex(std::string_view data);

}  // namespace waystone
