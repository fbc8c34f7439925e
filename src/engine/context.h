#pragma once

// Engine-internal: includes nlohmann/json. Not for widely included headers.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "base/public_id.h"
#include "engine/tenant_policy.h"
#include "model/definition.h"
#include "model/template.h"
#include "store/store.h"

namespace waystone {

// Values templates may read besides the instance itself: `env` (the process
// environment) and `secret` (WAYSTONE_SECRET_<NAME> variables and a secrets file).
// With tenant policies, each tenant reads its own secrets only, and its `env`
// over the process's. Secrets are only ever placed into requests; every value is
// registered for RedactSecrets, so an echo of one is never stored or logged.
// Immutable after Load; thread-safe to share.
class TemplateEnvironment {
 public:
  // Reads the environment, then `secrets_file` (lines NAME=value, '#' comments)
  // when not empty. Variables WAYSTONE_SECRET_NAME win over the file. With
  // `tenants`, reads each tenant's secrets file too.
  static absl::StatusOr<TemplateEnvironment> Load(
      const std::string& secrets_file, const std::map<std::string, TenantPolicy>& tenants = {});

  // Returns a context with input, instance, steps (completed results), env, secret.
  nlohmann::json Build(const InstanceRecord& instance, const std::vector<StepRecord>& steps,
                       const std::string& step_name, const std::string& idempotency_key) const;

  // Build in two parts: what stays the same for the instance (input, instance, env,
  // secret, all copied in), and then what each step sees (steps, step). A caller that
  // renders many steps of one instance uses InstanceContext instead.
  nlohmann::json BuildInstancePart(const InstanceRecord& instance) const;
  void AddStepPart(nlohmann::json& context, const InstanceRecord& instance,
                   const std::vector<StepRecord>& steps, const std::string& step_name,
                   const std::string& idempotency_key) const;

  // The instance's part without env and secret (input, instance): `Scope` adds
  // those without copying them, where BuildInstancePart copies them in.
  nlohmann::json BuildOwnPart(const InstanceRecord& instance) const;
  // What templates of `tenant` read: `own`'s members, and the tenant's env and
  // secret, shared (valid while `own` and this environment live).
  TemplateScope Scope(const nlohmann::json& own, const std::string& tenant) const;

  // What the business key template reads: `input` and the tenant's env only
  // (valid while `input` and this environment live).
  TemplateScope ForKey(const nlohmann::json& input, const std::string& tenant) const;

  // The `env` a tenant's templates read.
  const nlohmann::json& env(const std::string& tenant) const;

  // What {{instance.id}} renders: the public id, never the database's sequence.
  void set_public_ids(PublicIds ids) { public_ids_ = std::move(ids); }

 private:
  const nlohmann::json& secret(const std::string& tenant) const;

  nlohmann::json env_ = nlohmann::json::object();
  nlohmann::json secret_ = nlohmann::json::object();
  bool per_tenant_ = false;
  std::optional<PublicIds> public_ids_;
  std::map<std::string, nlohmann::json> tenant_env_;
  std::map<std::string, nlohmann::json> tenant_secret_;
};

// One instance's template context, kept by a runner across the steps it renders:
// the instance's part (input, instance) is built once, env and secret are the
// environment's own (never copied), and a step's recorded result is parsed again
// only when its record changed. What For returns reads what TemplateEnvironment::Build
// would hold, and stays valid until the next call. Not thread-safe: one runner's.
class InstanceContext {
 public:
  explicit InstanceContext(const TemplateEnvironment* environment) : environment_(environment) {}

  // Forgets everything: the instance was read again.
  void Reset();

  TemplateScope For(const InstanceRecord& instance, const std::vector<StepRecord>& steps,
                    const std::string& step_name, const std::string& idempotency_key);

 private:
  const TemplateEnvironment* environment_;
  std::optional<nlohmann::json> context_;
  // Per step index, the (response_json, external_id) context_["steps"] shows.
  std::vector<std::pair<std::string, std::string>> shown_;
};

// Returns the idempotency key of step `index`: the one stored on its first attempt,
// else its key template rendered now, else "<tenant>:<instance key>:<step>". Empty when the
// template does not render.
std::string StepIdempotencyKey(const WorkflowDefinition& definition, const InstanceRecord& instance,
                               const std::vector<StepRecord>& steps, int index,
                               const TemplateEnvironment& environment);

// Returns how long step idempotency keys of `definition` are kept: its own
// `retention.step_keys` when set, else `fallback` (the engine's).
Millis StepKeyRetention(const WorkflowDefinition& definition, Millis fallback);

// Returns the deliveries `change` makes owed (Change::reservations): when it completes
// a step of `steps` (as last committed) that notification channels report, their
// delivery identities, each reserved for its channel step for `retention` (or the
// definition's step key retention). One delivery row per identity is so created in
// the same transaction as the business step it reports. An identity that cannot be
// rendered yet (it reads a step after the reported one) is left to its channel's
// claim when it sends.
std::vector<IdempotencyClaim> OwedDeliveries(const WorkflowDefinition& definition,
                                             const InstanceRecord& instance,
                                             const std::vector<StepRecord>& steps,
                                             const Change& change,
                                             const TemplateEnvironment& environment,
                                             Millis retention);

}  // namespace waystone
