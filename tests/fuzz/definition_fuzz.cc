// libFuzzer target: the definition loader and validator, then the recovery plan.
// No input may crash or hang it, and every refusal names what is wrong.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "definition/loader.h"
#include "definition/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  waystone::WorkflowDefinition definition;
  const auto diagnostics = waystone::LintDefinitionText(text, "fuzz.yaml", &definition);
  bool refused = false;
  for (const auto& d : diagnostics) {
    if (d.message.empty() || d.source != "fuzz.yaml") std::abort();  // an unclear refusal
    refused = refused || d.severity == waystone::Severity::kError;
  }
  if (!refused) (void)waystone::RenderPlan(definition);
  return 0;
}
