#include "base/redact.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <vector>

#include "base/mutex.h"

namespace waystone {
namespace {

struct Registry {
  Mutex mu;
  // Replaced whole on every change, so readers copy a pointer, not the list: the
  // configured secrets and the recent credentials (each with its forms), longest first.
  std::shared_ptr<const std::vector<std::string>> values ABSL_GUARDED_BY(mu) =
      std::make_shared<const std::vector<std::string>>();
  std::vector<std::string> configured ABSL_GUARDED_BY(mu);
  // Credentials the process obtained and sent (OAuth2 access tokens), newest last;
  // at most kRecentCredentials of them, so that renewing them for months does not
  // make every redaction slower.
  std::vector<std::vector<std::string>> recent ABSL_GUARDED_BY(mu);
};

constexpr size_t kRecentCredentials = 64;

Registry& Secrets() {
  static Registry* registry = new Registry();
  return *registry;
}

// How JSON encoders write `value` inside a string: minimal escaping, with '/'
// escaped too (PHP), or with every ASCII punctuation as \u00XX (Go's HTML-safe
// escaping, and others).
std::vector<std::string> JsonForms(const std::string& value) {
  auto u = [](unsigned char c, bool upper) {
    const char* hex = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    return std::string("\\u00") + hex[c >> 4] + hex[c & 15];
  };
  std::string minimal;  // " and \ escaped
  std::string slashed;  // and / (PHP)
  std::string html;     // and < > & as \u00XX (Go)
  std::string lower;    // every ASCII punctuation as \u00xx
  std::string upper;    // the same with upper-case hex (.NET)
  for (unsigned char c : value) {
    const std::string plain(1, static_cast<char>(c));
    const bool quote = c == '"' || c == '\\';
    minimal += quote ? "\\" + plain : plain;
    slashed += quote || c == '/' ? "\\" + plain : plain;
    html += quote ? "\\" + plain : (c == '<' || c == '>' || c == '&') ? u(c, false) : plain;
    const bool punctuation = c < 0x80 && !std::isalnum(c);
    lower += punctuation ? u(c, false) : plain;
    upper += punctuation ? u(c, true) : plain;
  }
  return {minimal, slashed, html, lower, upper};
}

}  // namespace

namespace {

std::vector<std::string> FormsOf(const std::string& value) {
  std::vector<std::string> forms = JsonForms(value);
  forms.push_back(value);
  return forms;
}

// Rebuilds the list readers use from the configured and the recent values.
void Publish(Registry& registry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry.mu) {
  auto values = std::make_shared<std::vector<std::string>>(registry.configured);
  for (const auto& forms : registry.recent) {
    for (const std::string& form : forms) {
      if (std::find(values->begin(), values->end(), form) == values->end()) values->push_back(form);
    }
  }
  // Longest first: a secret that contains another is replaced whole.
  std::sort(values->begin(), values->end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  registry.values = std::move(values);
}

}  // namespace

void RegisterSecretValue(const std::string& value) {
  if (value.size() < kMinRedactedSecret) return;
  Registry& registry = Secrets();
  MutexLock lock(registry.mu);
  bool added = false;
  for (const std::string& form : FormsOf(value)) {
    if (std::find(registry.configured.begin(), registry.configured.end(), form) ==
        registry.configured.end()) {
      registry.configured.push_back(form);
      added = true;
    }
  }
  if (added) Publish(registry);
}

void RegisterSentCredential(const std::string& value) {
  if (value.size() < kMinRedactedSecret) return;
  Registry& registry = Secrets();
  MutexLock lock(registry.mu);
  for (const auto& forms : registry.recent) {
    if (forms.back() == value) return;  // known already
  }
  registry.recent.push_back(FormsOf(value));
  if (registry.recent.size() > kRecentCredentials) registry.recent.erase(registry.recent.begin());
  Publish(registry);
}

bool HaveSecrets() {
  Registry& registry = Secrets();
  MutexLock lock(registry.mu);
  return !registry.values->empty();
}

std::string RedactSecrets(std::string_view text) {
  std::shared_ptr<const std::vector<std::string>> values;
  {
    Registry& registry = Secrets();
    MutexLock lock(registry.mu);
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
