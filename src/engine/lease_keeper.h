#pragma once

#include <map>
#include <thread>

#include "base/clock.h"
#include "base/mutex.h"
#include "engine/commit_queue.h"
#include "store/store.h"

namespace waystone {

// LeaseKeeper renews the leases of instances whose runner is blocked in a long
// external call, so a step may take longer than the lease without another worker
// taking the instance over. A renewal is an ordinary fenced commit: once a lease is
// lost, renewing it fails and the runner's own next commit is refused as well.
// Owns one thread. Thread-safe.
class LeaseKeeper {
 public:
  LeaseKeeper(CommitQueue* commits, const Clock* clock, Millis lease_duration);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Renews `lease` every third of the lease duration until Release, or until
  // `until` when it is not 0: the lease is then renewed no further than `until`,
  // and left to run out there (a step past its timeout: another worker recovers
  // the instance, and the runner's late commit is refused).
  void Hold(const Lease& lease, Millis until = 0);
  void Release(const Lease& lease);

  // Holds a lease for the lifetime of the guard (until `until` when not 0).
  class Guard {
   public:
    Guard(LeaseKeeper* keeper, const Lease& lease, Millis until = 0)
        : keeper_(keeper), lease_(lease) {
      if (keeper_ != nullptr) keeper_->Hold(lease_, until);
    }
    ~Guard() {
      if (keeper_ != nullptr) keeper_->Release(lease_);
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    LeaseKeeper* keeper_;
    Lease lease_;
  };

 private:
  void Loop(std::stop_token stop);

  CommitQueue* commits_;
  const Clock* clock_;
  Millis lease_duration_;
  // Held through a whole renewal pass, and by Release: a renewal taken before a
  // release cannot land after it (over the runner's own later commit, setting its
  // lease back to a deadline that has passed).
  Mutex pass_mu_;  // taken before mu_
  Mutex mu_;
  struct Held {
    Lease lease;
    Millis until = 0;  // 0: until released
  };
  std::map<int64_t, Held> held_ ABSL_GUARDED_BY(mu_);  // by instance id
  std::jthread thread_;
};

}  // namespace waystone
