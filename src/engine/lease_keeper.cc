#include "engine/lease_keeper.h"

#include <vector>

#include "base/mutex.h"
#include "base/log.h"

namespace waystone {

LeaseKeeper::LeaseKeeper(CommitQueue* commits, const Clock* clock, Millis lease_duration)
    : commits_(commits), clock_(clock), lease_duration_(lease_duration) {
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

LeaseKeeper::~LeaseKeeper() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void LeaseKeeper::Hold(const Lease& lease) {
  MutexLock lock(mu_);
  held_[lease.instance_id] = lease;
}

void LeaseKeeper::Release(const Lease& lease) {
  MutexLock lock(mu_);
  held_.erase(lease.instance_id);
}

void LeaseKeeper::Loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    clock_->WaitFor(lease_duration_ / 3, stop);
    if (stop.stop_requested()) return;
    std::vector<Lease> leases;
    {
      MutexLock lock(mu_);
      for (const auto& [id, lease] : held_) leases.push_back(lease);
    }
    for (const Lease& lease : leases) {
      Change renew;
      renew.lease = lease;
      renew.now = clock_->NowMillis();
      renew.lease_expires_at = renew.now + lease_duration_;
      auto status = commits_->Commit(renew);
      if (!status.ok()) {
        Log(LogLevel::kInfo, "lease renewal of instance " + std::to_string(lease.instance_id) +
                                 ": " + status.ToString());
      }
    }
  }
}

}  // namespace waystone
