#include "engine/pacer.h"

#include <algorithm>
#include <chrono>

namespace waystone {

Pacer::Pacer(const Clock* clock)
    : clock_(clock), thread_([this](std::stop_token stop) { Loop(stop); }) {}

Pacer::~Pacer() {
  thread_.request_stop();
  changed_.notify_all();
  thread_.join();
}

void Pacer::At(Millis at, absl::AnyInvocable<void() &&> job) {
  {
    MutexLock lock(mu_);
    jobs_.emplace(at, std::move(job));
  }
  changed_.notify_all();
}

void Pacer::Loop(std::stop_token stop) {
  while (true) {
    absl::AnyInvocable<void() &&> job;
    {
      MutexLock lock(mu_);
      while (!job) {
        if (jobs_.empty()) {
          if (stop.stop_requested()) return;  // only once every job has run
          changed_.wait(lock.native(), stop,
                        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !jobs_.empty(); });
          continue;
        }
        // Real time between looks at the clock, whose time the slot names.
        const Millis wait = jobs_.begin()->first - clock_->NowMillis();
        if (wait > 0) {
          changed_.wait_for(lock.native(), std::chrono::milliseconds(std::min<Millis>(wait, 50)));
          continue;
        }
        job = std::move(jobs_.begin()->second);
        jobs_.erase(jobs_.begin());
      }
    }
    std::move(job)();
  }
}

}  // namespace waystone
