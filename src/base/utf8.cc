#include "base/utf8.h"

namespace waystone {

size_t FirstInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;   // no overlongs
      if (c == 0xED) high = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;   // no overlongs
      if (c == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      const unsigned char lo = k == 1 ? low : 0x80;
      const unsigned char hi = k == 1 ? high : 0xBF;
      if (next < lo || next > hi) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

namespace {

// The length of the invisible character at `text[i]` (0: none there). `text` from
// `i` on is assumed well-formed for the multi-byte forms.
size_t InvisibleAt(std::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x20 || c == 0x7F) return 1;
  auto byte = [&](size_t k) {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0;
  };
  if (c == 0xC2 && byte(1) >= 0x80 && byte(1) <= 0x9F) return 2;  // C1 controls
  if (c == 0xE2 && byte(1) == 0x80 &&
      ((byte(2) >= 0x8B && byte(2) <= 0x8F) || (byte(2) >= 0xAA && byte(2) <= 0xAE))) {
    return 3;  // zero-width space/joiners, LRM/RLM, LRE..RLO
  }
  if (c == 0xE2 && byte(1) == 0x81 && (byte(2) == 0xA0 || (byte(2) >= 0xA6 && byte(2) <= 0xA9))) {
    return 3;  // word joiner, LRI..PDI
  }
  if (c == 0xEF && byte(1) == 0xBB && byte(2) == 0xBF) return 3;  // zero-width no-break space
  return 0;
}

}  // namespace

bool HasInvisibleCharacter(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (InvisibleAt(text, i) != 0) return true;
  }
  return false;
}

bool HasLookAlikeMix(std::string_view text) {
  bool latin = false;
  bool confusable = false;  // Greek (U+0370-03FF) or Cyrillic (U+0400-052F)
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) latin = true;
    // Greek and Cyrillic letters lead with 0xCD-0xD4 (U+0340-052F); U+0340-036F are
    // combining marks, also refused beside Latin letters.
    if (c >= 0xCD && c <= 0xD4) confusable = true;
    // Fullwidth forms U+FF01-FF5E: EF BC 81-BF, EF BD 80-9E.
    if (c == 0xEF && i + 2 < text.size()) {
      const auto b1 = static_cast<unsigned char>(text[i + 1]);
      const auto b2 = static_cast<unsigned char>(text[i + 2]);
      if ((b1 == 0xBC && b2 >= 0x81) || (b1 == 0xBD && b2 <= 0x9E)) return true;
    }
  }
  return latin && confusable;
}

std::string Printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    // One character's bytes, when they are well-formed UTF-8.
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80                 ? 1
                          : c >= 0xC2 && c <= 0xDF ? 2
                          : c >= 0xE0 && c <= 0xEF ? 3
                          : c >= 0xF0 && c <= 0xF4 ? 4
                                                   : 0;
    const bool valid = length != 0 && i + length <= text.size() &&
                       FirstInvalidUtf8(text.substr(i, length)) == std::string_view::npos;
    size_t hidden = valid ? InvisibleAt(text, i) : 1;
    if (hidden == 0) {
      out.append(text.substr(i, length));
      i += length;
      continue;
    }
    for (; hidden > 0 && i < text.size(); --hidden, ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace waystone
