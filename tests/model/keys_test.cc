#include "model/keys.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

TEST(KeysTest, DefaultKeyIsInstanceKeyAndStep) {
  EXPECT_EQ(DefaultIdempotencyKey("crm:order-10042", "create-order"), "crm:order-10042:create-order");
}

TEST(KeysTest, CompensationKeyIsDistinctAndStable) {
  const std::string key = DefaultIdempotencyKey("crm:1", "create-order");
  EXPECT_EQ(CompensationKey(key), "crm:1:create-order:compensate");
  EXPECT_NE(CompensationKey(key), key);
}

TEST(KeysTest, RequestHashChangesWithMethodUrlOrBody) {
  const std::string base = RequestHash("POST", "http://erp/orders", R"({"a":1})");
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, RequestHash("POST", "http://erp/orders", R"({"a":1})"));
  EXPECT_NE(base, RequestHash("PUT", "http://erp/orders", R"({"a":1})"));
  EXPECT_NE(base, RequestHash("POST", "http://erp/orders2", R"({"a":1})"));
  EXPECT_NE(base, RequestHash("POST", "http://erp/orders", R"({"a":2})"));
  // Field boundaries matter: moving text between URL and body changes the hash.
  EXPECT_NE(RequestHash("POST", "ab", "c"), RequestHash("POST", "a", "bc"));
}

}  // namespace
}  // namespace waystone
