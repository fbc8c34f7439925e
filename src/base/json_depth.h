#pragma once

#include <cstddef>
#include <string_view>

namespace waystone {

// The deepest a JSON text we accept may nest arrays and objects. Anything we parse
// from outside (API bodies, CloudEvents, operator payloads, downstream answers,
// definitions) is held to it, so that whatever we later serialize, copy or walk
// recursively is bounded. Real payloads nest a handful of levels.
inline constexpr int kMaxJsonDepth = 64;

// True when `text`, read as JSON, opens more than `max_depth` arrays and objects
// inside each other. Brackets inside strings do not count. Linear in the size of
// `text`, no allocation; it does not validate the text (the parser does that).
bool JsonNestsDeeperThan(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace waystone
