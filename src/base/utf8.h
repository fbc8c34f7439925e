#pragma once

#include <cstddef>
#include <string_view>

namespace waystone {

// Returns the offset of the first byte of `text` that is not part of well-formed
// UTF-8 (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF), or
// std::string_view::npos when all of it is.
size_t FirstInvalidUtf8(std::string_view text);

}  // namespace waystone
