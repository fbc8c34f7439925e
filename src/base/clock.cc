#include "base/clock.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace waystone {

Millis SystemClock::NowMillis() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SystemClock::SleepFor(Millis duration, std::stop_token stop) const {
  if (duration <= 0) return;
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, stop, std::chrono::milliseconds(duration), [] { return false; });
}

SystemClock* SystemClock::Get() {
  static SystemClock clock;
  return &clock;
}

}  // namespace waystone
