// A step's `when:`: a template that renders true or false, or a comparison.
// Declared in definition_readers.h.

#include <string>

#include "definition/definition_readers.h"

namespace waystone {
namespace {
using Json = nlohmann::json;
}  // namespace

// Reads `when:`: a template that renders true or false, or exactly one of
// { present: "{{path}}" }, { absent: "{{path}}" }, { equals: [a, b] },
// { not_equals: [a, b] }.
void ConditionReader::ReadCondition(const YAML::Node& when, const std::string& step,
                                    Condition* out) {
  static constexpr char kForms[] =
      "'when' is a template that renders true or false (\"{{input.send_email}}\") or one of "
      "{ present: \"{{input.email}}\" }, { absent: ... }, { equals: [\"{{input.channel}}\", "
      "line] }, { not_equals: [...] }";
  using Test = Condition::Test;
  if (when.IsScalar()) {
    out->test = Test::kTrue;
    out->value = when.Scalar();
    out->shown = out->value;
    if (auto parsed = Template::Parse(out->value); !parsed.ok()) {
      Error(when, step, "when: " + std::string(parsed.status().message()));
    } else if (!SolePlaceholder(out->value)) {
      Error(when, step,
            "'when' as a value is exactly one placeholder that renders true or "
            "false, such as \"{{input.send_email}}\" (a literal would always or "
            "never hold: remove the step or the condition instead)");
    }
    return;
  }
  if (!when.IsMap() || when.size() != 1) {
    Error(when, step, kForms);
    return;
  }
  const std::string test = when.begin()->first.Scalar();
  const YAML::Node operand = when.begin()->second;
  if (test == "present" || test == "absent") {
    if (!operand.IsScalar()) {
      Error(operand, step, "'when." + test + "' names one value, e.g. \"{{input.email}}\"");
      return;
    }
    out->test = test == "present" ? Test::kPresent : Test::kAbsent;
    out->value = operand.Scalar();
    if (auto parsed = Template::Parse(out->value); !parsed.ok()) {
      Error(operand, step, "when." + test + ": " + std::string(parsed.status().message()));
    } else if (!SolePlaceholder(out->value)) {
      Error(operand, step,
            "'when." + test +
                "' is exactly one placeholder such as "
                "\"{{input.email}}\", nothing around it");
    }
    out->shown = test + " " + out->value;
    return;
  }
  if (test == "equals" || test == "not_equals") {
    if (!operand.IsSequence() || operand.size() != 2 || !operand[0].IsScalar() ||
        !operand[1].IsScalar()) {
      Error(operand, step,
            "'when." + test +
                "' compares two values: [\"{{input.channel}}\", "
                "line]");
      return;
    }
    out->test = test == "equals" ? Test::kEquals : Test::kNotEquals;
    out->value = operand[0].Scalar();
    out->other = operand[1].Scalar();
    out->shown = out->value + (test == "equals" ? " == " : " != ") + out->other;
    return;
  }
  Error(when.begin()->first, step, kForms);
}

}  // namespace waystone
