#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace waystone {

// What templates read: a JSON object, and beside it up to two objects found under
// their own top-level names without being copied into it (the environment and the
// secrets, which every instance's context shares). A name given here hides a member
// of that name in the object. Holds pointers: valid while what it was made from
// lives; made for one render, never kept.
class TemplateScope {
 public:
  // Every JSON object is a scope of its own members.
  TemplateScope(const nlohmann::json& root)  // NOLINT(google-explicit-constructor)
      : root_(&root) {}
  TemplateScope(const nlohmann::json& root, std::string_view name, const nlohmann::json* value,
                std::string_view other_name = {}, const nlohmann::json* other_value = nullptr)
      : root_(&root), named_{{{name, value}, {other_name, other_value}}} {}

  // Returns the value at `path`, or nullptr when any segment is missing.
  const nlohmann::json* Find(const std::vector<std::string>& path) const;

 private:
  struct Named {
    std::string_view name;  // empty: unused
    const nlohmann::json* value = nullptr;
  };
  const nlohmann::json* root_;
  std::array<Named, 2> named_{};
};

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
  absl::StatusOr<nlohmann::json> Render(const TemplateScope& context) const;

  // Renders and requires a string, number or boolean result, returned as text.
  absl::StatusOr<std::string> RenderText(const TemplateScope& context) const;

  // Renders a URL: literal text stays as written, and every value from anything but
  // env is percent-encoded (RFC 3986: only unreserved characters kept, so '/', '@',
  // ':', '?', '&', '=', '#' are encoded) as one path segment or query value. Scheme,
  // host and port come from literal text and env values only, and are fixed before
  // any other value is written: a value that would land in them is refused (so is
  // "{{env.DMS_URL}}{{input.path}}" when DMS_URL has no path), and the URL rendered
  // must keep the authority that was fixed. A placeholder at the very start is the
  // base URL (`{{env.ERP_URL}}/orders`) and must be an env value.
  absl::StatusOr<std::string> RenderUrl(const TemplateScope& context) const;

  // What lint says before values are known: an error when a placeholder other than an
  // env value could land in the scheme, host or port, i.e. comes before a literal '/',
  // '?' or '#' ends the authority: "http://{{input.host}}/x", "{{input.url}}/x",
  // "{{env.DMS_URL}}{{input.path}}", "{{env.DMS_HOST}}:{{input.port}}".
  absl::Status CheckUrl() const;

 private:
  struct Piece {
    std::string literal;            // used when path is empty
    std::vector<std::string> path;  // a placeholder when not empty
  };
  std::vector<Piece> pieces_;
  std::vector<std::vector<std::string>> references_;
};

// Renders every string inside a JSON tree (a request body, say) as a Template.
absl::StatusOr<nlohmann::json> RenderTree(const nlohmann::json& tree, const TemplateScope& context);

// Collects the placeholder paths of every string inside a JSON tree; returns the
// first parse error.
absl::Status CollectTreeReferences(const nlohmann::json& tree,
                                   std::vector<std::vector<std::string>>* references);

// Returns the value at `path` inside `root`, or nullptr when any segment is missing.
const nlohmann::json* Resolve(const nlohmann::json& root, const std::vector<std::string>& path);

// Percent-encodes `value` for a URL's path segment or query value: UTF-8 bytes other
// than RFC 3986's unreserved characters (letters, digits, "-._~") become %XX.
std::string PercentEncode(std::string_view value);

// Encodes `value` as application/x-www-form-urlencoded does (WHATWG URL's urlencoded
// serializer, RFC 6749 Appendix B): letters, digits and "*-._" kept, space as '+',
// every other byte %XX.
std::string FormEncode(std::string_view value);

// Returns the path of `text` when it is exactly one placeholder with nothing around
// it ("{{input.email}}"); nullopt for anything else (a literal, two placeholders,
// text around one, a parse error).
std::optional<std::vector<std::string>> SolePlaceholder(std::string_view text);

// Joins a path back into its dotted form, for messages.
std::string JoinPath(const std::vector<std::string>& path);

}  // namespace waystone
