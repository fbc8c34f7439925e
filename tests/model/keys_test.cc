#include "model/keys.h"

#include <gtest/gtest.h>

namespace waystone {
namespace {

TEST(KeysTest, DefaultKeyIsTenantInstanceKeyAndStep) {
  EXPECT_EQ(DefaultIdempotencyKey("acme", "crm:order-10042", "create-order"),
            "acme:crm:order-10042:create-order");
  // Two tenants with the same business key never share a key at a target.
  EXPECT_NE(DefaultIdempotencyKey("t1", "crm:900", "ship"),
            DefaultIdempotencyKey("t2", "crm:900", "ship"));
  EXPECT_EQ(InstanceRef("t1", "crm:900"), "t1:crm:900");
}

TEST(KeysTest, TenantNamesCannotRunIntoTheKey) {
  EXPECT_TRUE(ValidTenantName("acme-eu.prod_1"));
  EXPECT_FALSE(ValidTenantName(""));
  EXPECT_FALSE(ValidTenantName("a:b"));
  EXPECT_FALSE(ValidTenantName("a/b"));
  EXPECT_FALSE(ValidTenantName("*"));
  EXPECT_FALSE(ValidTenantName(std::string(65, 'a')));
}

TEST(KeysTest, CompensationKeyIsDistinctAndStable) {
  const std::string key = DefaultIdempotencyKey("t", "crm:1", "create-order");
  EXPECT_EQ(CompensationKey(key), "t:crm:1:create-order:compensate");
  EXPECT_NE(CompensationKey(key), key);
}

TEST(KeysTest, AKeyUuidIsAVersion8UuidOfTheTenantAndKey) {
  // Computed with Python's uuid module from SHA-256("t\n<key>"), version and variant set.
  EXPECT_EQ(KeyUuid("t", "notify:c1:order@1:e:line"), "bc86dc5c-281e-8e16-b50f-93da0cb3e203");
  EXPECT_EQ(KeyUuid("t", "k"), KeyUuid("t", "k"));
  EXPECT_NE(KeyUuid("t", "k"), KeyUuid("u", "k")) << "tenants never share a provider key";
  EXPECT_NE(KeyUuid("t", "k"), KeyUuid("t", "k2"));
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
