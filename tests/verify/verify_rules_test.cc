// The pure parts of `waystone verify`: the contract it infers of a definition's
// targets, its schedules and their specs, and the invariants it judges by.

#include <set>

#include <gtest/gtest.h>

#include "definition/loader.h"
#include "support/test_paths.h"
#include "verify/contract.h"
#include "verify/oracles.h"
#include "verify/schedules.h"

namespace waystone::verify {
namespace {

WorkflowDefinition Example() {
  auto definition =
      LoadDefinitionFile(waystone::testing::SourceDir() + "/examples/order-to-erp.yaml");
  EXPECT_TRUE(definition.ok()) << definition.status();
  return *definition;
}

TEST(VerifyContractTest, EveryRequestOfTheExampleHasARoute) {
  const WorkflowDefinition definition = Example();
  auto contract = InferContract(definition);
  ASSERT_TRUE(contract.ok()) << contract.status();
  EXPECT_EQ(contract->http_steps.size(), 6u);
  EXPECT_EQ(contract->routes.size(), 8u);  // six calls, a lookup, a compensation
  EXPECT_EQ(contract->url_envs,
            (std::vector<std::string>{"CRM_URL", "EMAIL_URL", "ERP_URL", "LINE_URL"}));
  EXPECT_EQ(contract->secrets, (std::vector<std::string>{"ERP_TOKEN", "LINE_TOKEN"}));

  const Route* create = MatchRoute(*contract, "POST", "/erp/orders");
  ASSERT_NE(create, nullptr);
  EXPECT_EQ(create->step, "create-order");
  EXPECT_FALSE(create->honors_key);  // protected by its lookup: the target will not deduplicate
  EXPECT_EQ(create->lookup_id_pointer, "/id");
  const Route* cancel = MatchRoute(*contract, "POST", "/erp/orders/v1/cancel");
  ASSERT_NE(cancel, nullptr);
  EXPECT_EQ(cancel->role, Role::kCompensate);
  const Route* line = MatchRoute(*contract, "POST", "/line/push");
  ASSERT_NE(line, nullptr);
  EXPECT_TRUE(line->honors_key);
  EXPECT_NE(std::find(line->key_headers.begin(), line->key_headers.end(), "x-line-retry-key"),
            line->key_headers.end());
  EXPECT_EQ(MatchRoute(*contract, "DELETE", "/erp/orders"), nullptr);
}

TEST(VerifyContractTest, WhatVerifyCannotStandInForIsNamedWithItsLine) {
  auto definition = LoadDefinitionText(R"(
workflow: fixed
key: "{{input.id}}"
steps:
  - name: call-erp
    request: { method: GET, url: "https://erp.example.com/orders/{{input.id}}" }
)",
                                       "fixed.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  auto contract = InferContract(*definition);
  ASSERT_FALSE(contract.ok());
  EXPECT_NE(contract.status().message().find("fixed.yaml:5: step 'call-erp'"), std::string::npos)
      << contract.status();
  EXPECT_NE(contract.status().message().find("{{env.NAME}}"), std::string::npos);
}

TEST(VerifyContractTest, AnInputIsSynthesizedFromWhatTheTemplatesRead) {
  const std::string input = SynthesizeInput(Example());
  EXPECT_NE(input.find(R"("order_id":"verify-order_id")"), std::string::npos) << input;
  EXPECT_NE(input.find(R"("customer_id":"verify-customer_id")"), std::string::npos) << input;
}

TEST(VerifySchedulesTest, EverySpecReadsBackAsTheSameSchedule) {
  const WorkflowDefinition definition = Example();
  auto contract = InferContract(definition);
  ASSERT_TRUE(contract.ok());
  const std::vector<Schedule> all = AllSchedules(definition, *contract);
  EXPECT_GT(all.size(), 100u);
  std::set<std::string> specs;
  for (const Schedule& schedule : all) {
    auto parsed = ParseSpec(schedule.Spec(), *contract);
    ASSERT_TRUE(parsed.ok()) << schedule.Spec() << ": " << parsed.status();
    EXPECT_EQ(parsed->Spec(), schedule.Spec());
    EXPECT_TRUE(specs.insert(schedule.Spec()).second) << "twice: " << schedule.Spec();
  }
  for (int i = 0; i < 200; ++i) {
    const Schedule drawn = RandomSchedule(definition, *contract, 5, i);
    EXPECT_EQ(drawn.Spec(), RandomSchedule(definition, *contract, 5, i).Spec());
    auto parsed = ParseSpec(drawn.Spec(), *contract);
    ASSERT_TRUE(parsed.ok()) << drawn.Spec() << ": " << parsed.status();
    EXPECT_EQ(parsed->Spec(), drawn.Spec());
  }
}

TEST(VerifySchedulesTest, AnApprovalStepIsKilledAroundItsDecision) {
  auto definition = LoadDefinitionFile(waystone::testing::SourceDir() +
                                       "/examples/server/definitions/order-approval.yaml");
  ASSERT_TRUE(definition.ok()) << definition.status();
  auto contract = InferContract(*definition);
  ASSERT_TRUE(contract.ok()) << contract.status();
  ASSERT_EQ(contract->waiting_steps, std::vector<int>{0});
  std::vector<std::string> specs;
  for (const Schedule& schedule : AllSchedules(*definition, *contract)) {
    specs.push_back(schedule.Spec());
    auto parsed = ParseSpec(schedule.Spec(), *contract, &*definition);
    EXPECT_TRUE(parsed.ok()) << schedule.Spec() << ": " << parsed.status();
  }
  EXPECT_NE(std::find(specs.begin(), specs.end(), "crash:during-wait:approve#1"), specs.end());
  EXPECT_NE(std::find(specs.begin(), specs.end(), "crash:after-signal:approve#1"), specs.end());
  EXPECT_FALSE(ParseSpec("crash:during-wait:create-order#1", *contract, &*definition).ok());
}

TEST(VerifySchedulesTest, ABadSpecNamesTheItem) {
  const WorkflowDefinition definition = Example();
  auto contract = InferContract(definition);
  ASSERT_TRUE(contract.ok());
  for (const char* spec :
       {"call:nope#1=reset", "call:create-order#1=explode", "lookup:fetch-customer#1=reset",
        "crash:somewhere:create-order#1", "starts:thrice", "call:create-order#0=reset"}) {
    auto parsed = ParseSpec(spec, *contract);
    EXPECT_FALSE(parsed.ok()) << spec;
  }
  auto parsed =
      ParseSpec("call:create-order#*=unavailable;crash:after-call:create-order#2", *contract);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->FaultFor("create-order", Role::kCall, 7), Outcome::kUnavailable);
  EXPECT_EQ(parsed->crash_occurrence, 2);
}

RunResult Ended(std::string state, std::vector<RunResult::Step> steps, std::string reason = "why") {
  RunResult result;
  result.reported = true;
  result.state = std::move(state);
  result.reason = std::move(reason);
  result.steps = std::move(steps);
  if (result.state == "needs_attention") result.open_alerts = {"needs_operator:create-order"};
  return result;
}

RunResult WithoutAlerts(RunResult result) {
  result.open_alerts.clear();
  return result;
}

TEST(VerifyOraclesTest, EachInvariantCatchesItsBreach) {
  const WorkflowDefinition definition = Example();
  auto contract = InferContract(definition);
  ASSERT_TRUE(contract.ok());
  auto create = [](std::string step, std::string id, int seq) {
    return Effect{std::move(step), Role::kCall, std::move(id), "create", seq};
  };
  auto cancel = [](std::string step, std::string id, int seq) {
    return Effect{std::move(step), Role::kCompensate, std::move(id), "cancel", seq};
  };
  struct Case {
    const char* name;
    Observed observed;
    RunResult result;
    bool clean;
    const char* broken;  // nullptr: holds
  };
  auto delivered = [](std::string id, std::string type, std::string step = "",
                      std::string body = "b") {
    return DeliveredEvent{std::move(id), std::move(type), std::move(step), "", std::move(body)};
  };
  auto with_events = [](Observed observed, std::vector<DeliveredEvent> events) {
    observed.events = std::move(events);
    return observed;
  };
  const DeliveredEvent done = delivered("e9", "waystone.instance.completed");
  const std::vector<Case> cases{
      {"one order, completed", with_events({{create("create-order", "o1", 1)}}, {done}),
       Ended("completed", {{"create-order", "completed", "o1"}}, ""), true, nullptr},
      {"an event delivered twice, the same",
       with_events({{create("create-order", "o1", 1)}},
                   {delivered("e1", "waystone.step.completed", "create-order"),
                    delivered("e1", "waystone.step.completed", "create-order"), done}),
       Ended("completed", {{"create-order", "completed", "o1"}}, ""), false, nullptr},
      {"an event id with two contents",
       with_events({}, {delivered("e1", "x", "", "a"), delivered("e1", "x", "", "b"), done}),
       Ended("completed", {}, ""), false, "delivered twice with different contents"},
      {"an event for a step not done",
       with_events({}, {delivered("e1", "waystone.step.completed", "create-order")}),
       Ended("needs_attention", {{"create-order", "unknown", ""}}), false,
       "an event says step 'create-order' completed"},
      {"the last event never delivered",
       {},
       Ended("completed", {}, ""),
       false,
       "was never delivered"},
      {"two orders",
       {{create("create-order", "o1", 1), create("create-order", "o2", 2)}},
       Ended("completed", {{"create-order", "completed", "o2"}}, ""),
       false,
       "took effect 2 times"},
      {"adopted the wrong one",
       {{create("create-order", "o1", 1)}},
       Ended("completed", {{"create-order", "completed", "o9"}}, ""),
       false,
       "recorded external id 'o9'"},
      {"an effect the instance does not know of",
       {{create("create-order", "o1", 1)}},
       Ended("failed", {{"create-order", "failed", ""}}),
       false,
       "the target holds the effect"},
      {"waiting for an operator without an alert",
       with_events({}, {delivered("e3", "waystone.instance.needs_attention")}),
       WithoutAlerts(Ended("needs_attention", {})), false, "no alert says why"},
      {"an effect an operator is asked about",
       with_events({{create("create-order", "o1", 1)}},
                   {delivered("e2", "waystone.instance.needs_attention")}),
       Ended("needs_attention", {{"create-order", "unknown", ""}}), false, nullptr},
      {"still running", {}, Ended("running", {}), false, "did not come to rest"},
      {"clean, not completed", {}, Ended("failed", {}), true, "with nothing injected"},
      {"no reason", {}, Ended("failed", {}, ""), false, "without a reason"},
      {"compensated twice",
       {{create("create-order", "o1", 1), cancel("create-order", "o1", 2),
         cancel("create-order", "c2", 3)}},
       Ended("compensated", {{"create-order", "compensated", "o1"}}),
       false,
       "compensation of 'create-order' took effect 2 times"},
      {"compensated, but one was left",
       {{create("create-order", "o1", 1)}},
       Ended("compensated", {{"create-order", "compensated", "o1"}}),
       false,
       "never compensated"},
      {"compensated what never happened",
       {{cancel("create-order", "o1", 1)}},
       Ended("compensated", {{"create-order", "pending", ""}}),
       false,
       "the step never did"},
      {"completed and compensated",
       {{create("create-order", "o1", 1), cancel("create-order", "o1", 2)}},
       Ended("completed", {{"create-order", "completed", "o1"}}, ""),
       false,
       "yet compensations took effect"},
      {"compensated out of order",
       {{create("create-order", "o1", 1), create("reserve-shipment", "s1", 2),
         cancel("create-order", "o1", 3), cancel("reserve-shipment", "s1", 4)}},
       Ended("compensated",
             {{"create-order", "compensated", "o1"}, {"reserve-shipment", "compensated", "s1"}}),
       false,
       "compensated before"},
      {"no result", {}, RunResult{}, false, "no result"},
  };
  for (const Case& c : cases) {
    const std::vector<std::string> broken = Judge(*contract, c.observed, c.result, c.clean);
    if (c.broken == nullptr) {
      EXPECT_TRUE(broken.empty()) << c.name << ": " << (broken.empty() ? "" : broken.front());
      continue;
    }
    bool found = false;
    for (const std::string& line : broken) found |= line.find(c.broken) != std::string::npos;
    EXPECT_TRUE(found) << c.name << ": expected '" << c.broken << "' among " << broken.size()
                       << (broken.empty() ? "" : ": " + broken.front());
  }
}

}  // namespace
}  // namespace waystone::verify
