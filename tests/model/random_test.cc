#include "base/random.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace waystone {
namespace {

// Answers the values it was given, in order.
class ScriptedRandom final : public Random {
 public:
  explicit ScriptedRandom(std::vector<uint64_t> values) : values_(std::move(values)) {}
  uint64_t Next() override { return values_.at(next_++); }

 private:
  std::vector<uint64_t> values_;
  size_t next_ = 0;
};

// RFC 9562, appendix A.6: the example UUIDv7 for unix_ts_ms 0x017F22E279B0, rand_a 0xCC3,
// rand_b 0x18C4DC0C0C07398F is 017F22E2-79B0-7CC3-98C4-DC0C0C07398F.
TEST(RandomTest, TimeOrderedHexIsTheRfc9562ExampleUuidV7) {
  ScriptedRandom random({0xCC3, uint64_t{0x18C4DC0C0C07398F} << 2});
  EXPECT_EQ(random.TimeOrderedHex(0x017F22E279B0), "017f22e279b07cc398c4dc0c0c07398f");
}

// Hex takes each 64-bit draw's bytes lowest first.
TEST(RandomTest, HexWritesEachDrawsBytesLowestFirst) {
  ScriptedRandom random({0x0123456789abcdef, 0x1122334455667788});
  EXPECT_EQ(random.Hex(10), "efcdab89674523018877");
}

TEST(RandomTest, TimeOrderedHexSortsByMillisecondAndDiffersWithinOne) {
  SeededRandom random(7);
  std::vector<std::string> ids;
  std::set<std::string> distinct;
  for (int64_t ms = 1'764'900'000'000; ms < 1'764'900'000'050; ++ms) {
    for (int i = 0; i < 20; ++i) {
      ids.push_back(random.TimeOrderedHex(ms));
      distinct.insert(ids.back());
      ASSERT_EQ(ids.back().size(), 32u);
      EXPECT_EQ(ids.back()[12], '7') << ids.back();                            // version 7
      EXPECT_NE(std::string("89ab").find(ids.back()[16]), std::string::npos);  // variant 10
    }
  }
  EXPECT_EQ(distinct.size(), ids.size());
  for (size_t i = 20; i < ids.size(); ++i) {
    EXPECT_LT(ids[i - 20], ids[i]) << "an id of a later millisecond sorts after";
  }
}

}  // namespace
}  // namespace waystone
