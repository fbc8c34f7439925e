#include "base/crash_point.h"

#include <csignal>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace waystone {

void CrashPoint([[maybe_unused]] std::string_view point, [[maybe_unused]] std::string_view step) {
#ifdef WAYSTONE_CRASH_POINTS
  static const char* target = std::getenv("WAYSTONE_CRASH_AT");
  if (target == nullptr) return;
  std::string here;
  here.append(point).append(":").append(step);
  if (here == target) ::kill(::getpid(), SIGKILL);
#endif
}

}  // namespace waystone
