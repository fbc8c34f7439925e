#include "base/crash_point.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>

#include "base/clock.h"

namespace waystone {
namespace {

// Written once by ArmCrashPoint before the threads that read it start.
std::string armed_at;
int armed_occurrence = 0;
std::atomic<bool> armed{false};
std::atomic<int> armed_hits{0};

}  // namespace

void ArmCrashPoint(std::string at, int occurrence) {
  armed_at = std::move(at);
  armed_occurrence = occurrence < 1 ? 1 : occurrence;
  armed_hits = 0;
  armed.store(true, std::memory_order_release);
}

void CrashPoint([[maybe_unused]] std::string_view point, [[maybe_unused]] std::string_view step) {
  if (armed.load(std::memory_order_acquire)) {
    const std::string_view at(armed_at);
    if (at.size() == point.size() + 1 + step.size() && at.starts_with(point) &&
        at[point.size()] == ':' && at.ends_with(step) &&
        armed_hits.fetch_add(1) + 1 == armed_occurrence) {
      ::kill(::getpid(), SIGKILL);
    }
  }
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

bool TestSwitch([[maybe_unused]] std::string_view name) {
#ifdef WAYSTONE_CRASH_POINTS
  static const char* switches = std::getenv("WAYSTONE_TEST_SWITCH");
  if (switches == nullptr) return false;
  std::string_view rest(switches);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == name) return true;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
#endif
  return false;
}

}  // namespace waystone
