#pragma once

#include <condition_variable>
#include <map>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "base/clock.h"
#include "base/mutex.h"

namespace waystone {

// Pacer runs jobs no earlier than their time on `clock`: the calls a target's rate
// limit gave a later slot wait here, holding no worker. Jobs due at the same time
// run in the order given. The destructor waits for every job still queued (a rate
// slot is at most a second ahead), so nothing given to it is dropped.
// Thread-safe.
class Pacer {
 public:
  explicit Pacer(const Clock* clock);
  ~Pacer();
  Pacer(const Pacer&) = delete;
  Pacer& operator=(const Pacer&) = delete;

  // Runs `job` on the pacer's thread at `at` (at once when that has passed).
  void At(Millis at, absl::AnyInvocable<void() &&> job);

 private:
  void Loop(std::stop_token stop);

  const Clock* clock_;
  Mutex mu_;
  std::condition_variable_any changed_;
  std::multimap<Millis, absl::AnyInvocable<void() &&>> jobs_ ABSL_GUARDED_BY(mu_);
  std::jthread thread_;  // last: started once the rest exists
};

}  // namespace waystone
