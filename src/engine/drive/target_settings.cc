#include "engine/drive/target_settings.h"

#include <algorithm>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "model/template.h"
#include "store/store.h"

namespace waystone {
namespace {

// Renders one of `target`'s settings (a template over env and secret).
absl::StatusOr<std::string> RenderSetting(const TargetSpec& target, const std::string& text,
                                          const TemplateScope& context) {
  WS_ASSIGN_OR_RETURN(Template parsed, Template::Parse(text));
  auto rendered = parsed.RenderText(context);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError("target '" + target.name +
                                      "': " + std::string(rendered.status().message()));
  }
  return rendered;
}

// Returns the TLS identity of `target` (null: none, the system's CAs).
absl::StatusOr<TlsIdentity> TlsOf(const TargetSpec* target, const TemplateScope& context) {
  TlsIdentity identity;
  if (target == nullptr) return identity;
  identity.target = target->name;
  WS_ASSIGN_OR_RETURN(identity.ca_file, RenderSetting(*target, target->ca_file, context));
  WS_ASSIGN_OR_RETURN(identity.cert_file, RenderSetting(*target, target->cert_file, context));
  WS_ASSIGN_OR_RETURN(identity.key_file, RenderSetting(*target, target->key_file, context));
  WS_ASSIGN_OR_RETURN(identity.key_password, RenderSetting(*target, target->key_password, context));
  return identity;
}

}  // namespace

absl::StatusOr<const TargetSpec*> TargetOf(const std::vector<TargetSpec>& targets,
                                           const std::string& url, const TemplateScope& context) {
  const TargetSpec* found = nullptr;
  size_t matched = 0;
  for (const TargetSpec& target : targets) {
    WS_ASSIGN_OR_RETURN(std::string base, RenderSetting(target, target.url, context));
    while (base.ends_with("/")) base.pop_back();
    const bool under = !base.empty() && url.starts_with(base) &&
                       (url.size() == base.size() ||
                        std::string_view("/?#").find(url[base.size()]) != std::string::npos);
    if (!under || base.size() <= matched) continue;
    matched = base.size();
    found = &target;
  }
  return found;
}

absl::Status ApplyTarget(const std::vector<TargetSpec>& targets, HttpRequest& request,
                         const TemplateScope& context) {
  WS_ASSIGN_OR_RETURN(const TargetSpec* target, TargetOf(targets, request.url, context));
  request.tls = Boxed<TlsIdentity>();  // none outside a target: no allocation
  request.oauth2 = Boxed<OAuth2Client>();
  if (target == nullptr) return absl::OkStatus();
  WS_ASSIGN_OR_RETURN(request.tls, TlsOf(target, context));
  if (target->token_url.empty()) return absl::OkStatus();
  OAuth2Client& client = request.oauth2.Mutable();
  client.target = target->name;
  WS_ASSIGN_OR_RETURN(client.token_url, RenderSetting(*target, target->token_url, context));
  WS_ASSIGN_OR_RETURN(client.client_id, RenderSetting(*target, target->client_id, context));
  WS_ASSIGN_OR_RETURN(client.client_secret, RenderSetting(*target, target->client_secret, context));
  WS_ASSIGN_OR_RETURN(client.scope, RenderSetting(*target, target->scope, context));
  if (client.client_secret.empty()) {
    return absl::InvalidArgumentError("target '" + target->name +
                                      "': oauth2.client_secret rendered empty");
  }
  WS_ASSIGN_OR_RETURN(const TargetSpec* issuer, TargetOf(targets, client.token_url, context));
  WS_ASSIGN_OR_RETURN(client.tls, TlsOf(issuer, context));
  return absl::OkStatus();
}

absl::Status CheckTargetsRender(const std::vector<TargetSpec>& targets,
                                const TemplateScope& context) {
  for (const TargetSpec& target : targets) {
    WS_ASSIGN_OR_RETURN(std::string base, RenderSetting(target, target.url, context));
    HttpRequest request;
    request.url = base;
    WS_RETURN_IF_ERROR(ApplyTarget(targets, request, context));
  }
  return absl::OkStatus();
}

namespace {

// The store's question before a call of `timeout` to `target` from `tenant`, by the
// runner holding `lease`: the permit (named after the lease, and unique) outlives
// the call — its rate slot's wait, its timeout (a token request and one resend may
// add as much again) and a margin.
TargetCallAsk MakeTargetCallAsk(const std::string& tenant, const TargetSpec& target, Millis now,
                                Millis lease_duration, Millis timeout, const Lease& lease,
                                Random& random) {
  TargetCallAsk ask;
  ask.tenant = tenant;
  ask.target = target.name;
  ask.limits = target.limits;
  ask.now = now;
  ask.horizon = std::min<Millis>(kRateHorizon, lease_duration / 4);
  ask.call_lease =
      std::max<Millis>(lease_duration, ask.horizon + 2 * std::max<Millis>(timeout, 0) + 5000);
  ask.permit = lease.owner + "/" + std::to_string(lease.instance_id) + "/" + random.Hex(6);
  return ask;
}

// When a call its target refused asks again: the admission's retry_at, spread by up
// to 250 ms so that those refused together do not all ask again at once.
Millis RetryRefusedAt(const Admission& refused, Millis now, Random& random) {
  const Millis spread = std::clamp<Millis>(refused.retry_at - now, 1, 250);
  return refused.retry_at + random.UniformInclusive(spread);
}

// Returns an admitted call's permit (its health into the circuit). A failure is
// logged: the permit expires by itself, and the circuit misses one outcome.
void SettleTargetPermit(Store& store, const TargetCallSettle& settle) {
  absl::Status settled = store.SettleTargetCall(settle);
  if (!settled.ok()) {
    Log(LogLevel::kWarning, "target '" + settle.target + "': " + settled.ToString());
  }
}

}  // namespace

absl::StatusOr<TargetAnswer> AskTarget(Store& store, const std::string& tenant,
                                       const TargetSpec& target, Millis now, Millis lease_duration,
                                       Millis timeout, const Lease& lease, Random& random) {
  TargetCallAsk ask =
      MakeTargetCallAsk(tenant, target, now, lease_duration, timeout, lease, random);
  WS_ASSIGN_OR_RETURN(Admission admission, store.AdmitTargetCall(ask));
  TargetAnswer answer;
  if (!admission.admitted) {
    answer.retry_at = RetryRefusedAt(admission, now, random);
    answer.reason = std::move(admission.reason);
    return answer;
  }
  AdmittedCall& call = answer.admitted.emplace();
  if (target.limits.Any()) {
    call.permit = TargetCallSettle{tenant,
                                   target.name,
                                   target.limits,
                                   std::move(ask.permit),
                                   admission.probe,
                                   CallHealth::kUntold,
                                   0};
  }
  call.slot = RateSlot{admission.send_at, tenant, target.name, target.limits};
  return answer;
}

void ReturnPermit(Store& store, std::optional<TargetCallSettle>& permit, CallHealth health,
                  Millis now) {
  if (!permit) return;
  permit->health = health;
  permit->now = now;
  SettleTargetPermit(store, *permit);
  permit.reset();
}

}  // namespace waystone
