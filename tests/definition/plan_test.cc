#include "definition/plan.h"

#include <gtest/gtest.h>

#include "definition/loader.h"
#include "support/process.h"

namespace waystone {
namespace {

TEST(PlanTest, NamesEveryStepWithItsRecovery) {
  auto definition = LoadDefinitionFile(testing::SourceDir() + "/examples/order-to-erp.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const std::string plan = RenderPlan(*definition);
  for (const auto& step : definition->steps) {
    EXPECT_NE(plan.find(step.name + "  [" + std::string(ToString(step.recovery)) + "]"),
              std::string::npos)
        << step.name;
  }
  EXPECT_NE(plan.find("look up GET"), std::string::npos);
  EXPECT_NE(plan.find("{{instance.key}}:create-order:compensate"), std::string::npos);
  EXPECT_NE(plan.find("409 -> rejected"), std::string::npos);
  EXPECT_NE(plan.find("reverse order"), std::string::npos);
}

TEST(PlanTest, SaysHowALookupReadsPagesAndWhatBodyRulesMean) {
  auto definition = LoadDefinitionFile(testing::SourceDir() + "/examples/order-to-paged-erp.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const std::string plan = RenderPlan(*definition);
  EXPECT_NE(plan.find("every page, following /next (same origin, at most 20 pages)"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("no earlier than 5000ms after the request left"), std::string::npos) << plan;
  EXPECT_NE(plan.find("body rule:  /status = ERROR and /code = RATE_LIMIT -> transient"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("body rule:  /status = ERROR and /code = DUPLICATE -> exists: never "
                      "resent; look up and adopt"),
            std::string::npos)
      << plan;
}

}  // namespace
TEST(PlanTest, SaysWhatAnUploadSendsAndHowATargetAuthorises) {
  auto definition = LoadDefinitionFile(testing::SourceDir() + "/examples/invoice-to-dms.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const std::string plan = RenderPlan(*definition);
  EXPECT_NE(plan.find("target erp: {{env.ERP_URL}}/erp; OAuth2 client credentials from "
                      "{{env.ERP_TOKEN_URL}}"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("sends:      multipart file 'file' from the files folder's {{input.pdf}}, "
                      "pinned by SHA-256"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("sends:      form fields"), std::string::npos) << plan;
}

}  // namespace waystone

namespace waystone {
namespace {

TEST(PlanTest, SaysWhenAStepRunsAndWhatAnOptionalOnesFailureDoes) {
  auto definition = LoadDefinitionText(R"(workflow: notify
key: "{{input.id}}"
steps:
  - name: line
    when: { present: "{{input.line_id}}" }
    optional: true
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/line" }
  - name: order
    idempotency: { honored: true }
    request: { method: POST, url: "http://x/order" }
)",
                                       "notify.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  const std::string plan = RenderPlan(*definition);
  EXPECT_NE(plan.find("1. line  [repeatable]  optional\n"), std::string::npos) << plan;
  EXPECT_NE(plan.find("when:       present {{input.line_id}}  (judged once"), std::string::npos)
      << plan;
  EXPECT_NE(plan.find("rejected:   no retry; alert and go on without it"), std::string::npos)
      << plan;
  EXPECT_NE(plan.find("rejected:   no retry; fail the instance and compensate"), std::string::npos)
      << plan;
}

}  // namespace
}  // namespace waystone
