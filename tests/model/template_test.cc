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
  Json tree = {{"ref", "{{input.order_id}}"}, {"n", "{{input.amount}}"}, {"fixed", 3},
               {"list", {"{{env.ERP_URL}}/x"}}};
  auto out = RenderTree(tree, Context());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)["ref"], "10042");
  EXPECT_EQ((*out)["n"], 120);
  EXPECT_EQ((*out)["fixed"], 3);
  EXPECT_EQ((*out)["list"][0], "http://erp/x");
}

}  // namespace
}  // namespace waystone
