#include "base/redact.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <mutex>
#include <vector>

namespace waystone {
namespace {

struct Registry {
  std::mutex mu;
  // Replaced whole on every change, so readers copy a pointer, not the list.
  std::shared_ptr<const std::vector<std::string>> values =
      std::make_shared<const std::vector<std::string>>();
};

Registry& Secrets() {
  static Registry* registry = new Registry();
  return *registry;
}

// How JSON encoders write `value` inside a string: minimal escaping, with '/'
// escaped too (PHP), or with every ASCII punctuation as \u00XX (Go's HTML-safe
// escaping, and others).
std::vector<std::string> JsonForms(const std::string& value) {
  std::string minimal;
  std::string slashed;
  std::string unicode;
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : value) {
    const bool quote = c == '"' || c == '\\';
    minimal += quote ? std::string("\\") + static_cast<char>(c) : std::string(1, static_cast<char>(c));
    slashed += quote || c == '/' ? std::string("\\") + static_cast<char>(c)
                                 : std::string(1, static_cast<char>(c));
    if (c < 0x80 && !std::isalnum(c)) {
      unicode += "\\u00";
      unicode.push_back(kHex[c >> 4]);
      unicode.push_back(kHex[c & 15]);
    } else {
      unicode.push_back(static_cast<char>(c));
    }
  }
  return {minimal, slashed, unicode};
}

}  // namespace

void RegisterSecretValue(const std::string& value) {
  if (value.size() < kMinRedactedSecret) return;
  Registry& registry = Secrets();
  std::lock_guard<std::mutex> lock(registry.mu);
  auto values = std::make_shared<std::vector<std::string>>(*registry.values);
  std::vector<std::string> forms = JsonForms(value);
  forms.push_back(value);
  for (const std::string& form : forms) {
    if (std::find(values->begin(), values->end(), form) == values->end()) values->push_back(form);
  }
  // Longest first: a secret that contains another is replaced whole.
  std::sort(values->begin(), values->end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  registry.values = std::move(values);
}

bool HaveSecrets() {
  Registry& registry = Secrets();
  std::lock_guard<std::mutex> lock(registry.mu);
  return !registry.values->empty();
}

std::string RedactSecrets(std::string_view text) {
  std::shared_ptr<const std::vector<std::string>> values;
  {
    Registry& registry = Secrets();
    std::lock_guard<std::mutex> lock(registry.mu);
    values = registry.values;
  }
  std::string out(text);
  for (const std::string& secret : *values) {
    for (size_t at = out.find(secret); at != std::string::npos;
         at = out.find(secret, at + kRedacted.size())) {
      out.replace(at, secret.size(), kRedacted);
    }
  }
  return out;
}

}  // namespace waystone
