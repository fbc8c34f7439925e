// Paginated lookups (engine/drive/lookup_pages.h): which URL is asked next, when the
// reading stops, what is refused, and the one answer RecordLookup then judges.

#include "engine/drive/lookup_pages.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace waystone {
namespace {

using Json = nlohmann::json;

LookupSpec NextLinks(int max_pages = 10) {
  LookupSpec spec;
  spec.items = "/data";
  spec.next_pointer = "/links/next";
  spec.max_pages = max_pages;
  return spec;
}

std::string Page(const Json& items, const Json& next) {
  return Json{{"data", items}, {"links", {{"next", next}}}}.dump();
}

TEST(LookupPagesTest, FollowsPathQueryAndSameOriginLinksUntilNone) {
  const LookupSpec spec = NextLinks();
  LookupPages pages(spec, "https://erp.example:8443/api/orders?q=a");
  auto next = pages.Add(Page({{{"id", 1}}}, "/api/orders?q=a&cursor=x"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->value(), "https://erp.example:8443/api/orders?q=a&cursor=x");
  next = pages.Add(Page({{{"id", 2}}}, "?q=a&cursor=y"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->value(), "https://erp.example:8443/api/orders?q=a&cursor=y");
  next = pages.Add(Page({{{"id", 3}}}, "https://erp.example:8443/api/orders?cursor=z"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->value(), "https://erp.example:8443/api/orders?cursor=z");
  for (const Json& last : {Json(nullptr), Json("")}) {
    LookupPages one(spec, "https://erp.example:8443/api/orders?q=a");
    auto done = one.Add(Page(Json::array(), last));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_FALSE(done->has_value());
  }
  auto done = pages.Add(R"({"data": [{"id": 4}], "links": {}})");  // no next link: the last page
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->has_value());
  EXPECT_EQ(pages.pages_read(), 4);
  const Json merged = Json::parse(pages.Merged());
  EXPECT_EQ(merged["data"], Json::parse(R"([{"id":1},{"id":2},{"id":3},{"id":4}])"));
}

// The lookup's headers carry the target's credentials: they never go elsewhere.
TEST(LookupPagesTest, ALinkToAnotherOriginIsNotFollowed) {
  const LookupSpec spec = NextLinks();
  for (const std::string link : {"https://evil.example/api/orders", "http://erp.example:8443/x",
                                 "https://erp.example:8443.evil.example/x", "//evil.example/x",
                                 "relative/path", "javascript:alert(1)"}) {
    LookupPages pages(spec, "https://erp.example:8443/api/orders?q=a");
    auto next = pages.Add(Page(Json::array({1}), link));
    EXPECT_TRUE(absl::IsInvalidArgument(next.status())) << link;
  }
  LookupPages pages(spec, "https://erp.example:8443/api/orders?q=a");
  EXPECT_TRUE(absl::IsInvalidArgument(pages.Add(Page(Json::array(), 7)).status()));
}

TEST(LookupPagesTest, AnAnswerWithoutItsItemsArrayIsRefused) {
  const LookupSpec spec = NextLinks();
  const std::vector<std::string> bodies = {R"({"data": {"id": 1}})", R"({"items": []})", "not json",
                                           std::string(200, '[') + std::string(200, ']')};
  for (const std::string& body : bodies) {
    LookupPages pages(spec, "http://erp/api/orders");
    EXPECT_TRUE(absl::IsInvalidArgument(pages.Add(body).status())) << body.substr(0, 20);
  }
}

// "/links/next" in an answer without "/links": a wrong pointer, not a last page.
TEST(LookupPagesTest, AnAnswerWithoutTheNextLinksParentIsRefused) {
  const LookupSpec spec = NextLinks();
  LookupPages pages(spec, "http://erp/api/orders");
  auto next = pages.Add(R"({"data": [1], "paging": {"next": "/p2"}})");
  EXPECT_TRUE(absl::IsInvalidArgument(next.status())) << next.status();
  LookupPages last(spec, "http://erp/api/orders");
  auto done = last.Add(R"({"data": [1], "links": {}})");  // the parent is there: last page
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->has_value());
}

TEST(LookupPagesTest, CandidatesPastTheMemoryBoundLeaveTheLookupUnproven) {
  const LookupSpec spec = NextLinks(1000);
  LookupPages pages(spec, "http://erp/api/orders");
  const std::string page = Page(Json::array({std::string(1 << 20, 'x')}), "/next");
  absl::StatusOr<std::optional<std::string>> next;
  for (int i = 0; i < 20 && (i == 0 || next.ok()); ++i) next = pages.Add(page);
  EXPECT_TRUE(absl::IsResourceExhausted(next.status())) << next.status();
  EXPECT_LE(pages.pages_read(), 17);
}

TEST(LookupPagesTest, MorePagesThanMaxLeaveTheLookupUnproven) {
  const LookupSpec spec = NextLinks(2);
  LookupPages pages(spec, "http://erp/api/orders");
  ASSERT_TRUE(pages.Add(Page({1}, "/p2")).ok());
  auto third = pages.Add(Page({2}, "/p3"));
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  LookupPages exact(spec, "http://erp/api/orders");
  ASSERT_TRUE(exact.Add(Page({1}, "/p2")).ok());
  auto last = exact.Add(Page({2}, nullptr));  // two pages, max two: all read
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_FALSE(last->has_value());
}

TEST(LookupPagesTest, APageParameterCountsUpUntilAnEmptyPage) {
  LookupSpec spec;
  spec.items = "/items";
  spec.page_param = "page";
  spec.first_page = 0;
  spec.max_pages = 5;
  LookupPages pages(spec, "http://erp/v2/orders?q=a%3Ab&page=0&size=2#frag");
  auto next = pages.Add(R"({"items": [1, 2]})");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->value(), "http://erp/v2/orders?q=a%3Ab&page=1&size=2");
  next = pages.Add(R"({"items": [3]})");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->value(), "http://erp/v2/orders?q=a%3Ab&page=2&size=2");
  next = pages.Add(R"({"items": []})");
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
  EXPECT_EQ(Json::parse(pages.Merged())["items"], Json::parse("[1, 2, 3]"));
}

TEST(LookupPagesTest, WithQueryParamReplacesOrAppends) {
  EXPECT_EQ(WithQueryParam("http://h/p", "page", "2"), "http://h/p?page=2");
  EXPECT_EQ(WithQueryParam("http://h/p?q=1", "page", "2"), "http://h/p?q=1&page=2");
  EXPECT_EQ(WithQueryParam("http://h/p?page=1&q=1&page=9", "page", "2"), "http://h/p?page=2&q=1");
  EXPECT_EQ(WithQueryParam("http://h/p?pages=1", "page", "2"), "http://h/p?pages=1&page=2");
  EXPECT_EQ(OriginOf("https://a.b:1/x?y"), "https://a.b:1");
  EXPECT_EQ(OriginOf("https://a.b"), "https://a.b");
  EXPECT_EQ(OriginOf("ftp://a.b/x"), "");
  EXPECT_EQ(OriginOf("HTTPS://ERP.Example:8443/x"), "https://erp.example:8443");
  EXPECT_EQ(OriginOf("/x"), "");
}

}  // namespace
}  // namespace waystone
