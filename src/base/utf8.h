#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace waystone {

// Returns the offset of the first byte of `text` that is not part of well-formed
// UTF-8 (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF), or
// std::string_view::npos when all of it is.
size_t FirstInvalidUtf8(std::string_view text);

// True when well-formed UTF-8 `text` holds a character that changes how text shows
// rather than being shown: C0 and C1 controls (NUL, ESC, CR, LF, ...) and DEL, the
// bidirectional controls (U+200E/F, U+202A-E, U+2066-9) and the zero-width ones
// (U+200B-D, U+2060, U+FEFF). A name, key or label a person reads may hold none:
// "backdoor\0" or a terminal escape would show as something it is not.
bool HasInvisibleCharacter(std::string_view text);

// True when well-formed UTF-8 `text` could pass for another name of Latin letters:
// it mixes ASCII letters with Cyrillic or Greek letters ("аlice" with a Cyrillic а),
// or holds fullwidth ASCII forms (U+FF01-FF5E, "ａlice"). Names in one script
// (Latin, Cyrillic, Japanese, ...) pass.
bool HasLookAlikeMix(std::string_view text);

// `text` for a terminal: every byte HasInvisibleCharacter would object to, and every
// byte that is not well-formed UTF-8, as \xNN; the rest as is.
std::string Printable(std::string_view text);

}  // namespace waystone
