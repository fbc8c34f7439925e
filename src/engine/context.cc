#include "engine/context.h"

#include <algorithm>
#include <fstream>

#include "base/log.h"
#include "base/redact.h"
#include "model/json_text.h"
#include "model/keys.h"
#include "model/template.h"

extern char** environ;

namespace waystone {

namespace {

// Reads NAME=value lines ('#' comments, blank lines) into `out`.
absl::Status ReadSecretsFile(const std::string& path, nlohmann::json* out) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError("secrets file " + path + " cannot be read");
  std::string line;
  int number = 0;
  while (std::getline(file, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(path + ":" + std::to_string(number) +
                                        ": expected NAME=value");
    }
    const std::string value = line.substr(eq + 1);
    if (!value.empty() && value.size() < kMinRedactedSecret) {
      return absl::InvalidArgumentError(path + ":" + std::to_string(number) + ": secret '" +
                                        line.substr(0, eq) + "' is shorter than " +
                                        std::to_string(kMinRedactedSecret) +
                                        " characters; it could not be told apart when echoed");
    }
    (*out)[line.substr(0, eq)] = value;
  }
  return absl::OkStatus();
}

// Every form a secret travels in: as is (headers, bodies), percent-encoded (URLs).
void RegisterAll(const nlohmann::json& secrets) {
  for (auto it = secrets.begin(); it != secrets.end(); ++it) {
    if (!it.value().is_string()) continue;
    const std::string value = it.value().get<std::string>();
    RegisterSecretValue(value);
    RegisterSecretValue(PercentEncode(value));
  }
}

}  // namespace

