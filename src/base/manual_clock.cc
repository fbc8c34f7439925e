#include "base/manual_clock.h"

namespace waystone {
namespace {

// A FakeClock whose SleepFor is the caller's own wait in real time (a claim waiting
// for a lease, say), so the engine never moves the test's time itself.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Millis start) : time_(start) {}
  Millis NowMillis() const override { return time_.NowMillis(); }
  void SleepFor(Millis duration, std::stop_token stop) const override {
    SystemClock::Get()->SleepFor(duration, std::move(stop));
  }
  void WaitFor(Millis duration, std::stop_token stop) const override {
    time_.WaitFor(duration, std::move(stop));
  }
  void Advance(Millis by) { time_.Advance(by); }

 private:
  FakeClock time_;
};

}  // namespace

std::unique_ptr<Clock> MakeManualClock(Millis start) {
  return std::make_unique<ManualClock>(start);
}

void AdvanceManualClock(const Clock& clock, Millis by) {
  // Only MakeManualClock's clocks come here; their time is the test's to move.
  const_cast<ManualClock&>(static_cast<const ManualClock&>(clock)).Advance(by);
}

}  // namespace waystone
