#include "server/redaction.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "engine/catalog.h"
#include "model/template.h"
#include "server/api_handlers.h"
#include "server/permissions.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// Shorter values are hidden only where they are the whole string: quoted in a
// message, they would blank out unrelated text (a "5" in every message).
constexpr size_t kShortestQuoted = 4;

void CollectLeaves(const Json& value, std::vector<std::string>* out) {
  if (value.is_object() || value.is_array()) {
    for (const Json& member : value) CollectLeaves(member, out);
    return;
  }
  const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (!text.empty()) out->push_back(text);
}

// Applies `pointers` to `document`, returning whether it held any; the values
// they named are added to `hidden`. A pointer through a value of another type
// (an index into an object) names nothing.
bool HidePointers(const std::vector<Json::json_pointer>& pointers, Json& document,
                  std::vector<std::string>* hidden) {
  bool any = false;
  for (const auto& pointer : pointers) {
    try {
      if (!document.contains(pointer)) continue;
      CollectLeaves(document.at(pointer), hidden);
      document[pointer] = kRedactedValue;
      any = true;
    } catch (const Json::exception&) {
    }
  }
  return any;
}

// Returns the end of the JSON object or array that starts at `at` (its brackets
// balanced outside strings), or npos when it does not close.
size_t EndOfJson(const std::string& text, size_t at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

// A string that quotes a JSON body ("HTTP 422: {...}; manual step: ..."): the body
// with the pointers hidden, written back between the same prefix and suffix.
void HideInQuotedBody(const std::vector<Json::json_pointer>& pointers, std::string& text,
                      std::vector<std::string>* hidden) {
  const size_t at = text.find_first_of("{[");
  if (at == std::string::npos) return;
  const size_t end = EndOfJson(text, at);
  if (end == std::string::npos) return;
  Json body = Json::parse(text.substr(at, end - at), nullptr, false);
  if (body.is_discarded() || !HidePointers(pointers, body, hidden)) return;
  text = text.substr(0, at) + body.dump() + text.substr(end);
}

// `value` as JSON encoders write it inside a string: escaping only quotes, backslashes
// and controls (most), or every non-ASCII character too, as \u00eb (Python's json) or
// \u00EB. A redacted "Zo\u00eb" in a quoted answer is the value "Zo\u00eb" decoded.
std::vector<std::string> EscapedForms(const std::string& value) {
  auto unquoted = [](std::string text) { return text.substr(1, text.size() - 2); };
  std::vector<std::string> out;
  out.push_back(unquoted(Json(value).dump(-1, ' ', false, Json::error_handler_t::replace)));
  std::string ascii = unquoted(Json(value).dump(-1, ' ', true, Json::error_handler_t::replace));
  std::string upper = ascii;
  for (size_t at = upper.find("\\u"); at != std::string::npos; at = upper.find("\\u", at + 2)) {
    for (size_t i = at + 2; i < at + 6 && i < upper.size(); ++i) {
      upper[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(upper[i])));
    }
  }
  out.push_back(std::move(ascii));
  out.push_back(std::move(upper));
  return out;
}

void ForEachString(Json& value, const std::function<void(Json&)>& visit) {
  if (value.is_object() || value.is_array()) {
    for (Json& member : value) ForEachString(member, visit);
  } else if (value.is_string()) {
    visit(value);
  }
}

}  // namespace

namespace {

// An approval's snapshot shows input fields by pointer ({"fields": {"/customer": …}}):
// each field at or under a redacted pointer is hidden whole, and within a field above
// one the redacted part is hidden, wherever a "snapshot" object is in `shown`.
void HideSnapshotFields(const std::vector<std::string>& pointer_texts, Json& shown,
                        std::vector<std::string>* hidden) {
  if (shown.is_array()) {
    for (Json& item : shown) HideSnapshotFields(pointer_texts, item, hidden);
    return;
  }
  if (!shown.is_object()) return;
  for (auto it = shown.begin(); it != shown.end(); ++it) {
    if (it.key() != "snapshot" || !it->is_object() || !it->contains("fields") ||
        !(*it)["fields"].is_object()) {
      HideSnapshotFields(pointer_texts, *it, hidden);
      continue;
    }
    for (auto field = (*it)["fields"].begin(); field != (*it)["fields"].end(); ++field) {
      const std::string& at = field.key();
      for (const std::string& redacted : pointer_texts) {
        if (at == redacted || at.starts_with(redacted + "/")) {
          if (field->is_string()) hidden->push_back(field->get<std::string>());
          *field = kRedactedValue;
          break;
        }
        if (redacted.starts_with(at + "/")) {
          try {
            const Json::json_pointer inner(redacted.substr(at.size()));
            if (field->contains(inner)) {
              Json& value = field->at(inner);
              if (value.is_string()) hidden->push_back(value.get<std::string>());
              value = kRedactedValue;
            }
          } catch (const Json::exception&) {
          }
        }
      }
    }
  }
}

}  // namespace

