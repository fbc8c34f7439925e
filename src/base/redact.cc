#include "base/redact.h"

#include <algorithm>
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

std::string JsonEscaped(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

void RegisterSecretValue(const std::string& value) {
  if (value.size() < kMinRedactedSecret) return;
  Registry& registry = Secrets();
  std::lock_guard<std::mutex> lock(registry.mu);
  auto values = std::make_shared<std::vector<std::string>>(*registry.values);
  for (const std::string& form : {value, JsonEscaped(value)}) {
    if (std::find(values->begin(), values->end(), form) == values->end()) values->push_back(form);
  }
  // Longest first: a secret that contains another is replaced whole.
  std::sort(values->begin(), values->end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  registry.values = std::move(values);
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
