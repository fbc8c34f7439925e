#include "model/definition.h"

#include "base/sha256.h"

namespace waystone {

bool RequestSpec::SideEffecting() const {
  return !(method == "GET" || method == "HEAD" || method == "OPTIONS");
}

int WorkflowDefinition::StepIndex(std::string_view step_name) const {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].name == step_name) return static_cast<int>(i);
  }
  return -1;
}

absl::Status CheckTenantScoped(const WorkflowDefinition& definition) {
  for (const StepDefinition& step : definition.steps) {
    if (step.kind != StepKind::kSql) continue;
    for (const auto& [field, spec] :
         {std::pair<std::string, const SqlSpec*>{"sql", &step.sql},
          {"compensate.sql", step.compensate_sql ? &*step.compensate_sql : nullptr}}) {
      if (spec == nullptr || spec->statement.unscoped.empty()) continue;
      return absl::InvalidArgumentError(
          definition.source + ":" + std::to_string(step.line) + ": step '" + step.name +
          "': " + field + ".statement is not scoped to its tenant: " + spec->statement.unscoped +
          " (with tenants: configured, every sql statement is; docs/definition-reference.md#sql)");
    }
  }
  return absl::OkStatus();
}

namespace {
constexpr std::string_view kCodeWorkflowHeader = "# a workflow written as code\ncode-workflow: ";
}  // namespace

WorkflowDefinition CodeWorkflowDefinition(const std::string& name) {
  WorkflowDefinition definition;
  definition.name = name;
  definition.code = true;
  definition.source = "code workflow '" + name + "'";
  definition.text = std::string(kCodeWorkflowHeader) + name + "\n";
  definition.content_hash = Sha256Hex(definition.text);
  return definition;
}

std::optional<std::string> ParseCodeWorkflowText(std::string_view text) {
  if (!text.starts_with(kCodeWorkflowHeader) || !text.ends_with('\n')) return std::nullopt;
  text.remove_prefix(kCodeWorkflowHeader.size());
  text.remove_suffix(1);
  if (text.empty() || text.find('\n') != std::string_view::npos) return std::nullopt;
  return std::string(text);
}

}  // namespace waystone
