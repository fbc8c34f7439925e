#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "model/definition.h"
#include "store/store.h"

namespace waystone {

// DefinitionCatalog hands the engine the exact definition an instance is pinned
// to, by content hash: registered ones from memory, others parsed from the text
// the store kept. Thread-safe.
class DefinitionCatalog {
 public:
  explicit DefinitionCatalog(DefinitionStore* store) : store_(store) {}
  DefinitionCatalog(const DefinitionCatalog&) = delete;
  DefinitionCatalog& operator=(const DefinitionCatalog&) = delete;

  // Stores the definition's text under its hash and makes it the current version
  // of its workflow name.
  absl::Status Register(const WorkflowDefinition& definition, Millis now);

  // Returns the definition with `hash`. Shared between the catalog's cache and
  // the runners that use it; immutable.
  absl::StatusOr<std::shared_ptr<const WorkflowDefinition>> Get(const std::string& hash);

  // Whether `definition` is stored and the current version of its workflow name
  // (then Register would change nothing).
  bool IsCurrent(const WorkflowDefinition& definition);

  // Returns the current registered version of `workflow`, or nullptr.
  std::shared_ptr<const WorkflowDefinition> Current(const std::string& workflow);

  // The targets the current versions declare, by name (where several workflows
  // declare one name, the first by workflow name); when `workflows` is not null, only
  // those of the workflows it names.
  std::map<std::string, TargetSpec> CurrentTargets(
      const std::vector<std::string>* workflows = nullptr);

 private:
  DefinitionStore* store_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<const WorkflowDefinition>> by_hash_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const WorkflowDefinition>> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace waystone
