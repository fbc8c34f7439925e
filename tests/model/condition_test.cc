#include "model/condition.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace waystone {
namespace {

using Json = nlohmann::json;
using When = Condition::Test;

const Json& Context() {
  static const Json context = Json::parse(R"({
    "input": {"send": true, "quiet": false, "word": "true", "email": "a@example.com",
              "blank": "", "none": null, "n": 5, "channel": "line", "tags": ["x"]},
    "steps": {"create": {"external_id": "ORD-1"}}
  })");
  return context;
}

Condition Make(When test, std::string value, std::string other = "") {
  return {test, std::move(value), std::move(other), "shown"};
}

TEST(ConditionTest, WhatEachTestSaysOfTheContext) {
  struct Row {
    Condition condition;
    bool holds;
  };
  const std::vector<Row> table = {
      {Condition{}, true},
      {Make(When::kTrue, "{{input.send}}"), true},
      {Make(When::kTrue, "{{input.quiet}}"), false},
      {Make(When::kTrue, "{{input.word}}"), true},  // the text "true" counts as true
      {Make(When::kPresent, "{{input.email}}"), true},
      {Make(When::kPresent, "{{input.blank}}"), false},  // "" is not an address
      {Make(When::kPresent, "{{input.none}}"), false},
      {Make(When::kPresent, "{{input.missing}}"), false},
      {Make(When::kPresent, "{{steps.create.external_id}}"), true},
      {Make(When::kPresent, "{{steps.skipped.external_id}}"), false},
      {Make(When::kAbsent, "{{input.missing}}"), true},
      {Make(When::kAbsent, "{{input.email}}"), false},
      {Make(When::kEquals, "{{input.channel}}", "line"), true},
      {Make(When::kEquals, "{{input.channel}}", "email"), false},
      {Make(When::kEquals, "{{input.n}}", "5"), true},  // compared as text
      {Make(When::kEquals, "{{input.send}}", "true"), true},
      {Make(When::kNotEquals, "{{input.channel}}", "email"), true},
      {Make(When::kNotEquals, "{{input.channel}}", "line"), false},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.condition.value + " / " + row.condition.other);
    auto holds = Holds(row.condition, Context());
    ASSERT_TRUE(holds.ok()) << holds.status();
    EXPECT_EQ(*holds, row.holds);
  }
}

TEST(ConditionTest, AConditionThatCannotBeJudgedSaysWhichTemplateNeverTheValue) {
  auto missing = Holds(Make(When::kTrue, "{{input.missing}}"), Context());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("input.missing"), std::string::npos)
      << missing.status();
  auto not_boolean = Holds(Make(When::kTrue, "{{input.email}}"), Context());
  ASSERT_FALSE(not_boolean.ok());
  EXPECT_EQ(not_boolean.status().message(), "{{input.email}} is string, not true or false");
  EXPECT_EQ(not_boolean.status().message().find("a@example.com"), std::string::npos);
  auto number = Holds(Make(When::kTrue, "{{input.n}}"), Context());
  EXPECT_FALSE(number.ok());
  auto compared_missing = Holds(Make(When::kEquals, "{{input.missing}}", "x"), Context());
  EXPECT_FALSE(compared_missing.ok());
  auto compared_array = Holds(Make(When::kEquals, "{{input.tags}}", "x"), Context());
  EXPECT_FALSE(compared_array.ok());
}

}  // namespace
}  // namespace waystone
