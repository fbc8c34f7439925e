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
  EXPECT_EQ(FirstInvalidUtf8("ab\xFF"
                             "cd"),
            2u);
  EXPECT_EQ(FirstInvalidUtf8("\xC3"), 0u);              // truncated
  EXPECT_EQ(FirstInvalidUtf8("x\xC0\xAF"), 1u);         // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xED\xA0\x80"), 0u);      // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("ok \xE2\x82"), 3u);       // cut in the middle
}

// Issue 45, item 8: names a person reads hold no control, bidi or zero-width
// character, and a terminal is shown them escaped.
TEST(Utf8Test, InvisibleCharactersAreFoundAndShownEscaped) {
  EXPECT_FALSE(HasInvisibleCharacter("alice Größe 注文 \xF0\x9F\x93\xA6"));
  for (std::string_view bad :
       {std::string_view("backdoor\0", 9), std::string_view("a\x1b[2Jb"), std::string_view("a\tb"),
        std::string_view("del\x7f"), std::string_view("c1\xC2\x9B"),
        std::string_view("rlo\xE2\x80\xAEnimda"), std::string_view("zw\xE2\x80\x8Bsp"),
        std::string_view("lri\xE2\x81\xA6x"), std::string_view("bom\xEF\xBB\xBF")}) {
    EXPECT_TRUE(HasInvisibleCharacter(bad)) << Printable(bad);
  }
  EXPECT_EQ(Printable(std::string_view("back\0door\x1b[2J", 13)), "back\\x00door\\x1b[2J");
  EXPECT_EQ(Printable("rlo\xE2\x80\xAEx"), "rlo\\xe2\\x80\\xaex");
  EXPECT_EQ(Printable("bad\xFFutf8"), "bad\\xffutf8");
  EXPECT_EQ(Printable("Größe"), "Größe");
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

TEST(Utf8Test, NamesThatCouldPassForLatinOnesAreFound) {
  EXPECT_TRUE(HasLookAlikeMix("\xD0\xB0lice"));      // Cyrillic а + "lice"
  EXPECT_TRUE(HasLookAlikeMix("adm\xCE\xB9n"));      // Greek ι
  EXPECT_TRUE(HasLookAlikeMix("\xEF\xBD\x81lice"));  // fullwidth ａ
  EXPECT_TRUE(HasLookAlikeMix("\xEF\xBC\xA1"));      // fullwidth Ａ alone
  EXPECT_FALSE(HasLookAlikeMix("alice"));
  EXPECT_FALSE(HasLookAlikeMix("ci-bot_2.prod@acme"));
  EXPECT_FALSE(HasLookAlikeMix("\xD0\xB8\xD0\xB2\xD0\xB0\xD0\xBD"));  // иван: one script
  EXPECT_FALSE(HasLookAlikeMix("\xE7\xB5\x8C\xE7\x90\x86-yamada"));   // 経理-yamada
  EXPECT_FALSE(HasLookAlikeMix("Zo\xC3\xAB"));                        // Zoë: Latin-1
}

}  // namespace
}  // namespace waystone
