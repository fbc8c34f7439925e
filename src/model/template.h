#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace waystone {

// A string with "{{path}}" placeholders, parsed once. A path is dot-separated
// segments resolved in a JSON context: input.order_id, steps.fetch-customer.response.id,
// env.ERP_URL, secret.ERP_TOKEN, items.0 (array index). An immutable value type.
class Template {
 public:
  // Parses `text`; errors name the offending placeholder (unclosed, empty, bad path).
  static absl::StatusOr<Template> Parse(std::string_view text);

  // Returns every placeholder's path, split into segments, in order of appearance.
  const std::vector<std::vector<std::string>>& references() const { return references_; }

  // Renders against `context`. A template that is exactly one placeholder yields
  // the referenced JSON value unchanged (a number stays a number); otherwise the
  // pieces are joined into a string. Errors name the placeholder, never a value.
  absl::StatusOr<nlohmann::json> Render(const nlohmann::json& context) const;

  // Renders and requires a string, number or boolean result, returned as text.
  absl::StatusOr<std::string> RenderText(const nlohmann::json& context) const;

 private:
  struct Piece {
    std::string literal;                // used when path is empty
    std::vector<std::string> path;      // a placeholder when not empty
  };
  std::vector<Piece> pieces_;
  std::vector<std::vector<std::string>> references_;
};

// Renders every string inside a JSON tree (a request body, say) as a Template.
absl::StatusOr<nlohmann::json> RenderTree(const nlohmann::json& tree,
                                          const nlohmann::json& context);

// Collects the placeholder paths of every string inside a JSON tree; returns the
// first parse error.
absl::Status CollectTreeReferences(const nlohmann::json& tree,
                                   std::vector<std::vector<std::string>>* references);

// Returns the value at `path` inside `root`, or nullptr when any segment is missing.
const nlohmann::json* Resolve(const nlohmann::json& root, const std::vector<std::string>& path);

// Joins a path back into its dotted form, for messages.
std::string JoinPath(const std::vector<std::string>& path);

}  // namespace waystone
