#include "engine/catalog.h"

#include <algorithm>

#include "base/mutex.h"
#include "definition/loader.h"

namespace waystone {

absl::Status DefinitionCatalog::Register(const WorkflowDefinition& definition, Millis now) {
  auto status = store_->PutDefinition(definition.content_hash, definition.name, definition.source,
                                      definition.text, now);
  if (!status.ok()) return status;
  auto shared = std::make_shared<const WorkflowDefinition>(definition);
  MutexLock lock(mu_);
  by_hash_[definition.content_hash] = shared;
  current_[definition.name] = shared;
  return absl::OkStatus();
}

bool DefinitionCatalog::IsCurrent(const WorkflowDefinition& definition) {
  MutexLock lock(mu_);
  auto it = current_.find(definition.name);
  return it != current_.end() && it->second->content_hash == definition.content_hash;
}

absl::StatusOr<std::shared_ptr<const WorkflowDefinition>> DefinitionCatalog::Get(
    const std::string& hash) {
  {
    MutexLock lock(mu_);
    if (auto it = by_hash_.find(hash); it != by_hash_.end()) return it->second;
  }
  auto text = store_->GetDefinition(hash);
  if (!text.ok()) return text.status();
  absl::StatusOr<WorkflowDefinition> definition;
  if (auto code = ParseCodeWorkflowText(*text)) {
    definition = CodeWorkflowDefinition(*code);
  } else {
    definition = LoadDefinitionText(*text, "definition " + hash.substr(0, 12));
  }
  if (!definition.ok()) {
    return absl::DataLossError("stored definition " + hash.substr(0, 12) +
                               " no longer loads: " + std::string(definition.status().message()));
  }
  auto shared = std::make_shared<const WorkflowDefinition>(std::move(*definition));
  MutexLock lock(mu_);
  by_hash_.emplace(hash, shared);
  return shared;
}

std::map<std::string, TargetSpec> DefinitionCatalog::CurrentTargets(
    const std::vector<std::string>* workflows) {
  MutexLock lock(mu_);
  std::map<std::string, TargetSpec> targets;
  for (const auto& [name, definition] : current_) {
    if (workflows != nullptr &&
        std::find(workflows->begin(), workflows->end(), name) == workflows->end()) {
      continue;
    }
    for (const TargetSpec& target : definition->targets) targets.try_emplace(target.name, target);
  }
  return targets;
}

std::shared_ptr<const WorkflowDefinition> DefinitionCatalog::Current(const std::string& workflow) {
  MutexLock lock(mu_);
  auto it = current_.find(workflow);
  return it == current_.end() ? nullptr : it->second;
}

}  // namespace waystone
