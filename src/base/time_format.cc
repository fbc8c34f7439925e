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

std::optional<Millis> ParseRfc3339(std::string_view text) {
  const std::string s(text);
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, used = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &year, &month, &day, &hour,
                  &minute, &second, &used) != 6 ||
      used != 19) {
    return std::nullopt;
  }
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return std::nullopt;
  }
  size_t at = 19;
  Millis millis = 0;
  if (at < s.size() && s[at] == '.') {
    ++at;
    int digits = 0;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
      if (digits < 3) millis = millis * 10 + (s[at] - '0');
      ++digits;
      ++at;
    }
    if (digits == 0) return std::nullopt;
    for (int i = digits; i < 3; ++i) millis *= 10;
  }
  Millis offset = 0;
  if (at < s.size() && (s[at] == 'Z' || s[at] == 'z')) {
    ++at;
  } else if (at + 6 == s.size() && (s[at] == '+' || s[at] == '-') && s[at + 3] == ':') {
    int oh = 0, om = 0;
    if (std::sscanf(s.c_str() + at + 1, "%2d:%2d", &oh, &om) != 2) return std::nullopt;
    offset = (s[at] == '+' ? 1 : -1) * (oh * 3600000LL + om * 60000LL);
    at += 6;
  } else {
    return std::nullopt;
  }
  if (at != s.size()) return std::nullopt;
  tm utc{};
  utc.tm_year = year - 1900;
  utc.tm_mon = month - 1;
  utc.tm_mday = day;
  utc.tm_hour = hour;
  utc.tm_min = minute;
  utc.tm_sec = second;
  return static_cast<Millis>(timegm(&utc)) * 1000 + millis - offset;
}

}  // namespace waystone
