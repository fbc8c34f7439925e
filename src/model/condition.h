#pragma once

// A step's `when:` condition: whether the step runs at all, judged over the
// instance's input and earlier steps' results when the step is first due. No I/O.

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "model/template.h"

namespace waystone {

struct Condition {
  enum class Test : uint8_t {
    kAlways = 0,     // no `when:`: the step runs
    kTrue = 1,       // `when: "{{input.send_email}}"`: the value must be true or false
    kPresent = 2,    // `when: { present: "{{input.email}}" }`: there, not null, not ""
    kAbsent = 3,     // `when: { absent: "{{input.email}}" }`: the opposite
    kEquals = 4,     // `when: { equals: ["{{input.channel}}", "line"] }`: same text
    kNotEquals = 5,  // `when: { not_equals: [...] }`
  };
  Test test = Test::kAlways;
  std::string value;  // a template: the value judged (kPresent/kAbsent: one placeholder)
  std::string other;  // kEquals/kNotEquals: the template it is compared with
  std::string shown;  // the condition as written, for plan, lint and the step's reason

  bool Always() const { return test == Test::kAlways; }
};

// Judges `condition` against a step's template context. Errors name the template
// that could not be judged (a missing path for kTrue/kEquals, a value that is not
// true or false), never a value.
absl::StatusOr<bool> Holds(const Condition& condition, const TemplateScope& context);

}  // namespace waystone
