#include "engine/redaction.h"

#include "base/redact.h"

namespace waystone {
namespace {

void Redact(std::string& text) {
  if (!text.empty()) text = RedactSecrets(text);
}

}  // namespace

void RedactChange(Change& change) {
  if (change.status_reason) Redact(*change.status_reason);
  for (StepRecord& step : change.steps) {
    Redact(step.error_message);
    Redact(step.response_json);
    Redact(step.external_id);
  }
  for (EventRecord& event : change.events) Redact(event.payload_json);
  for (AlertRecord& alert : change.alerts) Redact(alert.message);
  for (AuditRecord& audit : change.audits) {
    Redact(audit.reason);
    Redact(audit.detail_json);
  }
  for (AttemptRecord& attempt : change.attempts) Redact(attempt.detail);
}

}  // namespace waystone
