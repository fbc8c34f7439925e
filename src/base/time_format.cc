#include "base/time_format.h"

#include <cstdio>
#include <ctime>

namespace waystone {

std::string FormatRfc3339(Millis at) {
  const time_t seconds = static_cast<time_t>(at / 1000);
  tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  char millis[8];
  std::snprintf(millis, sizeof(millis), ".%03lldZ", static_cast<long long>(at % 1000));
  return std::string(text) + millis;
}

}  // namespace waystone
