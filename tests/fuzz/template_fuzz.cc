// libFuzzer target: the template renderer. The input is a template, a newline and
// a JSON context; every way of rendering it must end in text or a clear error.

#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "model/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\n');
  const std::string text = input.substr(0, split);
  nlohmann::json context = {{"input", {{"id", "A&B #7"}, {"n", 3}, {"list", {1, "x"}}}},
                            {"env", {{"URL", "http://erp:81/api"}}},
                            {"instance", {{"key", "crm:1"}, {"ref", "t:crm:1"}}}};
  if (split != std::string::npos) {
    nlohmann::json parsed = nlohmann::json::parse(input.substr(split + 1), nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) context.update(parsed);
  }
  auto parsed = waystone::Template::Parse(text);
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) std::abort();
    return 0;
  }
  for (const auto& status : {parsed->Render(context).status(), parsed->RenderText(context).status(),
                             parsed->RenderUrl(context).status(), parsed->CheckUrl()}) {
    if (!status.ok() && status.message().empty()) std::abort();
  }
  // A URL value never carries a raw delimiter into its part.
  auto url = parsed->RenderUrl(context);
  if (url.ok() && text.rfind("{{", 0) != 0 && url->find_first_of("\r\n") != std::string::npos &&
      text.find_first_of("\r\n") == std::string::npos) {
    std::abort();
  }
  return 0;
}
