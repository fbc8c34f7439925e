#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
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
  // The caller's own wait: a fake clock moves forward instead of blocking.
  virtual void SleepFor(Millis duration, std::stop_token stop) const = 0;
  // Blocks until `duration` has passed on this clock or `stop` is requested. For
  // background timers: a fake clock blocks until something else moves it.
  virtual void WaitFor(Millis duration, std::stop_token stop) const = 0;
};

// SystemClock reads std::chrono::system_clock. Thread-safe, stateless.
class SystemClock final : public Clock {
 public:
  Millis NowMillis() const override;
  void SleepFor(Millis duration, std::stop_token stop) const override;
  void WaitFor(Millis duration, std::stop_token stop) const override { SleepFor(duration, stop); }
  // Returns the process-wide instance.
  static SystemClock* Get();
};

// FakeClock only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(Millis start) : now_(start) {}
  Millis NowMillis() const override { return now_.load(); }
  // Advances time instead of blocking.
  void SleepFor(Millis duration, std::stop_token) const override { Move(duration); }
  void WaitFor(Millis duration, std::stop_token stop) const override {
    const Millis deadline = now_.load() + duration;
    std::unique_lock<std::mutex> lock(mu_);
    moved_.wait(lock, stop, [&] { return now_.load() >= deadline; });
  }
  void Advance(Millis by) { Move(by); }
  void Set(Millis at) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ = at;
    moved_.notify_all();
  }

 private:
  void Move(Millis by) const {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += by;
    moved_.notify_all();
  }
  mutable std::atomic<Millis> now_;
  mutable std::mutex mu_;
  mutable std::condition_variable_any moved_;
};

}  // namespace waystone
