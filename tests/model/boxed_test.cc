#include "base/boxed.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace waystone {
namespace {

struct Identity {
  std::string name;
  std::vector<std::string> files;

  bool operator==(const Identity&) const = default;
};

TEST(BoxedTest, AnEmptyBoxReadsAsADefaultValue) {
  const Boxed<Identity> box;
  EXPECT_EQ(box->name, "");
  EXPECT_TRUE(box->files.empty());
  EXPECT_EQ(*box, Identity{});
}

TEST(BoxedTest, AnEmptyBoxIsOnlyAPointer) { EXPECT_EQ(sizeof(Boxed<Identity>), sizeof(void*)); }

TEST(BoxedTest, CopiesAreDeepAndChangeApart) {
  Boxed<Identity> original = Identity{"erp", {"ca.pem"}};
  Boxed<Identity> copy = original;
  copy.Mutable().files.push_back("client.pem");
  EXPECT_EQ(original->files, std::vector<std::string>{"ca.pem"});
  EXPECT_EQ(copy->files, (std::vector<std::string>{"ca.pem", "client.pem"}));
  copy = original;
  EXPECT_EQ(copy, original);
  EXPECT_NE(&*copy, &*original);
}

TEST(BoxedTest, MutableFillsAnEmptyBoxAndEmptyingItAgainReadsDefault) {
  Boxed<Identity> box;
  box.Mutable().name = "crm";
  EXPECT_EQ(box->name, "crm");
  box = {"erp", {}};  // a value straight from its braces
  EXPECT_EQ(box->name, "erp");
  box = Boxed<Identity>();
  EXPECT_EQ(box->name, "");
  const Boxed<Identity> empty;
  EXPECT_EQ(box, empty);
}

TEST(BoxedTest, AMovedFromBoxIsEmpty) {
  Boxed<Identity> box = Identity{"crm", {}};
  Boxed<Identity> moved = std::move(box);
  EXPECT_EQ(moved->name, "crm");
  EXPECT_EQ(box->name, "");  // NOLINT(bugprone-use-after-move): defined, and read here
}

}  // namespace
}  // namespace waystone
