#include "model/template.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace waystone {
namespace {

using Json = nlohmann::json;

Json Context() {
  return {{"input", {{"order_id", "10042"}, {"amount", 120}, {"flags", {"a", "b"}}}},
          {"steps", {{"fetch-customer", {{"response", {{"id", "C-7"}, {"ok", true}}}}}}},
          {"env", {{"ERP_URL", "http://erp"}}}};
}

TEST(TemplateTest, JoinsTextAndValues) {
  auto t = Template::Parse("{{env.ERP_URL}}/orders/{{input.order_id}}?n={{input.amount}}");
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = t->RenderText(Context());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "http://erp/orders/10042?n=120");
}

TEST(TemplateTest, SinglePlaceholderKeepsJsonType) {
  auto t = Template::Parse("{{input.amount}}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render(Context()), Json(120));
  auto b = Template::Parse("{{ steps.fetch-customer.response.ok }}");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b->Render(Context()), Json(true));
}

TEST(TemplateTest, ArrayIndexes) {
  auto t = Template::Parse("{{input.flags.1}}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->RenderText(Context()), "b");
}

TEST(TemplateScopeTest, NamedObjectsAreReadBesideTheRootWithoutBeingInIt) {
  const Json own = {{"input", {{"order_id", "10042"}}}, {"env", {{"ERP_URL", "http://stale"}}}};
  const Json env = {{"ERP_URL", "http://erp"}, {"PORT", 81}};
  const Json secret = {{"TOKEN", "s3cr3t-value"}};
  const TemplateScope scope(own, "env", &env, "secret", &secret);

  auto url = Template::Parse("{{env.ERP_URL}}/orders/{{input.order_id}}?t={{secret.TOKEN}}");
  ASSERT_TRUE(url.ok());
  // A name given to the scope hides the root's member of that name.
  EXPECT_EQ(*url->RenderText(scope), "http://erp/orders/10042?t=s3cr3t-value");
  // A whole named object, a number kept a number, and what is in neither.
  EXPECT_EQ(*Template::Parse("{{env}}")->Render(scope), env);
  EXPECT_EQ(*Template::Parse("{{env.PORT}}")->Render(scope), Json(81));
  EXPECT_EQ(scope.Find({"env", "MISSING"}), nullptr);
  EXPECT_EQ(scope.Find({"secret", "TOKEN", "deeper"}), nullptr);
  EXPECT_EQ(scope.Find({"steps"}), nullptr);
  auto missing = Template::Parse("{{secret.OTHER}}")->Render(scope);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("{{secret.OTHER}}"), std::string_view::npos);

  // A scope of one JSON object reads its members only.
  const TemplateScope plain(own);
  EXPECT_EQ(*url->RenderText(Json{{"input", {{"order_id", "1"}}},
                                  {"env", {{"ERP_URL", "http://a"}}},
                                  {"secret", {{"TOKEN", "t"}}}}),
            "http://a/orders/1?t=t");
  EXPECT_EQ(plain.Find({"secret"}), nullptr);
  EXPECT_EQ(*plain.Find({"env", "ERP_URL"}), Json("http://stale"));
}

TEST(TemplateScopeTest, TreesUrlsAndTextRenderThroughAScope) {
  const Json own = {{"input", {{"k", "a b"}}}};
  const Json env = {{"BASE", "http://127.0.0.1:81"}};
  const TemplateScope scope(own, "env", &env);
  auto tree = RenderTree(Json{{"url", "{{env.BASE}}"}, {"items", {"{{input.k}}", 3}}}, scope);
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_EQ(*tree, (Json{{"url", "http://127.0.0.1:81"}, {"items", {"a b", 3}}}));
  auto url = Template::Parse("{{env.BASE}}/x/{{input.k}}");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(*url->RenderUrl(scope), "http://127.0.0.1:81/x/a%20b");
}

TEST(TemplateTest, ReferencesAreListed) {
  auto t = Template::Parse("{{a.b}}-{{c}}");
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->references().size(), 2u);
  EXPECT_EQ(JoinPath(t->references()[0]), "a.b");
  EXPECT_EQ(JoinPath(t->references()[1]), "c");
}

TEST(TemplateTest, ParseErrorsNameTheProblem) {
  auto unclosed = Template::Parse("{{input.order_id");
  EXPECT_FALSE(unclosed.ok());
  EXPECT_NE(unclosed.status().message().find("unclosed"), std::string::npos);
  EXPECT_FALSE(Template::Parse("{{}}").ok());
  EXPECT_FALSE(Template::Parse("{{input..x}}").ok());
  auto spaces = Template::Parse("{{input order}}");
  EXPECT_FALSE(spaces.ok());
}

