#pragma once

// Engine-internal: includes nlohmann/json. The rules of an `approval` step, as pure
// transitions like those of transitions.h (tests/rules/approval_rules_test.cc is
// their table).
//
// An approval step asks people to approve the instance's material data. Its
// checkpoint holds the open request: `attempts` is the request's number,
// `request_hash` its data version (the SHA-256 of the material fields), and the
// response the request as the approver saw it:
//   {"request": 2, "data_version": "…", "requested_at": …,
//    "snapshot": {"fields": {"/amount": 120}, "summary": "…", "requester": "bob"},
//    "decision": {"outcome": "approve", "by": "alice", "at": …, "comment": "…"}}
// A decision that arrives before the request opens is kept on the pending step
// ("early_decision") for this instance's request about that same data version only
// (the view shows it; no other instance or request takes it). Every decision, taken
// or refused, is in the audit log with its actor.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/template.h"
#include "rules/transitions.h"

namespace waystone {

// What an approver is shown: the material fields of the input (by pointer; null
// where absent), the rendered summary and requester, and their data version.
struct ApprovalSnapshot {
  nlohmann::json fields = nlohmann::json::object();
  std::string summary;
  std::string requester;
  std::string data_version;

  nlohmann::json ToJson() const;
};

// The material fields of `input_json` and their data version (no templates).
ApprovalSnapshot MaterialOf(const ApprovalSpec& spec, const std::string& input_json);

// The snapshot of the request about to open: MaterialOf, and the summary and
// requester rendered over `context` (TemplateEnvironment::Build); an error names
// the field that did not render.
absl::StatusOr<ApprovalSnapshot> RenderApproval(const ApprovalSpec& spec,
                                                const std::string& input_json,
                                                const TemplateScope& context);

// A decision as it arrives, with who decides.
struct Decision {
  std::string step;
  int request = 0;  // the request quoted; 0: the one about `data_version` (open or not yet)
  std::string data_version;  // the data version quoted (required)
  bool approve = false;
  std::string comment;
  std::string actor;                // a token's name
  std::string role;                 // the token's role: viewer, operator or admin
  std::vector<std::string> groups;  // the token's groups in the instance's tenant
  // Sent as a CloudEvent: (source, id) is claimed in the inbox with its effect, so a
  // redelivery has none.
  std::optional<InboxClaim> inbox;
};

// What a decision did. A refused one (`refusal` not OK: PermissionDenied when the
// actor may not decide, FailedPrecondition when the request is decided, superseded
// or closed, or about other data) still commits `change`: its audit record, and an
// alert when it contradicts the decision that stood. `replayed`: the very decision
// that stands, sent again by its actor: OK, nothing to commit.
struct DecisionOutcome {
  Change change;
  absl::Status refusal;
  bool replayed = false;
};

// The approval step `index` is due: its request opens on `snapshot` (rendered now,
// or why it could not be) and the step waits for a decision; a decision kept for
// this data version before the request opened decides it at once; one kept for
// other data is dropped (audited).
Change OpenApproval(const Facts& facts, int index,
                    const absl::StatusOr<ApprovalSnapshot>& snapshot);

// The open request of approval step `index` reached a deadline (its next attempt
// time): a reminder (event approval.reminder), an escalation (its group may decide
// too; audited), or the timeout, decided by waystone as `on_timeout` says. The
// step's next attempt time becomes the next deadline.
Change ApprovalDue(const Facts& facts, int index);

// A decision for the approval step `index`; `current` is the snapshot rendered now
// (the request a decision before the request opens is about). `open_alerts`: the
// instance's alerts not yet resolved; a late decision that contradicts the one that
// stood raises an alert only while none of that kind is open for the step (each is
// audited: a stream of late decisions is one thing for an operator to act on).
DecisionOutcome DecisionArrived(const Facts& facts, int index, const Decision& decision,
                                const ApprovalSnapshot& current,
                                const std::vector<AlertRecord>& open_alerts = {});

// A revision of the instance's input, with who made it and why.
struct Revision {
  std::string input_json;  // the new input: a JSON object
  std::string actor;
  std::string reason;
  std::optional<InboxClaim> inbox;  // sent as a CloudEvent (as Decision::inbox)
};

struct RevisionOutcome {
  Change change;
  bool unchanged = false;              // the input is the same already: nothing to do
  std::vector<std::string> material;   // approval steps whose data version changed
  std::vector<std::string> cancelled;  // ... whose open request was cancelled
  std::vector<std::string> reopened;   // ... rejected, waiting for an operator: asked again
  std::vector<std::string> reruns;     // completed steps run again (revision.reruns)
  std::string input_hash;              // of the new input (canonical JSON)
};

// A revision (`revision.input_json` becomes the input): an open approval whose
// material fields changed is cancelled (reason, actor, superseded_by: the next
// request) and asked again on the new data; a rejected one an operator waits on is
// asked again; one whose fields did not change stands (the revision only notifies);
// the completed steps of `revision.reruns` run again; nothing else is redone.
// FailedPrecondition (nothing changes) when the instance is finished or compensating,
// or a decided approval's material fields would change under its decision.
absl::StatusOr<RevisionOutcome> Revise(const Facts& facts, const Revision& revision);

}  // namespace waystone
