#include "engine/context.h"

#include <fstream>

#include "model/keys.h"
#include "model/template.h"

extern char** environ;

namespace waystone {

absl::StatusOr<TemplateEnvironment> TemplateEnvironment::Load(const std::string& secrets_file) {
  TemplateEnvironment result;
  if (!secrets_file.empty()) {
    std::ifstream file(secrets_file);
    if (!file) return absl::NotFoundError("secrets file " + secrets_file + " cannot be read");
    std::string line;
    int number = 0;
    while (std::getline(file, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      const size_t eq = line.find('=');
      if (eq == std::string::npos || eq == 0) {
        return absl::InvalidArgumentError(secrets_file + ":" + std::to_string(number) +
                                          ": expected NAME=value");
      }
      result.secret_[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  constexpr std::string_view kSecretPrefix = "WAYSTONE_SECRET_";
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string name(text.substr(0, eq));
    const std::string value(text.substr(eq + 1));
    if (name.starts_with(kSecretPrefix)) {
      result.secret_[name.substr(kSecretPrefix.size())] = value;
    } else {
      result.env_[name] = value;
    }
  }
  return result;
}

nlohmann::json TemplateEnvironment::Build(const InstanceRecord& instance,
                                          const std::vector<StepRecord>& steps,
                                          const std::string& step_name,
                                          const std::string& idempotency_key) const {
  nlohmann::json context = nlohmann::json::object();
  context["input"] = nlohmann::json::parse(instance.input_json, nullptr, false);
  context["instance"] = {{"key", instance.key},
                         {"ref", InstanceRef(instance.tenant, instance.key)},
                         {"tenant", instance.tenant},
                         {"id", instance.id},
                         {"trace_id", instance.trace_id}};
  nlohmann::json by_name = nlohmann::json::object();
  for (const StepRecord& step : steps) {
    if (step.response_json.empty() && step.external_id.empty()) continue;
    nlohmann::json response = step.response_json.empty()
                                  ? nlohmann::json(nullptr)
                                  : nlohmann::json::parse(step.response_json, nullptr, false);
    if (response.is_discarded()) response = step.response_json;
    by_name[step.name] = {{"response", response}, {"output", response},
                          {"external_id", step.external_id}};
  }
  context["steps"] = std::move(by_name);
  context["env"] = env_;
  context["secret"] = secret_;
  context["step"] = {{"name", step_name}, {"idempotency_key", idempotency_key}};
  return context;
}

nlohmann::json TemplateEnvironment::BuildForKey(const nlohmann::json& input) const {
  return {{"input", input}, {"env", env_}};
}

std::string StepIdempotencyKey(const WorkflowDefinition& definition, const InstanceRecord& instance,
                               const std::vector<StepRecord>& steps, int index,
                               const TemplateEnvironment& environment) {
  const StepRecord& record = steps[index];
  if (!record.idempotency_key.empty()) return record.idempotency_key;
  const StepDefinition& step = definition.steps[index];
  if (step.idempotency_key.empty()) {
    return DefaultIdempotencyKey(instance.tenant, instance.key, step.name);
  }
  // A key template is rendered once and then stored: every retry reuses it.
  auto parsed = Template::Parse(step.idempotency_key);
  if (!parsed.ok()) return "";
  auto text = parsed->RenderText(environment.Build(instance, steps, step.name, ""));
  return text.ok() ? *text : "";
}

}  // namespace waystone
