#pragma once

// Rules-internal: the pieces every transition (transitions.cc, the step kinds' files
// call.cc, compensation.cc, sql.cc, transform.cc, wait.cc, and approvals.cc) builds
// its Change with. Pure like the transitions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "rules/transitions.h"

namespace waystone {

// A change at `facts.now`; the runner adds its lease. Whatever happens next, the
// instance no longer waits for a target (its reason from before comes back).
Change At(const Facts& facts);

// Adds the outbox event `type` about the instance (and `step`, when given).
void AddEvent(const Facts& facts, Change& change, std::string_view type, const StepRecord* step,
              std::string_view message = {});

// Raises an alert; alerts are pushed, not only listed: each leaves through the outbox once.
void AddAlert(const Facts& facts, Change& change, AlertKind kind, const std::string& step,
              const std::string& message);

// What a step keeps of an answer, as JSON text, by its `store_response`: the
// pointers its templates read (by default), all, none ("{}"), or a list. Never
// empty: a kept answer also marks "the target said yes".
std::string KeptAnswer(const nlohmann::json& answer, const StepDefinition& step);

// Moves the instance to `state` with its event (and releases it to run now).
void SetInstanceState(const Facts& facts, Change& change, InstanceState state,
                      const std::string& reason);

// --- Answers -------------------------------------------------------------------

// Parses a response body; a body that is not JSON is kept as a JSON string. JSON
// nested deeper than kMaxJsonDepth is refused: what a step keeps is rendered,
// stored and serialized again, and must stay bounded.
absl::StatusOr<nlohmann::json> ParseBody(const std::string& body);

// A value as an id or a `match` compares it: a string as itself, null as "", any
// other value as its JSON text.
std::string IdText(const nlohmann::json& value);

// Returns true when a JSON value is a usable external id (not absent, null or "").
bool HasId(const nlohmann::json* value);

// --- Steps and the instance ------------------------------------------------------

// Schedules the step's next attempt (or lookup) after a backoff.
Change Retry(const Facts& facts, StepRecord step, StepState state, int attempts_made,
             const RetryPolicy& policy, std::optional<Millis> retry_after);

// Marks `step` unknown (`what` happened), keeping when it first became so.
void MarkUnknown(StepRecord& step, const std::string& what, Millis now);

// An audit record of a compensation the engine ran by itself, with its cause.
AuditRecord EngineAudit(const Facts& facts, const StepRecord& step, const std::string& key,
                        const std::string& action, const std::string& detail);

// Whether a failure could follow an effect on the other side: kMaybe after a 2xx
// the step cannot use. Decides whether an optional step may be passed over.
enum class Acted : uint8_t { kNo = 0, kMaybe = 1 };

// Fails `step`; `forced` overrides the instance's next state. FailStep's body.
Change FailStepTo(const Facts& facts, StepRecord step, ErrorClass error_class,
                  const std::string& message, std::optional<AlertKind> alert,
                  std::optional<InstanceState> forced, Acted acted = Acted::kNo);

// A 409 for a resubmission after an unknown outcome: the step stays unknown and an
// operator confirms it (transitions.cc says why).
Change RejectedAfterUnknown(const Facts& facts, StepRecord step, const std::string& detail);

}  // namespace waystone
