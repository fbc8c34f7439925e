#include "model/duration.h"

#include <charconv>
#include <cmath>
#include <string>

namespace waystone {

std::optional<Millis> ParseDuration(std::string_view text) {
  size_t unit_at = 0;
  while (unit_at < text.size() &&
         ((text[unit_at] >= '0' && text[unit_at] <= '9') || text[unit_at] == '.')) {
    ++unit_at;
  }
  if (unit_at == 0) return std::nullopt;
  const std::string number(text.substr(0, unit_at));
  const std::string_view unit = text.substr(unit_at);
  double value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || end != number.data() + number.size()) return std::nullopt;
  double scale = 0;
  if (unit.empty() || unit == "ms")
    scale = 1;
  else if (unit == "s")
    scale = 1000;
  else if (unit == "m")
    scale = 60'000;
  else if (unit == "h")
    scale = 3'600'000;
  else if (unit == "d")
    scale = 86'400'000;
  else
    return std::nullopt;
  const double ms = value * scale;
  if (!std::isfinite(ms) || ms < 0 || ms > 1e15) return std::nullopt;
  return static_cast<Millis>(std::llround(ms));
}

std::string FormatDuration(Millis duration) {
  struct Unit {
    Millis size;
    const char* suffix;
  };
  static constexpr Unit kUnits[] = {
      {86'400'000, "d"}, {3'600'000, "h"}, {60'000, "m"}, {1000, "s"}};
  for (const Unit& unit : kUnits) {
    if (duration != 0 && duration % unit.size == 0) {
      return std::to_string(duration / unit.size) + unit.suffix;
    }
  }
  return std::to_string(duration) + "ms";
}

}  // namespace waystone
