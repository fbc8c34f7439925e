#include "model/duration.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

TEST(DurationTest, ParsesUnits) {
  EXPECT_EQ(ParseDuration("250ms"), 250);
  EXPECT_EQ(ParseDuration("2s"), 2000);
  EXPECT_EQ(ParseDuration("1.5s"), 1500);
  EXPECT_EQ(ParseDuration("3m"), 180'000);
  EXPECT_EQ(ParseDuration("1h"), 3'600'000);
  EXPECT_EQ(ParseDuration("40"), 40);
}

TEST(DurationTest, RefusesGarbage) {
  for (const char* text : {"", "s", "-1s", "2 s", "2sec", "1e400s", "abc", "1..2s"}) {
    EXPECT_FALSE(ParseDuration(text).has_value()) << text;
  }
}

}  // namespace
}  // namespace waystone
