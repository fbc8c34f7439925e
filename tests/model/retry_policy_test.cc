#include "model/retry_policy.h"

#include <gtest/gtest.h>

#include "base/random.h"

namespace waystone {
namespace {

TEST(RetryPolicyTest, CeilingGrowsExponentiallyAndIsCapped) {
  RetryPolicy policy{6, 200, 10'000, 2.0};
  EXPECT_EQ(policy.Ceiling(1), 200);
  EXPECT_EQ(policy.Ceiling(2), 400);
  EXPECT_EQ(policy.Ceiling(3), 800);
  EXPECT_EQ(policy.Ceiling(6), 6400);
  EXPECT_EQ(policy.Ceiling(7), 10'000);
  EXPECT_EQ(policy.Ceiling(100), 10'000);
}

TEST(RetryPolicyTest, FullJitterStaysWithinBoundsAndSpreads) {
  RetryPolicy policy{10, 100, 5'000, 2.0};
  SeededRandom random(7);
  for (int attempt = 1; attempt <= 8; ++attempt) {
    Millis low = policy.Ceiling(attempt), high = 0;
    for (int i = 0; i < 2000; ++i) {
      const Millis delay = policy.NextDelay(attempt, std::nullopt, random);
      ASSERT_GE(delay, 0);
      ASSERT_LE(delay, policy.Ceiling(attempt));
      low = std::min(low, delay);
      high = std::max(high, delay);
    }
    // Full jitter: draws reach near zero and near the ceiling.
    EXPECT_LT(low, policy.Ceiling(attempt) / 10 + 1) << attempt;
    EXPECT_GT(high, policy.Ceiling(attempt) * 9 / 10) << attempt;
  }
}

TEST(RetryPolicyTest, RetryAfterIsAFloorAndCapped) {
  RetryPolicy policy{5, 100, 1'000, 2.0};
  policy.max_retry_after = 60'000;
  SeededRandom random(1);
  for (int i = 0; i < 100; ++i) {
    EXPECT_GE(policy.NextDelay(1, 5'000, random), 5'000);
  }
  EXPECT_EQ(policy.NextDelay(1, 3'600'000, random), 60'000);
}

TEST(RetryPolicyTest, AttemptLimitIsFirm) {
  RetryPolicy policy{3, 100, 1'000, 2.0};
  EXPECT_FALSE(policy.Exhausted(1));
  EXPECT_FALSE(policy.Exhausted(2));
  EXPECT_TRUE(policy.Exhausted(3));
  EXPECT_TRUE(policy.Exhausted(4));
}

}  // namespace
}  // namespace waystone
