#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/definition.h"

namespace waystone {

// Definitions larger than this are refused before parsing.
inline constexpr size_t kMaxDefinitionBytes = 1 << 20;

// One problem found in a definition: "file:line: step 'x': message".
enum class Severity : uint8_t {
  kError = 1,    // the definition is refused
  kWarning = 2,  // loaded, but lint reports it
};

struct Diagnostic {
  std::string source;
  int line = 0;
  std::string step;  // empty when the problem is not inside a step
  std::string message;
  Severity severity = Severity::kError;

  std::string ToString() const;
};

// Parses and validates a YAML or JSON definition. Collects every problem it can
// find instead of stopping at the first. Never throws.
std::vector<Diagnostic> LintDefinitionText(std::string_view text, std::string_view source,
                                           WorkflowDefinition* out);

// Returns the definition, or InvalidArgument whose message lists every diagnostic,
// one per line.
absl::StatusOr<WorkflowDefinition> LoadDefinitionText(std::string_view text,
                                                      std::string_view source);

// Parses and validates a document of `targets:` alone (the same form as a
// definition's), for the calls of C++ workflows; InvalidArgument listing every
// problem (source:line) otherwise.
absl::StatusOr<std::vector<TargetSpec>> LoadTargetsText(std::string_view text,
                                                        std::string_view source);

// Reads `path` and loads it; NotFound when it cannot be read.
absl::StatusOr<WorkflowDefinition> LoadDefinitionFile(const std::string& path);

// Reads a file into `out` (used by lint to report each file on its own).
absl::Status ReadFileText(const std::string& path, size_t max_bytes, std::string* out);

}  // namespace waystone
