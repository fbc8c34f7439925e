#pragma once

// The `targets:` of a definition (or those registered for C++ workflows) applied to
// a request: the target its URL lies under, its TLS identity and OAuth2 client, and
// the question the store answers for every worker before a call to it goes (a
// pause, a circuit breaker, a concurrency cap, a rate limit).

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "connectors/http/http_client.h"
#include "engine/drive/rate_slot.h"
#include "model/definition.h"
#include "model/records.h"
#include "model/template.h"

namespace waystone {

class Random;
class Store;

// How far ahead a target's rate limit hands out slots: a call admitted for a later
// slot waits for it in memory; one further behind asks again later.
inline constexpr Millis kRateHorizon = 1000;

// Returns the target among `targets` whose base URL (rendered with `context`:
// env and secret) `url` lies under (the same prefix, then '/', '?', '#' or the
// end; the longest wins), or null.
absl::StatusOr<const TargetSpec*> TargetOf(const std::vector<TargetSpec>& targets,
                                           const std::string& url, const TemplateScope& context);

// Gives `request` the settings of the target its URL lies under: its TLS identity
// and OAuth2 client (the token endpoint reached with the TLS identity of the target
// its own URL lies under). InvalidArgument naming the target when a setting does
// not render.
absl::Status ApplyTarget(const std::vector<TargetSpec>& targets, HttpRequest& request,
                         const TemplateScope& context);

// Renders every setting of every target in `targets` with `context` (env and
// secret): InvalidArgument naming the first target and setting that does not (an
// environment variable or secret the deployment lacks).
absl::Status CheckTargetsRender(const std::vector<TargetSpec>& targets,
                                const TemplateScope& context);

// A call its target let go, as either runner holds it from the admission to the send:
// the permit (a limited target's: returned once the call is answered, or unused) and
// the rate slot it leaves in (rate_slot.h).
struct AdmittedCall {
  std::optional<TargetCallSettle> permit;
  RateSlot slot;
};

// The answer of `target`'s protections (operator pause, circuit breaker, concurrency
// cap, rate limit: the store decides for every worker on the database) to a call of
// `timeout` from `tenant` by the runner holding `lease`: admitted, or refused and
// when to ask again (RetryRefusedAt) and why.
struct TargetAnswer {
  std::optional<AdmittedCall> admitted;
  Millis retry_at = 0;
  std::string reason;
};
absl::StatusOr<TargetAnswer> AskTarget(Store& store, const std::string& tenant,
                                       const TargetSpec& target, Millis now, Millis lease_duration,
                                       Millis timeout, const Lease& lease, Random& random);

// Returns `permit`, when there is one, with what the call said of its target's health
// (kUntold: the call was not made), and clears it.
void ReturnPermit(Store& store, std::optional<TargetCallSettle>& permit, CallHealth health,
                  Millis now);

}  // namespace waystone
