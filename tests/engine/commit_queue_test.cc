#include "engine/commit_queue.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine_parts.h"

namespace waystone {
namespace {

class CommitQueueTest : public testing::StoreWithInstances {
 protected:
  static Change Finish(const Lease& lease, Millis now) {
    Change change;
    change.lease = lease;
    change.now = now;
    change.state = InstanceState::kCompleted;
    change.lease_expires_at = 0;
    return change;
  }
};

TEST_F(CommitQueueTest, ACommitReturnsOnceTheChangeIsInTheStore) {
  const Lease lease = StartAndClaim("a", 1000, 30'000);
  CommitQueue queue(store_.get(), {});
  queue.Start();
  ASSERT_TRUE(queue.Commit(Finish(lease, 2000)).ok());
  const InstanceRecord instance = Get(lease.instance_id);
  EXPECT_EQ(instance.state, InstanceState::kCompleted);
  EXPECT_EQ(instance.lease_expires_at, 0);  // released with the change
}

TEST_F(CommitQueueTest, AStaleLeaseIsAbortedAndTheOthersStillCommit) {
  std::vector<Lease> leases;
  for (int i = 0; i < 8; ++i) {
    leases.push_back(StartAndClaim("k" + std::to_string(i), 1000, 30'000));
  }
  Lease stale = leases[3];
  stale.epoch += 1;  // another worker's claim since
  CommitQueue queue(store_.get(), {2});  // several batches, each under savepoints
  queue.Start();
  std::vector<absl::Status> results(leases.size());
  std::vector<std::thread> callers;
  for (size_t i = 0; i < leases.size(); ++i) {
    callers.emplace_back(
        [&, i] { results[i] = queue.Commit(Finish(i == 3 ? stale : leases[i], 2000)); });
  }
  for (auto& t : callers) t.join();
  for (size_t i = 0; i < leases.size(); ++i) {
    if (i == 3) {
      EXPECT_TRUE(absl::IsAborted(results[i])) << results[i];
      EXPECT_EQ(Get(leases[i].instance_id).state, InstanceState::kRunning);
    } else {
      EXPECT_TRUE(results[i].ok()) << i << ": " << results[i];
      EXPECT_EQ(Get(leases[i].instance_id).state, InstanceState::kCompleted) << i;
    }
  }
}

TEST_F(CommitQueueTest, ManyCallersAtOnceAreEachAnsweredWithTheirOwnResult) {
  constexpr int kCallers = 40;
  std::vector<Lease> leases;
  for (int i = 0; i < kCallers; ++i) {
    leases.push_back(StartAndClaim("m" + std::to_string(i), 1000, 30'000));
  }
  CommitQueue queue(store_.get(), {});
  queue.Start();
  std::vector<absl::Status> results(kCallers, absl::UnknownError("not run"));
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      Change renew;
      renew.lease = leases[i];
      renew.now = 2000;
      renew.lease_expires_at = 2000 + 1000 + i;  // each caller's own, to tell them apart
      results[i] = queue.Commit(renew);
    });
  }
  for (auto& t : callers) t.join();
  for (int i = 0; i < kCallers; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i];
    EXPECT_EQ(Get(leases[i].instance_id).lease_expires_at, 3000 + i);
  }
}

TEST_F(CommitQueueTest, ANotStartedOrStoppedQueueRefusesAndWritesNothing) {
  const Lease lease = StartAndClaim("s", 1000, 30'000);
  CommitQueue queue(store_.get(), {});
  EXPECT_TRUE(absl::IsUnavailable(queue.Commit(Finish(lease, 2000))));
  queue.Start();
  queue.Stop();
  EXPECT_TRUE(absl::IsUnavailable(queue.Commit(Finish(lease, 2000))));
  EXPECT_EQ(Get(lease.instance_id).state, InstanceState::kRunning);
  queue.Stop();  // a second Stop is harmless
}

}  // namespace
}  // namespace waystone
