#pragma once

#include <atomic>
#include <cstdint>
#include <stop_token>

namespace waystone {

// Milliseconds since the Unix epoch; the one time unit persisted by Waystone.
using Millis = int64_t;

// Clock is the injected source of time. Engine code never reads the system clock
// directly, so tests can drive time with FakeClock. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // Returns the current wall-clock time in milliseconds since the epoch.
  virtual Millis NowMillis() const = 0;
  // Blocks for `duration` or until `stop` is requested, whichever comes first.
  virtual void SleepFor(Millis duration, std::stop_token stop) const = 0;
};

// SystemClock reads std::chrono::system_clock. Thread-safe, stateless.
class SystemClock final : public Clock {
 public:
  Millis NowMillis() const override;
  void SleepFor(Millis duration, std::stop_token stop) const override;
  // Returns the process-wide instance.
  static SystemClock* Get();
};

// FakeClock only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(Millis start) : now_(start) {}
  Millis NowMillis() const override { return now_.load(); }
  // Advances time instead of blocking.
  void SleepFor(Millis duration, std::stop_token) const override { now_ += duration; }
  void Advance(Millis by) { now_ += by; }
  void Set(Millis at) { now_ = at; }

 private:
  mutable std::atomic<Millis> now_;
};

}  // namespace waystone
