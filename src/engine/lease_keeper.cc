#include "engine/lease_keeper.h"

#include <algorithm>
#include <vector>

#include "base/log.h"
#include "base/mutex.h"

namespace waystone {

LeaseKeeper::LeaseKeeper(CommitQueue* commits, const Clock* clock, Millis lease_duration)
    : commits_(commits), clock_(clock), lease_duration_(lease_duration) {
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

LeaseKeeper::~LeaseKeeper() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void LeaseKeeper::Hold(const Lease& lease, Millis until) {
  MutexLock lock(mu_);
  held_[lease.instance_id] = Held{lease, until};
}

void LeaseKeeper::Release(const Lease& lease) {
  MutexLock pass(pass_mu_);
  MutexLock lock(mu_);
  // Only this lease's hold: a runner that lost its lease must not end the renewals
  // of the one that took the instance over.
  auto it = held_.find(lease.instance_id);
  if (it != held_.end() && it->second.lease.epoch == lease.epoch) held_.erase(it);
}

void LeaseKeeper::Loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    clock_->WaitFor(lease_duration_ / 3, stop);
    if (stop.stop_requested()) return;
    MutexLock pass(pass_mu_);
    const Millis now = clock_->NowMillis();
    std::vector<Held> leases;
    {
      MutexLock lock(mu_);
      for (auto it = held_.begin(); it != held_.end();) {
        if (it->second.until != 0 && it->second.until <= now) {
          it = held_.erase(it);  // past its deadline: left to run out
        } else {
          leases.push_back(it->second);
          ++it;
        }
      }
    }
    // All at once, so that thousands of calls under way renew in a few shared
    // transactions rather than one commit each.
    std::vector<Change> renewals;
    renewals.reserve(leases.size());
    for (const Held& held : leases) {
      Change renew;
      renew.lease = held.lease;
      renew.now = now;
      renew.lease_expires_at = now + lease_duration_;
      if (held.until != 0) renew.lease_expires_at = std::min(renew.lease_expires_at, held.until);
      renewals.push_back(std::move(renew));
    }
    const std::vector<absl::Status> results = commits_->CommitAll(renewals);
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok()) {
        Log(LogLevel::kInfo, "lease renewal of instance " +
                                 std::to_string(leases[i].lease.instance_id) + ": " +
                                 results[i].ToString());
      }
    }
  }
}

}  // namespace waystone