void RedactValues(const std::vector<std::string>& pointer_texts, const InstanceRecord& instance,
                  const std::vector<StepRecord>& steps, Json& shown) {
  if (pointer_texts.empty()) return;
  std::vector<Json::json_pointer> pointers;
  for (const std::string& text : pointer_texts) {
    try {
      pointers.emplace_back(text);  // the definition loader checked its form
    } catch (const Json::exception&) {
    }
  }
  // The stored documents name the values; what is shown is then hidden where it
  // is a document (the input), quotes a body, or quotes a value.
  std::vector<std::string> hidden;
  std::vector<Json> documents = {Json::parse(instance.input_json, nullptr, false)};
  for (const StepRecord& s : steps) {
    if (!s.response_json.empty()) documents.push_back(Json::parse(s.response_json, nullptr, false));
  }
  for (Json& document : documents) {
    if (!document.is_discarded()) HidePointers(pointers, document, &hidden);
  }
  if (shown.is_object() && shown.contains("input")) HidePointers(pointers, shown["input"], &hidden);
  HideSnapshotFields(pointer_texts, shown, &hidden);
  ForEachString(shown, [&](Json& value) {
    std::string text = value.get<std::string>();
    HideInQuotedBody(pointers, text, &hidden);
    value = text;
  });
  // As a URL holds them too (a dry run's rendered_url): percent-encoded; and as a JSON
  // text quotes them (a downstream's answer inside a message): escaped.
  const size_t plain = hidden.size();
  for (size_t i = 0; i < plain; ++i) {
    std::string encoded = PercentEncode(hidden[i]);
    if (encoded != hidden[i]) hidden.push_back(std::move(encoded));
    for (std::string& escaped : EscapedForms(hidden[i])) {
      if (escaped != hidden[i]) hidden.push_back(std::move(escaped));
    }
  }
  // The longest first: a value that contains another is hidden whole.
  std::sort(hidden.begin(), hidden.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  ForEachString(shown, [&](Json& value) {
    std::string text = value.get<std::string>();
    for (const std::string& h : hidden) {
      if (text == h) {
        value = kRedactedValue;
        return;
      }
      if (h.size() < kShortestQuoted) continue;
      for (size_t at = text.find(h); at != std::string::npos; at = text.find(h, at)) {
        text.replace(at, h.size(), kRedactedValue);
        at += sizeof(kRedactedValue) - 1;
      }
    }
    value = text;
  });
}

namespace {

// The redact: list to apply for `principal` to what is shown of `instance`; null
// when it may see redacted values there, or nothing is to be hidden.
std::shared_ptr<const WorkflowDefinition> HidingDefinition(const ApiContext& ctx,
                                                           const Principal& principal,
                                                           const InstanceRecord& instance) {
  if (PermissionsOf(ctx.options.permissions, principal.role, instance.tenant)
          .contains(Permission::kSeeRedacted)) {
    return nullptr;
  }
  auto definition = ctx.definitions->Get(instance.definition_hash);
  // Its definition is gone: nothing says what to hide, and nothing of it can be shown
  // as the definition wanted; the input and results stay as stored.
  if (!definition.ok() || (*definition)->redact.empty()) return nullptr;
  return *definition;
}

// Where a definition redacts values, the input hashes shown to a principal who may not
// see them are keyed by the server's secret and the tenant: a plain SHA-256 of the
// input gives a redacted value of few possibilities (a date of birth) to whoever
// tries them all. Equal inputs of one tenant still show equal hashes.
void KeyInputHashes(const ApiContext& ctx, const std::string& tenant, Json& shown) {
  if (shown.is_array()) {
    for (Json& item : shown) KeyInputHashes(ctx, tenant, item);
    return;
  }
  if (!shown.is_object()) return;
  for (auto it = shown.begin(); it != shown.end(); ++it) {
    if ((it.key() == "input_hash" || it.key() == "previous_input_hash") && it->is_string()) {
      const std::string hash = it->get<std::string>();
      *it = hash.empty() ? hash : HmacSha256Hex(ctx.hash_key, tenant + '\n' + hash);
    } else if (it.key() != "input") {  // the input's own fields are the caller's
      KeyInputHashes(ctx, tenant, *it);
    }
  }
}

}  // namespace

void KeyTombstoneHashes(const ApiContext& ctx, const Principal& principal,
                        const std::string& tenant, Json& shown) {
  if (PermissionsOf(ctx.options.permissions, principal.role, tenant)
          .contains(Permission::kSeeRedacted)) {
    return;
  }
  KeyInputHashes(ctx, tenant, shown);
}

void RedactFor(const ApiContext& ctx, const Principal& principal, const InstanceRecord& instance,
               const std::vector<StepRecord>& steps, Json& shown) {
  if (auto definition = HidingDefinition(ctx, principal, instance)) {
    RedactValues(definition->redact, instance, steps, shown);
    KeyInputHashes(ctx, instance.tenant, shown);
  }
}

absl::Status RedactShownInstance(const ApiContext& ctx, const Principal& principal,
                                 const InstanceRecord& instance, Json& shown) {
  auto definition = HidingDefinition(ctx, principal, instance);
  if (!definition) return absl::OkStatus();
  auto steps = ctx.store->GetSteps(instance.id);
  if (!steps.ok()) return steps.status();
  RedactValues(definition->redact, instance, *steps, shown);
  KeyInputHashes(ctx, instance.tenant, shown);
  return absl::OkStatus();
}

}  // namespace waystone
