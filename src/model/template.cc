#include "model/template.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "model/json_text.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

bool IsPathChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

std::string Trim(std::string_view text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  size_t end = text.find_last_not_of(" \t");
  return std::string(text.substr(begin, end - begin + 1));
}

absl::StatusOr<std::string> ScalarText(const Json& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number() || value.is_boolean()) return JsonText(value);
  return absl::InvalidArgumentError("template {{" + where +
                                    "}} is an object, array or null and cannot be put in text");
}

// Returns the text of the value at `path`; errors name the placeholder.
absl::StatusOr<std::string> PlaceholderText(const std::vector<std::string>& path,
                                            const TemplateScope& context) {
  const std::string where = JoinPath(path);
  const Json* value = context.Find(path);
  if (value == nullptr) {
    return absl::InvalidArgumentError("template {{" + where +
                                      "}} refers to a value that is not there");
  }
  return ScalarText(*value, where);
}

}  // namespace

std::optional<std::vector<std::string>> SolePlaceholder(std::string_view text) {
  auto parsed = Template::Parse(text);
  // The first "}}" ends the text: one placeholder and no literal around it.
  if (!parsed.ok() || !text.starts_with("{{") || text.find("}}") != text.size() - 2 ||
      parsed->references().size() != 1) {
    return std::nullopt;
  }
  return parsed->references().front();
}

std::string JoinPath(const std::vector<std::string>& path) {
  std::string out;
  for (const auto& segment : path) {
    if (!out.empty()) out.push_back('.');
    out += segment;
  }
  return out;
}

absl::StatusOr<Template> Template::Parse(std::string_view text) {
  Template result;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find("{{", at);
    if (open == std::string_view::npos) {
      result.pieces_.push_back({std::string(text.substr(at)), {}});
      break;
    }
    if (open > at) result.pieces_.push_back({std::string(text.substr(at, open - at)), {}});
    const size_t close = text.find("}}", open + 2);
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError("unclosed '{{' in template \"" + std::string(text) + "\"");
    }
    const std::string inner = Trim(text.substr(open + 2, close - open - 2));
    if (inner.empty()) {
      return absl::InvalidArgumentError("empty '{{}}' in template \"" + std::string(text) + "\"");
    }
    std::vector<std::string> path;
    size_t start = 0;
    for (size_t i = 0; i <= inner.size(); ++i) {
      if (i < inner.size() && !IsPathChar(inner[i])) {
        return absl::InvalidArgumentError("'{{" + inner +
                                          "}}' is not a path (letters, digits, "
                                          "'_', '-' separated by '.')");
      }
      if (i == inner.size() || inner[i] == '.') {
        if (i == start) {
          return absl::InvalidArgumentError("'{{" + inner + "}}' has an empty path segment");
        }
        path.push_back(inner.substr(start, i - start));
        start = i + 1;
      }
    }
    result.references_.push_back(path);
    result.pieces_.push_back({"", std::move(path)});
    at = close + 2;
  }
  return result;
}

namespace {

// Resolve from path[first] on.
const Json* ResolveFrom(const Json& root, const std::vector<std::string>& path, size_t first) {
  const Json* node = &root;
  for (size_t i = first; i < path.size(); ++i) {
    const std::string& segment = path[i];
    if (node->is_object()) {
      auto it = node->find(segment);
      if (it == node->end()) return nullptr;
      node = &*it;
    } else if (node->is_array()) {
      size_t index = 0;
      for (char c : segment) {
        if (c < '0' || c > '9') return nullptr;
        index = index * 10 + static_cast<size_t>(c - '0');
      }
      if (index >= node->size()) return nullptr;
      node = &(*node)[index];
    } else {
      return nullptr;
    }
  }
  return node;
}

}  // namespace

const Json* Resolve(const Json& root, const std::vector<std::string>& path) {
  return ResolveFrom(root, path, 0);
}

const Json* TemplateScope::Find(const std::vector<std::string>& path) const {
  if (!path.empty()) {
    for (const Named& named : named_) {
      if (named.value != nullptr && named.name == path[0]) {
        return ResolveFrom(*named.value, path, 1);
      }
    }
  }
  return ResolveFrom(*root_, path, 0);
}

absl::StatusOr<Json> Template::Render(const TemplateScope& context) const {
  if (pieces_.size() == 1 && !pieces_[0].path.empty()) {
    const Json* value = context.Find(pieces_[0].path);
    if (value == nullptr) {
      return absl::InvalidArgumentError("template {{" + JoinPath(pieces_[0].path) +
                                        "}} refers to a value that is not there");
    }
    return *value;
  }
  std::string out;
  for (const auto& piece : pieces_) {
    if (piece.path.empty()) {
      out += piece.literal;
      continue;
    }
    auto text = PlaceholderText(piece.path, context);
    if (!text.ok()) return text.status();
    out += *text;
  }
  return Json(out);
}

absl::StatusOr<std::string> Template::RenderText(const TemplateScope& context) const {
  auto value = Render(context);
  if (!value.ok()) return value.status();
  return ScalarText(*value, references_.empty() ? "" : JoinPath(references_.front()));
}

