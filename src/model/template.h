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

  // Renders a URL: literal text stays as written, and every placeholder value is
  // percent-encoded (RFC 3986) by the rules of the part it stands in: a path
  // segment (only unreserved characters, ':' and '@' kept; '/' is encoded) or a
  // query or fragment value (only unreserved characters kept; '&', '=', '+', '#',
  // space are encoded). A placeholder at the very start is the base URL
  // (`{{env.ERP_URL}}/orders`) and is inserted as written.
  absl::StatusOr<std::string> RenderUrl(const TemplateScope& context) const;

  // Returns an error when a placeholder sits where percent-encoding cannot make
  // its value safe: inside the scheme or authority (host, port, user) after a
  // literal beginning, e.g. "http://{{input.host}}/x" (env values are allowed).
  absl::Status CheckUrl() const;

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
                                          const TemplateScope& context);

// Collects the placeholder paths of every string inside a JSON tree; returns the
// first parse error.
absl::Status CollectTreeReferences(const nlohmann::json& tree,
                                   std::vector<std::vector<std::string>>* references);

// Returns the value at `path` inside `root`, or nullptr when any segment is missing.
const nlohmann::json* Resolve(const nlohmann::json& root, const std::vector<std::string>& path);

// Which part of a URL a value is placed in.
enum class UrlPart : uint8_t { kPathSegment = 1, kQuery = 2 };

// Percent-encodes `value` for `part` (UTF-8 bytes outside the kept set become %XX).
std::string PercentEncode(std::string_view value, UrlPart part);

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
