#include "engine/lease_keeper.h"

#include <gtest/gtest.h>

#include "engine/engine_parts.h"
#include "support/process.h"

namespace waystone {
namespace {

constexpr Millis kLease = 30'000;
constexpr Millis kStart = 1'000'000;

// The keeper waits on a FakeClock: each poll moves it on by a third of the lease,
// so a renewal is due whenever the keeper looks (it may start waiting after a move).
class LeaseKeeperTest : public testing::StoreWithInstances {
 protected:
  void SetUp() override {
    StoreWithInstances::SetUp();
    commits_ = std::make_unique<CommitQueue>(store_.get(), CommitQueueOptions{});
    commits_->Start();
    keeper_ = std::make_unique<LeaseKeeper>(commits_.get(), &clock_, kLease);
  }

  void TearDown() override {
    keeper_.reset();
    commits_.reset();
  }

  // Moves the clock on until `instance_id`'s lease runs past `expires_at`.
  bool RenewedPast(int64_t instance_id, Millis expires_at) {
    return testing::WaitFor(
        [&] {
          if (Get(instance_id).lease_expires_at > expires_at) return true;
          clock_.Advance(kLease / 3);
          return false;
        },
        std::chrono::seconds(20));
  }

  FakeClock clock_{kStart};
  std::unique_ptr<CommitQueue> commits_;
  std::unique_ptr<LeaseKeeper> keeper_;
};

TEST_F(LeaseKeeperTest, AHeldLeaseIsRenewedFromTheClock) {
  const Lease lease = StartAndClaim("held", kStart, kLease);
  keeper_->Hold(lease);
  ASSERT_TRUE(RenewedPast(lease.instance_id, kStart + kLease));
  const InstanceRecord instance = Get(lease.instance_id);
  EXPECT_EQ(instance.lease_owner, "worker-1");
  EXPECT_EQ(instance.lease_epoch, lease.epoch);  // a renewal, not a new claim
  EXPECT_LE(instance.lease_expires_at, clock_.NowMillis() + kLease);
  EXPECT_GE(instance.lease_expires_at, kStart + kLease + kLease / 3);
}

TEST_F(LeaseKeeperTest, AReleasedLeaseIsLeftToRunOut) {
  // `released` has the lower id: the keeper's pass renews in id order, so once the
  // witness is renewed, a pass that would have renewed `released` is over.
  const Lease released = StartAndClaim("released", kStart, kLease);
  const Lease witness = StartAndClaim("witness", kStart, kLease);
  ASSERT_LT(released.instance_id, witness.instance_id);
  { LeaseKeeper::Guard guard(keeper_.get(), released); }
  keeper_->Hold(witness);
  ASSERT_TRUE(RenewedPast(witness.instance_id, kStart + kLease));
  EXPECT_EQ(Get(released.instance_id).lease_expires_at, kStart + kLease);
  LeaseKeeper::Guard no_keeper(nullptr, released);  // a runner without a keeper: nothing
}

TEST_F(LeaseKeeperTest, TheLosersReleaseLeavesTheNewHoldersRenewals) {
  const Lease lost = StartAndClaim("taken", kStart, kLease);
  keeper_->Hold(lost);
  // Another runner takes the instance over after the lease ran out and holds it
  // through its own call; then the first runner's late answer releases its hold.
  auto taken = store_->ClaimInstance(lost.instance_id, "worker-2", kStart + kLease + 1, kLease);
  ASSERT_TRUE(taken.ok()) << taken.status();
  keeper_->Hold(*taken);
  keeper_->Release(lost);
  ASSERT_TRUE(RenewedPast(lost.instance_id, kStart + kLease + 1 + kLease));
  EXPECT_EQ(Get(lost.instance_id).lease_owner, "worker-2");
  EXPECT_EQ(Get(lost.instance_id).lease_epoch, taken->epoch);
}

TEST_F(LeaseKeeperTest, ALeaseTakenOverIsNotRenewedForTheLoser) {
  const Lease lost = StartAndClaim("lost", kStart, kLease);
  const Lease witness = StartAndClaim("witness", kStart, kLease);
  // Another worker takes "lost" over once it expired.
  auto taken = store_->ClaimInstance(lost.instance_id, "worker-2", kStart + kLease + 1, kLease);
  ASSERT_TRUE(taken.ok()) << taken.status();
  keeper_->Hold(lost);
  keeper_->Hold(witness);
  ASSERT_TRUE(RenewedPast(witness.instance_id, kStart + kLease));
  const InstanceRecord instance = Get(lost.instance_id);
  EXPECT_EQ(instance.lease_owner, "worker-2");
  EXPECT_EQ(instance.lease_epoch, taken->epoch);
  EXPECT_EQ(instance.lease_expires_at, kStart + kLease + 1 + kLease);  // the winner's, untouched
}

// A hold with a deadline (a step's timeout) renews up to it and never past it;
// then the lease runs out there and another worker may claim the instance.
TEST_F(LeaseKeeperTest, AHoldWithADeadlineRenewsNoFurtherThanIt) {
  const Lease bounded = StartAndClaim("bounded", kStart, kLease);
  const Lease witness = StartAndClaim("witness", kStart, kLease);
  const Millis until = kStart + kLease + kLease / 2;
  keeper_->Hold(bounded, until);
  keeper_->Hold(witness);
  ASSERT_TRUE(RenewedPast(bounded.instance_id, until - 1));
  EXPECT_EQ(Get(bounded.instance_id).lease_expires_at, until);  // capped at the deadline
  // Well past the deadline: the witness goes on being renewed, the bounded lease not.
  ASSERT_TRUE(RenewedPast(witness.instance_id, until + kLease));
  EXPECT_EQ(Get(bounded.instance_id).lease_expires_at, until);
  auto taken = store_->ClaimInstance(bounded.instance_id, "worker-2", until, kLease);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->epoch, bounded.epoch + 1);
}

}  // namespace
}  // namespace waystone
