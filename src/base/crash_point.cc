#include "base/crash_point.h"

#include <csignal>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include "base/clock.h"

namespace waystone {

void CrashPoint([[maybe_unused]] std::string_view point, [[maybe_unused]] std::string_view step) {
#ifdef WAYSTONE_CRASH_POINTS
  static const char* crash_at = std::getenv("WAYSTONE_CRASH_AT");
  static const char* pause_at = std::getenv("WAYSTONE_PAUSE_AT");
  if (crash_at == nullptr && pause_at == nullptr) return;
  std::string here;
  here.append(point).append(":").append(step);
  if (crash_at != nullptr && here == crash_at) ::kill(::getpid(), SIGKILL);
  if (pause_at != nullptr) {
    const std::string_view spec(pause_at);
    const size_t eq = spec.rfind('=');
    if (eq != std::string_view::npos && spec.substr(0, eq) == here) {
      const long ms = std::atol(std::string(spec.substr(eq + 1)).c_str());
      // The point is to stall the real process (a SIGSTOP-like pause): real time.
      SystemClock::Get()->SleepFor(ms, {});
    }
  }
#endif
}

}  // namespace waystone