std::string PercentEncode(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (unsigned char c : value) {
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

namespace {

// Where the text so far has reached inside a URL. kAuthority: the scheme, user, host
// or port may still change, until a '/', '?' or '#' ends the authority.
enum class UrlState { kStart, kAuthority, kPath, kQuery };

// Moves `state` across trusted URL text (a literal, or an env value as the deployment
// configured it). At the start, text without "://" is still the authority: an env
// base "127.0.0.1:8080" is a host and port.
UrlState Advance(UrlState state, std::string_view text) {
  size_t at = 0;
  if (state == UrlState::kStart) {
    const size_t scheme = text.find("://");
    at = scheme == std::string_view::npos ? 0 : scheme + 3;
    state = UrlState::kAuthority;
  }
  for (; at < text.size(); ++at) {
    const char c = text[at];
    if (state == UrlState::kAuthority && c == '/') state = UrlState::kPath;
    if (state != UrlState::kQuery && (c == '?' || c == '#')) state = UrlState::kQuery;
  }
  return state;
}

// The scheme and authority of `url`: everything before the first '/', '?' or '#'
// after "://" (or after the start when there is no "://").
std::string_view SchemeAndAuthority(std::string_view url) {
  const size_t scheme = url.find("://");
  const size_t from = scheme == std::string_view::npos ? 0 : scheme + 3;
  return url.substr(0, std::min(url.size(), url.find_first_of("/?#", from)));
}

bool IsEnv(const std::vector<std::string>& path) { return path[0] == "env"; }

std::string AuthorityError(const std::vector<std::string>& path) {
  return "{{" + JoinPath(path) +
         "}} would be written into the scheme, host or port of the URL, "
         "which only the definition and env values may choose: put a literal '/' between the "
         "base URL and it (\"{{env.BASE_URL}}/{{" +
         JoinPath(path) +
         "}}\"), so that it is a "
         "path segment";
}

}  // namespace

absl::StatusOr<std::string> Template::RenderUrl(const TemplateScope& context) const {
  std::string out;
  UrlState state = UrlState::kStart;
  // The scheme and authority, once fixed by trusted text: every value from input or an
  // answer comes after it, and the URL rendered must keep it.
  std::optional<std::string> fixed;
  for (const Piece& piece : pieces_) {
    if (piece.path.empty()) {
      out += piece.literal;
      state = Advance(state, piece.literal);
      continue;
    }
    const std::string where = JoinPath(piece.path);
    auto text = PlaceholderText(piece.path, context);
    if (!text.ok()) return text.status();
    if (state == UrlState::kStart || state == UrlState::kAuthority) {
      // Only the deployment's env may choose scheme, host and port; its value goes in as
      // written, and a control character would split the request line.
      if (!IsEnv(piece.path))
        return absl::InvalidArgumentError("template " + AuthorityError(piece.path));
      if (std::any_of(text->begin(), text->end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
        return absl::InvalidArgumentError("template {{" + where +
                                          "}} holds a control character; a URL cannot carry it");
      }
      out += *text;
      state = Advance(state, *text);
      continue;
    }
    if (!fixed) fixed = std::string(SchemeAndAuthority(out));
    if (state == UrlState::kPath) {
      // A path segment: '/', '@' and ':' encoded like every reserved character, and
      // "." and ".." (dot-segments that would move the path) too.
      out += *text == "." || *text == ".." ? std::string(text->size() == 1 ? "%2E" : "%2E%2E")
                                           : PercentEncode(*text);
    } else {
      out += PercentEncode(*text);
    }
  }
  if (fixed && SchemeAndAuthority(out) != *fixed) {
    return absl::InvalidArgumentError(
        "the rendered URL's host is not the one its definition "
        "and env fixed; nothing was sent");
  }
  return out;
}

absl::Status Template::CheckUrl() const {
  // Before the values are known, an env value is the authority's end only if literal
  // text after it says so: "{{env.DMS_URL}}{{input.path}}" could put the path into the
  // host ("@evil:81"), as could "{{env.DMS_HOST}}:{{input.port}}".
  UrlState state = UrlState::kStart;
  for (const Piece& piece : pieces_) {
    if (piece.path.empty()) {
      state = Advance(state, piece.literal);
      continue;
    }
    if (state == UrlState::kStart || state == UrlState::kAuthority) {
      if (!IsEnv(piece.path)) return absl::InvalidArgumentError(AuthorityError(piece.path));
      state = UrlState::kAuthority;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> RenderTree(const Json& tree, const TemplateScope& context) {
  if (tree.is_string()) {
    auto parsed = Template::Parse(tree.get<std::string>());
    if (!parsed.ok()) return parsed.status();
    return parsed->Render(context);
  }
  if (tree.is_object()) {
    Json out = Json::object();
    for (auto it = tree.begin(); it != tree.end(); ++it) {
      auto value = RenderTree(it.value(), context);
      if (!value.ok()) return value.status();
      out[it.key()] = std::move(*value);
    }
    return out;
  }
  if (tree.is_array()) {
    Json out = Json::array();
    for (const auto& element : tree) {
      auto value = RenderTree(element, context);
      if (!value.ok()) return value.status();
      out.push_back(std::move(*value));
    }
    return out;
  }
  return tree;
}

absl::Status CollectTreeReferences(const Json& tree,
                                   std::vector<std::vector<std::string>>* references) {
  if (tree.is_string()) {
    auto parsed = Template::Parse(tree.get<std::string>());
    if (!parsed.ok()) return parsed.status();
    for (const auto& ref : parsed->references()) references->push_back(ref);
    return absl::OkStatus();
  }
  if (tree.is_object() || tree.is_array()) {
    for (const auto& element : tree) {
      if (auto status = CollectTreeReferences(element, references); !status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

std::string FormEncode(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : value) {
    if (std::isalnum(c) != 0 || c == '-' || c == '.' || c == '_' || c == '*') {
      out += static_cast<char>(c);
    } else if (c == ' ') {
      out += '+';
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace waystone