TEST(TemplateTest, MissingValueIsAnErrorNamingThePathNotValues) {
  auto t = Template::Parse("Bearer {{secret.TOKEN}}");
  ASSERT_TRUE(t.ok());
  auto out = t->RenderText(Context());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("secret.TOKEN"), std::string::npos);
}

TEST(TemplateTest, ObjectsCannotBeEmbeddedInText) {
  auto t = Template::Parse("x={{input.flags}}");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->RenderText(Context()).ok());
}

TEST(TemplateTest, RenderTreeRendersEveryString) {
  Json tree = {{"ref", "{{input.order_id}}"},
               {"n", "{{input.amount}}"},
               {"fixed", 3},
               {"list", {"{{env.ERP_URL}}/x"}}};
  auto out = RenderTree(tree, Context());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)["ref"], "10042");
  EXPECT_EQ((*out)["n"], 120);
  EXPECT_EQ((*out)["fixed"], 3);
  EXPECT_EQ((*out)["list"][0], "http://erp/x");
}

TEST(TemplateTest, UrlValuesArePercentEncodedByTheirPart) {
  const Json context = {
      {"env", {{"ERP_URL", "http://erp:81/api"}}},
      {"input", {{"k", "crm:A&B #7"}, {"p", "x/y?z=1"}, {"s", "sp ace+plus%25"}, {"u", "Größe"}}}};
  auto t = Template::Parse(
      "{{env.ERP_URL}}/orders/{{input.p}}/{{input.k}}?ref={{input.k}}"
      "&s={{input.s}}&u={{input.u}}&p={{input.p}}");
  ASSERT_TRUE(t.ok());
  auto url = t->RenderUrl(context);
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(*url,
            "http://erp:81/api/orders/x%2Fy%3Fz%3D1/crm%3AA%26B%20%237?ref=crm%3AA%26B%20%237"
            "&s=sp%20ace%2Bplus%2525&u=Gr%C3%B6%C3%9Fe&p=x%2Fy%3Fz%3D1");
  // Literal text and the base URL stay as written.
  auto literal = Template::Parse("http://erp/a b?x=1&y={{input.k}}#{{input.p}}");
  ASSERT_TRUE(literal.ok());
  EXPECT_EQ(*literal->RenderUrl(context), "http://erp/a b?x=1&y=crm%3AA%26B%20%237#x%2Fy%3Fz%3D1");
}

TEST(TemplateTest, DotSegmentsAndForeignBaseUrlsCannotMoveTheRequest) {
  const Json context = {{"env", {{"ERP", "http://erp"}}},
                        {"input", {{"up", ".."}, {"here", "."}, {"url", "http://evil"}}}};
  auto t = Template::Parse("{{env.ERP}}/tenants/t/orders/{{input.up}}/{{input.here}}/cancel");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->RenderUrl(context), "http://erp/tenants/t/orders/%2E%2E/%2E/cancel");
  auto foreign = Template::Parse("{{input.url}}/x");
  ASSERT_TRUE(foreign.ok());
  EXPECT_FALSE(foreign->CheckUrl().ok());
  EXPECT_FALSE(foreign->RenderUrl(context).ok());
}

TEST(TemplateTest, PlaceholdersInTheHostAreRefusedUnlessFromEnv) {
  auto host = Template::Parse("http://{{input.k}}/x");
  ASSERT_TRUE(host.ok());
  EXPECT_FALSE(host->CheckUrl().ok());
  EXPECT_FALSE(host->RenderUrl(Json{{"input", {{"k", "evil.example"}}}}).ok());
  auto port = Template::Parse("http://127.0.0.1:{{env.PORT}}/x/{{input.k}}");
  ASSERT_TRUE(port.ok());
  EXPECT_TRUE(port->CheckUrl().ok());
  EXPECT_EQ(*port->RenderUrl(Json{{"env", {{"PORT", "81"}}}, {"input", {{"k", "a b"}}}}),
            "http://127.0.0.1:81/x/a%20b");
  auto base = Template::Parse("{{env.ERP_URL}}/x");
  ASSERT_TRUE(base.ok());
  EXPECT_TRUE(base->CheckUrl().ok());
}

