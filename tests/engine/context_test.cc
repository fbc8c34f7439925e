#include "engine/context.h"

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/template.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

absl::StatusOr<Json> RenderWith(const std::string& text, const TemplateScope& scope) {
  auto parsed = Template::Parse(text);
  if (!parsed.ok()) return parsed.status();
  return parsed->Render(scope);
}

class InstanceContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WS_CONTEXT_TEST_URL", "http://erp.example", 1);
    setenv("WAYSTONE_SECRET_WS_CONTEXT_TEST", "token-0123456789abcdef", 1);
    TenantPolicy acme;
    acme.env["WS_CONTEXT_TEST_URL"] = "http://acme.example";
    auto loaded = TemplateEnvironment::Load("", {{"acme", acme}});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    environment_ = std::move(*loaded);
    instance_.id = 7;
    instance_.tenant = "globex";
    instance_.key = "order-1";
    instance_.input_json = R"({"n": 5, "items": ["a", "b"]})";
    instance_.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    steps_.resize(2);
    steps_[0].name = "a";
    steps_[0].response_json = R"({"total": 5})";
    steps_[0].external_id = "X-1";
    steps_[1].name = "b";
  }
  void TearDown() override {
    unsetenv("WS_CONTEXT_TEST_URL");
    unsetenv("WAYSTONE_SECRET_WS_CONTEXT_TEST");
  }

  TemplateEnvironment environment_;
  InstanceRecord instance_;
  std::vector<StepRecord> steps_;
};

const std::vector<std::string> kTemplates = {
    "{{env.WS_CONTEXT_TEST_URL}}/orders/{{input.n}}",
    "{{secret.WS_CONTEXT_TEST}}",
    "{{input}}",
    "{{input.items.1}}",
    "{{steps.a.output.total}}",
    "{{steps.a.response}}",
    "{{steps.a.external_id}}",
    "{{step.name}} {{step.idempotency_key}} {{step.key_uuid}}",
    "{{instance.key}} {{instance.tenant}} {{instance.ref}} {{instance.trace_id}}",
    "{{steps.b.output}}",  // not there: b shows no result
    "{{secret.NOT_SET}}",
};

// The runner's context (env and secret shared, not copied) renders every template
// as the whole context Build makes does, for each tenant, and follows a step's new result.
TEST_F(InstanceContextTest, RendersWhatTheBuiltContextRenders) {
  for (const std::string tenant : {"globex", "acme"}) {
    instance_.tenant = tenant;
    InstanceContext context(&environment_);
    for (int round = 0; round < 2; ++round) {
      if (round == 1) steps_[1].response_json = R"({"done": true})";
      for (const std::string& text : kTemplates) {
        const Json built = environment_.Build(instance_, steps_, "b", "acme:order-1:b");
        auto expected = RenderWith(text, built);
        auto got = RenderWith(text, context.For(instance_, steps_, "b", "acme:order-1:b"));
        ASSERT_EQ(got.ok(), expected.ok()) << tenant << " " << text << ": " << got.status();
        if (expected.ok()) {
          EXPECT_EQ(*got, *expected) << tenant << " " << text;
        } else {
          EXPECT_EQ(got.status(), expected.status()) << tenant << " " << text;
        }
      }
    }
  }
  // The two tenants did read different env values and the process's secret.
  instance_.tenant = "acme";
  InstanceContext acme(&environment_);
  EXPECT_EQ(*RenderWith("{{env.WS_CONTEXT_TEST_URL}}", acme.For(instance_, steps_, "a", "")),
            Json("http://acme.example"));
  instance_.tenant = "globex";
  InstanceContext globex(&environment_);
  EXPECT_EQ(*RenderWith("{{env.WS_CONTEXT_TEST_URL}}", globex.For(instance_, steps_, "a", "")),
            Json("http://erp.example"));
  EXPECT_EQ(*RenderWith("{{steps.b.output.done}}", globex.For(instance_, steps_, "a", "")),
            Json(true));
}

// The business key reads the input and the tenant's env, nothing else.
TEST_F(InstanceContextTest, TheKeyReadsInputAndEnvOnly) {
  const Json input = {{"n", 5}};
  const TemplateScope key = environment_.ForKey(input, "acme");
  EXPECT_EQ(*RenderWith("{{env.WS_CONTEXT_TEST_URL}}:{{input.n}}", key),
            Json("http://acme.example:5"));
  EXPECT_FALSE(RenderWith("{{secret.WS_CONTEXT_TEST}}", key).ok());
  EXPECT_FALSE(RenderWith("{{instance.key}}", key).ok());
  EXPECT_FALSE(RenderWith("{{steps}}", key).ok());
}

}  // namespace
}  // namespace waystone
