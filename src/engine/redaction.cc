#include "engine/redaction.h"

#include "base/redact.h"
#include "model/json_text.h"

namespace waystone {
namespace {

void Redact(std::string& text) {
  if (!text.empty()) text = RedactSecrets(text);
}

// JSON stays JSON: only its strings change.
void RedactJson(std::string& text) {
  if (!text.empty()) text = RedactJsonText(text);
}

}  // namespace

void RedactChange(Change& change) {
  if (!HaveSecrets()) return;
  if (change.status_reason) Redact(*change.status_reason);
  for (StepRecord& step : change.steps) {
    Redact(step.error_message);
    RedactJson(step.response_json);
    Redact(step.external_id);
  }
  if (change.keep) RedactJson(change.keep->data_json);
  for (EventRecord& event : change.events) RedactJson(event.payload_json);
  for (AlertRecord& alert : change.alerts) Redact(alert.message);
  for (AuditRecord& audit : change.audits) {
    Redact(audit.reason);
    RedactJson(audit.detail_json);
  }
  for (AttemptRecord& attempt : change.attempts) Redact(attempt.detail);
}

std::string Redacted(const std::string& text) {
  if (!HaveSecrets() || text.empty()) return text;
  return RedactSecrets(text);
}

}  // namespace waystone