// Issue 45, high 1: the three URLs a probe used to send a request, with its bearer
// secret, to a port of its choosing.
TEST(TemplateTest, NoValueFromInputOrAnAnswerChoosesTheHostOrPort) {
  const Json context = {{"env",
                         {{"DMS_URL", "http://127.0.0.1:8000"},
                          {"DMS_BASE", "http://127.0.0.1:8000/dms/"},
                          {"DMS_HOST", "http://127.0.0.1"}}},
                        {"input", {{"path", "@127.0.0.1:9999"}, {"port", "9999"}}},
                        {"steps", {{"upload", {{"external_id", "@127.0.0.1:9999"}}}}}};
  for (const char* text : {"{{env.DMS_URL}}{{input.path}}", "{{env.DMS_HOST}}:{{input.port}}/x",
                           "{{env.DMS_URL}}{{steps.upload.external_id}}",
                           "{{env.DMS_URL}}?{{input.path}}" /* lint: fine; run: a query */}) {
    auto t = Template::Parse(text);
    ASSERT_TRUE(t.ok()) << text;
    auto url = t->RenderUrl(context);
    if (url.ok()) {
      // Only the last one renders, and its value stays in the query.
      EXPECT_EQ(*url, "http://127.0.0.1:8000?%40127.0.0.1%3A9999") << text;
      EXPECT_TRUE(t->CheckUrl().ok()) << text;
      continue;
    }
    EXPECT_NE(url.status().message().find("scheme, host or port"), std::string::npos)
        << text << ": " << url.status();
    // Lint says so before any value is known.
    EXPECT_FALSE(t->CheckUrl().ok()) << text;
  }
  // With a literal '/' after the base, the same value is a path segment: '@' and ':'
  // encoded, the host unchanged.
  auto segment = Template::Parse("{{env.DMS_URL}}/{{input.path}}");
  ASSERT_TRUE(segment.ok());
  EXPECT_TRUE(segment->CheckUrl().ok());
  EXPECT_EQ(*segment->RenderUrl(context), "http://127.0.0.1:8000/%40127.0.0.1%3A9999");
  // A base whose own path ends the authority renders (lint, not knowing it, refuses).
  auto based = Template::Parse("{{env.DMS_BASE}}{{input.path}}");
  ASSERT_TRUE(based.ok());
  EXPECT_FALSE(based->CheckUrl().ok());
  EXPECT_EQ(*based->RenderUrl(context), "http://127.0.0.1:8000/dms/%40127.0.0.1%3A9999");
  // Env values may still build the authority, and a port from env is trusted.
  auto port = Template::Parse("{{env.DMS_HOST}}:{{env.PORT}}/{{input.port}}");
  ASSERT_TRUE(port.ok());
  EXPECT_TRUE(port->CheckUrl().ok());
  Json with_port = context;
  with_port["env"]["PORT"] = "8001";
  EXPECT_EQ(*port->RenderUrl(with_port), "http://127.0.0.1:8001/9999");
}

TEST(TemplateTest, AnEnvValueWithALineBreakCannotBeAUrlBaseOrHost) {
  const nlohmann::json context = {{"env", {{"URL", "http://erp\r\nX: y"}, {"HOST", "a\nb"}}}};
  for (const char* text : {"{{env.URL}}/orders", "http://{{env.HOST}}/orders"}) {
    auto t = Template::Parse(text);
    ASSERT_TRUE(t.ok()) << text;
    auto url = t->RenderUrl(context);
    ASSERT_FALSE(url.ok()) << text << " -> " << *url;
    EXPECT_NE(url.status().message().find("control character"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace waystone

namespace waystone {
namespace {

TEST(TemplateTest, ASolePlaceholderIsOnePlaceholderWithNothingAroundIt) {
  EXPECT_EQ(SolePlaceholder("{{input.email}}"), (std::vector<std::string>{"input", "email"}));
  EXPECT_EQ(SolePlaceholder("{{secret.KEY}}"), (std::vector<std::string>{"secret", "KEY"}));
  EXPECT_EQ(SolePlaceholder("mail {{input.email}}"), std::nullopt);
  EXPECT_EQ(SolePlaceholder("{{input.a}}{{input.b}}"), std::nullopt);
  EXPECT_EQ(SolePlaceholder("{{input.a}} "), std::nullopt);
  EXPECT_EQ(SolePlaceholder("true"), std::nullopt);
  EXPECT_EQ(SolePlaceholder("{{input.a"), std::nullopt);
}

}  // namespace
}  // namespace waystone
