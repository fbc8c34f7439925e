#include "model/condition.h"

#include <nlohmann/json.hpp>

#include "model/template.h"

namespace waystone {

absl::StatusOr<bool> Holds(const Condition& condition, const TemplateScope& context) {
  using Test = Condition::Test;
  switch (condition.test) {
    case Test::kAlways:
      return true;
    case Test::kTrue: {
      auto value = Template::Parse(condition.value);
      if (!value.ok()) return value.status();
      auto rendered = value->Render(context);
      if (!rendered.ok()) return rendered.status();
      if (rendered->is_boolean()) return rendered->get<bool>();
      if (*rendered == "true" || *rendered == "false") return *rendered == "true";
      return absl::InvalidArgumentError(condition.value + " is " +
                                        std::string(rendered->type_name()) + ", not true or false");
    }
    case Test::kPresent:
    case Test::kAbsent: {
      auto value = Template::Parse(condition.value);
      if (!value.ok()) return value.status();
      bool present = false;
      if (value->references().size() == 1) {
        const nlohmann::json* found = context.Find(value->references()[0]);
        present = found != nullptr && !found->is_null() &&
                  !(found->is_string() && found->get_ref<const std::string&>().empty());
      }
      return condition.test == Test::kPresent ? present : !present;
    }
    case Test::kEquals:
    case Test::kNotEquals: {
      auto left = Template::Parse(condition.value);
      if (!left.ok()) return left.status();
      auto right = Template::Parse(condition.other);
      if (!right.ok()) return right.status();
      auto left_text = left->RenderText(context);
      if (!left_text.ok()) return left_text.status();
      auto right_text = right->RenderText(context);
      if (!right_text.ok()) return right_text.status();
      return (*left_text == *right_text) == (condition.test == Test::kEquals);
    }
  }
  return absl::InvalidArgumentError("when: unknown test");
}

}  // namespace waystone
