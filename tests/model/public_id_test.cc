#include "base/public_id.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace waystone {
namespace {

TEST(PublicIdsTest, RoundTripsAndHidesTheSequence) {
  const PublicIds ids("a server key");
  std::set<std::string> seen;
  std::string previous;
  for (int64_t id = 1; id <= 2000; ++id) {
    const std::string text = ids.Encode(id);
    ASSERT_EQ(text.size(), 16u);
    ASSERT_EQ(ids.Decode(text), id) << text;
    EXPECT_TRUE(seen.insert(text).second) << "two ids encode as " << text;
    EXPECT_NE(text, previous);
    previous = text;
  }
  // Neighbours share no visible order: not sorted the way the ids are.
  EXPECT_FALSE(ids.Encode(1) < ids.Encode(2) && ids.Encode(2) < ids.Encode(3) &&
               ids.Encode(3) < ids.Encode(4) && ids.Encode(4) < ids.Encode(5));
}

// Public ids are in URLs people keep: the same key must give the same text in every
// version. (Pinned from the build of 2026-12-06.)
TEST(PublicIdsTest, TheTextOfAnIdNeverChanges) {
  const PublicIds ids("a server key");
  const std::vector<std::pair<int64_t, std::string>> pinned = {
      {1, "c96cac2659ff8c22"},
      {2, "59161cf2fb666456"},
      {1000, "ecb8714c86572188"},
      {123456789, "d031a70f74ee76ad"},
      {int64_t{1} << 53, "4e16b75367acb204"}};
  for (const auto& [id, text] : pinned) {
    EXPECT_EQ(ids.Encode(id), text) << id;
    EXPECT_EQ(ids.Decode(text), id) << text;
  }
}

TEST(PublicIdsTest, AnotherKeyOrForeignTextDoesNotDecode) {
  const PublicIds ours("key one");
  const PublicIds theirs("key two");
  EXPECT_NE(ours.Encode(7), theirs.Encode(7));
  int decoded_as_small = 0;
  for (int64_t id = 1; id <= 200; ++id) {
    auto other = theirs.Decode(ours.Encode(id));
    if (other && *other <= 1'000'000) ++decoded_as_small;
  }
  EXPECT_EQ(decoded_as_small, 0);
  EXPECT_FALSE(ours.Decode("17").has_value());
  EXPECT_FALSE(ours.Decode("0123456789ABCDEF").has_value());
  EXPECT_FALSE(ours.Decode("zzzzzzzzzzzzzzzz").has_value());
}

}  // namespace
}  // namespace waystone