absl::StatusOr<TemplateEnvironment> TemplateEnvironment::Load(
    const std::string& secrets_file, const std::map<std::string, TenantPolicy>& tenants) {
  TemplateEnvironment result;
  if (!secrets_file.empty()) {
    if (auto read = ReadSecretsFile(secrets_file, &result.secret_); !read.ok()) return read;
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
  for (auto it = result.secret_.begin(); it != result.secret_.end(); ++it) {
    const std::string value = it.value().get<std::string>();
    if (!value.empty() && value.size() < kMinRedactedSecret) {
      Log(LogLevel::kWarning, "secret '" + it.key() + "' is shorter than " +
                                  std::to_string(kMinRedactedSecret) +
                                  " characters: an echo of it cannot be told apart and redacted");
    }
  }
  RegisterAll(result.secret_);
  result.per_tenant_ = !tenants.empty();
  for (const auto& [tenant, policy] : tenants) {
    nlohmann::json secrets = nlohmann::json::object();
    if (!policy.secrets_file.empty()) {
      if (auto read = ReadSecretsFile(policy.secrets_file, &secrets); !read.ok()) return read;
    }
    RegisterAll(secrets);
    result.tenant_secret_[tenant] = std::move(secrets);
    nlohmann::json env = result.env_;
    for (const auto& [name, value] : policy.env) env[name] = value;
    result.tenant_env_[tenant] = std::move(env);
  }
  return result;
}

const nlohmann::json& TemplateEnvironment::env(const std::string& tenant) const {
  if (!per_tenant_) return env_;
  auto found = tenant_env_.find(tenant);
  return found != tenant_env_.end() ? found->second : env_;
}

const nlohmann::json& TemplateEnvironment::secret(const std::string& tenant) const {
  static const nlohmann::json kNone = nlohmann::json::object();
  if (!per_tenant_) return secret_;
  auto found = tenant_secret_.find(tenant);
  return found != tenant_secret_.end() ? found->second : kNone;
}

namespace {

// Whether a step's record has anything for templates to read.
bool ShowsResult(const StepRecord& step) {
  return !step.response_json.empty() || !step.external_id.empty();
}

// What {{steps.NAME}} holds: the recorded result (parsed when it is JSON) and
// the external id.
nlohmann::json StepEntry(const StepRecord& step) {
  nlohmann::json response = step.response_json.empty()
                                ? nlohmann::json(nullptr)
                                : nlohmann::json::parse(step.response_json, nullptr, false);
  if (response.is_discarded()) response = step.response_json;
  return {{"response", response}, {"output", response}, {"external_id", step.external_id}};
}

// What {{step}} holds: the step rendered for and its key.
nlohmann::json StepSelf(const InstanceRecord& instance, const std::string& step_name,
                        const std::string& idempotency_key) {
  return {{"name", step_name},
          {"idempotency_key", idempotency_key},
          {"key_uuid", KeyUuid(instance.tenant, idempotency_key)}};
}

}  // namespace

nlohmann::json TemplateEnvironment::Build(const InstanceRecord& instance,
                                          const std::vector<StepRecord>& steps,
                                          const std::string& step_name,
                                          const std::string& idempotency_key) const {
  nlohmann::json context = BuildInstancePart(instance);
  AddStepPart(context, instance, steps, step_name, idempotency_key);
  return context;
}

nlohmann::json TemplateEnvironment::BuildInstancePart(const InstanceRecord& instance) const {
  nlohmann::json context = BuildOwnPart(instance);
  context["env"] = env(instance.tenant);
  context["secret"] = secret(instance.tenant);
  return context;
}

nlohmann::json TemplateEnvironment::BuildOwnPart(const InstanceRecord& instance) const {
  nlohmann::json context = nlohmann::json::object();
  context["input"] = nlohmann::json::parse(instance.input_json, nullptr, false);
  context["instance"] = {{"key", instance.key},
                         {"ref", InstanceRef(instance.tenant, instance.key)},
                         {"tenant", instance.tenant},
                         {"id", public_ids_ ? public_ids_->Encode(instance.id) : std::string()},
                         {"trace_id", instance.trace_id}};
  return context;
}

TemplateScope TemplateEnvironment::Scope(const nlohmann::json& own,
                                         const std::string& tenant) const {
  return TemplateScope(own, "env", &env(tenant), "secret", &secret(tenant));
}

void TemplateEnvironment::AddStepPart(nlohmann::json& context, const InstanceRecord& instance,
                                      const std::vector<StepRecord>& steps,
                                      const std::string& step_name,
                                      const std::string& idempotency_key) const {
  nlohmann::json by_name = nlohmann::json::object();
  for (const StepRecord& step : steps) {
    if (!ShowsResult(step)) continue;
    by_name[step.name] = StepEntry(step);
  }
  context["steps"] = std::move(by_name);
  context["step"] = StepSelf(instance, step_name, idempotency_key);
}

void InstanceContext::Reset() {
  context_.reset();
  shown_.clear();
}

TemplateScope InstanceContext::For(const InstanceRecord& instance,
                                   const std::vector<StepRecord>& steps,
                                   const std::string& step_name,
                                   const std::string& idempotency_key) {
  if (!context_) context_ = environment_->BuildOwnPart(instance);
  nlohmann::json& by_name = (*context_)["steps"];
  if (!by_name.is_object() || shown_.size() != steps.size()) {
    by_name = nlohmann::json::object();
    shown_.assign(steps.size(), {});
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& step = steps[i];
    auto& [response, external_id] = shown_[i];
    if (response == step.response_json && external_id == step.external_id) continue;
    response = step.response_json;
    external_id = step.external_id;
    if (ShowsResult(step)) {
      by_name[step.name] = StepEntry(step);
    } else {
      by_name.erase(step.name);
    }
  }
  (*context_)["step"] = StepSelf(instance, step_name, idempotency_key);
  return environment_->Scope(*context_, instance.tenant);
}

TemplateScope TemplateEnvironment::ForKey(const nlohmann::json& input,
                                          const std::string& tenant) const {
  static const nlohmann::json kNothingElse = nlohmann::json::object();
  return TemplateScope(kNothingElse, "input", &input, "env", &env(tenant));
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

Millis StepKeyRetention(const WorkflowDefinition& definition, Millis fallback) {
  return definition.step_key_retention > 0 ? definition.step_key_retention : fallback;
}

std::vector<IdempotencyClaim> OwedDeliveries(const WorkflowDefinition& definition,
                                             const InstanceRecord& instance,
                                             const std::vector<StepRecord>& steps,
                                             const Change& change,
                                             const TemplateEnvironment& environment,
                                             Millis retention) {
  std::vector<IdempotencyClaim> owed;
  if (definition.code) return owed;  // a code workflow has no notification channels
  std::vector<StepRecord> after;     // the steps as `change` leaves them, when needed
  for (const StepRecord& done : change.steps) {
    if (done.state != StepState::kCompleted || steps[done.index].state == StepState::kCompleted) {
      continue;
    }
    const std::string& reported = definition.steps[done.index].name;
    for (size_t j = 0; j < definition.steps.size(); ++j) {
      const StepDefinition& channel = definition.steps[j];
      if (channel.notify.empty() || channel.reports != reported) continue;
      if (after.empty()) {
        after = steps;
        for (const StepRecord& s : change.steps) after[s.index] = s;
      }
      std::string key =
          StepIdempotencyKey(definition, instance, after, static_cast<int>(j), environment);
      if (key.empty()) continue;
      IdempotencyClaim claim{
          instance.tenant, std::move(key), "",
          instance.id,     channel.name,   change.now + StepKeyRetention(definition, retention)};
      claim.exclusive = true;
      owed.push_back(std::move(claim));
    }
  }
  return owed;
}

}  // namespace waystone
