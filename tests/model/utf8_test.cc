#include "base/utf8.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_EQ(FirstInvalidUtf8(""), std::string_view::npos);
  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), std::string_view::npos);
  EXPECT_EQ(FirstInvalidUtf8("Größe 注文 \xF0\x9F\x93\xA6"), std::string_view::npos);
}

TEST(Utf8Test, NamesTheFirstBadByte) {
  EXPECT_EQ(FirstInvalidUtf8("ab\xFF" "cd"), 2u);
  EXPECT_EQ(FirstInvalidUtf8("\xC3"), 0u);                   // truncated
  EXPECT_EQ(FirstInvalidUtf8("x\xC0\xAF"), 1u);              // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xED\xA0\x80"), 0u);           // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0u);       // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("ok \xE2\x82"), 3u);            // cut in the middle
}

}  // namespace
}  // namespace waystone
