#include "rules/approvals.h"

#include <algorithm>
#include <tuple>

#include "base/sha256.h"
#include "model/duration.h"
#include "model/json_text.h"
#include "model/template.h"
#include "rules/transition_parts.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// viewer < operator < admin; anything else ranks below them all.
int RoleRank(const std::string& role) {
  if (role == "admin") return 3;
  if (role == "operator") return 2;
  if (role == "viewer") return 1;
  return 0;
}

// The step's approval record (its response), or an empty object.
Json RecordOf(const StepRecord& step) {
  Json record = Json::parse(step.response_json.empty() ? "{}" : step.response_json, nullptr, false);
  return record.is_object() ? record : Json::object();
}

std::string Outcome(bool approve) { return approve ? "approve" : "reject"; }

// `object[field]` as text, or `fallback` when `object` is no object or the field no
// string: stored records are ours, but nothing read from a row may throw.
std::string TextAt(const Json& object, const char* field, const std::string& fallback = "") {
  if (!object.is_object()) return fallback;
  const auto it = object.find(field);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// `object[field]`, or an empty object.
Json ObjectAt(const Json& object, const char* field) {
  if (!object.is_object()) return Json::object();
  const auto it = object.find(field);
  return it != object.end() && it->is_object() ? *it : Json::object();
}

// The actors who changed the material data of the step's request, in `record`'s
// "revised_by" (a list; a single name in records written before it was one).
std::vector<std::string> RevisersIn(const Json& record) {
  std::vector<std::string> out;
  const auto it = record.find("revised_by");
  if (it == record.end()) return out;
  if (it->is_string()) out.push_back(it->get<std::string>());
  if (it->is_array()) {
    for (const Json& name : *it) {
      if (name.is_string()) out.push_back(name.get<std::string>());
    }
  }
  return out;
}

void AddReviser(Json& record, const std::string& actor) {
  std::vector<std::string> names = RevisersIn(record);
  if (actor.empty() || std::find(names.begin(), names.end(), actor) != names.end()) return;
  names.push_back(actor);
  record["revised_by"] = names;
}

// Why `actor` may not decide the request: it started the instance, is the request's
// requester, or changed its material data (at any time before the decision). Empty:
// none of these. The four-eyes rule holds whether or not the definition names a
// requester.
std::string OwnInterest(const Facts& facts, const std::string& requester, const Json& record,
                        const std::string& actor) {
  if (!facts.instance.started_by.empty() && actor == facts.instance.started_by) {
    return "started this instance";
  }
  if (!requester.empty() && actor == requester) return "requested the approval";
  const std::vector<std::string> revisers = RevisersIn(record);
  if (std::find(revisers.begin(), revisers.end(), actor) != revisers.end()) {
    return "revised the data it is about";
  }
  return "";
}

std::string Describe(const Json& decision) {
  return TextAt(decision, "outcome", "?") + " by " + TextAt(decision, "by", "?");
}

std::string Short(const std::string& version) { return version.substr(0, 16); }

Millis NumberAt(const Json& record, const char* field) {
  const auto it = record.find(field);
  return it != record.end() && it->is_number_integer() ? it->get<Millis>() : 0;
}

// The open request's next deadline (reminder, escalation, timeout) not yet passed
// in `record`; 0 when none is left.
Millis NextDeadline(const ApprovalSpec& spec, const Json& record) {
  const Millis requested = NumberAt(record, "requested_at");
  Millis next = 0;
  auto consider = [&](Millis after, const char* done) {
    if (after <= 0 || NumberAt(record, done) != 0) return;
    const Millis at = requested + after;
    if (next == 0 || at < next) next = at;
  };
  consider(spec.remind_after, "reminded_at");
  consider(spec.escalate_after, "escalated_at");
  consider(spec.timeout, "timed_out_at");
  return next;
}

// Adds the approval record to the payload of the change's last event, so whoever
// reads the event (an approval inbox, a notifier) has what the approver sees.
void AttachToLastEvent(Change& change, const Json& record) {
  if (change.events.empty()) return;
  Json payload = Json::parse(change.events.back().payload_json, nullptr, false);
  if (!payload.is_object()) return;
  payload["approval"] = record;
  change.events.back().payload_json = JsonText(payload);
}

Json DetailOf(const StepRecord& step, const Decision& decision) {
  Json detail = {{"step", step.name},
                 {"request", decision.request},
                 {"data_version", decision.data_version},
                 {"decision", Outcome(decision.approve)}};
  if (!decision.comment.empty()) detail["comment"] = decision.comment;
  if (decision.inbox) {  // the authenticated event that carried it
    detail["event"] = {{"source", decision.inbox->source}, {"id", decision.inbox->id}};
  }
  return detail;
}

bool InGroup(const Decision& decision, const std::string& group) {
  return !group.empty() &&
         std::find(decision.groups.begin(), decision.groups.end(), group) != decision.groups.end();
}

absl::Status MayDecide(const StepDefinition& def, const Decision& decision,
                       const std::string& escalated_to) {
  const ApprovalSpec& spec = def.approval;
  if (InGroup(decision, escalated_to)) {
    // The request escalated to this group: its members decide too.
  } else if (!spec.group.empty()) {
    if (!InGroup(decision, spec.group)) {
      return absl::PermissionDeniedError("step '" + def.name + "' is decided by group '" +
                                         spec.group + "', and '" + decision.actor +
                                         "' is not in it");
    }
  } else if (RoleRank(decision.role) < RoleRank(spec.role)) {
    return absl::PermissionDeniedError("step '" + def.name + "' is decided by role " + spec.role +
                                       " or above, and '" + decision.actor + "' is " +
                                       (decision.role.empty() ? "none" : decision.role));
  }
  return absl::OkStatus();
}

// What a decision on the open request (in `record`) does: approved, the step
// completes and the instance goes on; rejected, the step fails and the instance
// goes where `on_reject` says.
Change Decided(const Facts& facts, StepRecord step, const Json& record) {
  const StepDefinition& def = facts.definition.steps[step.index];
  const Json& decision = record["decision"];
  step.response_json = JsonText(record);
  step.next_attempt_at = 0;
  if (TextAt(decision, "outcome") == "approve") {
    Change change = At(facts);
    MarkCompleted(step, facts.now);
    change.steps.push_back(step);
    AddEvent(facts, change, "waystone.step.completed", &step,
             "approved by " + TextAt(decision, "by"));
    if (facts.instance.state == InstanceState::kRunning) change.next_run_at = facts.now;
    return change;
  }
  std::string message = TextAt(decision, "outcome") == "timeout"
                            ? "no decision within " + FormatDuration(def.approval.timeout)
                            : "approval rejected by " + TextAt(decision, "by", "?");
  const bool timed_out = TextAt(decision, "outcome") == "timeout";
  if (const std::string comment = TextAt(decision, "comment"); !comment.empty() && !timed_out) {
    message += ": " + comment;
  }
  const RejectRoute route =
      timed_out && !def.approval.timeout_rejects ? def.approval.on_timeout : def.approval.on_reject;
  if (route == RejectRoute::kCompensate) {
    return FailStep(facts, step, ErrorClass::kRejected, message, std::nullopt);
  }
  step.state = StepState::kFailed;
  step.error_class = ErrorClass::kRejected;
  step.error_message = ShortenMessage(message);
  step.finished_at = facts.now;
  if (route == RejectRoute::kWait) {
    return Pause(facts, step, timed_out ? AlertKind::kNeedsOperator : AlertKind::kApprovalRejected,
                 "step '" + step.name + "': " + message + "; an operator decides what follows");
  }
  Change change = At(facts);
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.failed", &step, step.error_message);
  SetInstanceState(facts, change, InstanceState::kClosed, "step '" + step.name + "': " + message);
  return change;
}

AuditRecord DecisionAudit(const Facts& facts, const std::string& action, const std::string& reason,
                          const Decision& decision, Json detail) {
  return {0,      facts.now, decision.actor,  facts.instance.tenant, facts.instance.id,
          action, reason,    JsonText(detail)};
}

}  // namespace

Json ApprovalSnapshot::ToJson() const {
  Json out = {{"fields", fields}};
  if (!summary.empty()) out["summary"] = summary;
  if (!requester.empty()) out["requester"] = requester;
  return out;
}

ApprovalSnapshot MaterialOf(const ApprovalSpec& spec, const std::string& input_json) {
  const Json input = Json::parse(input_json.empty() ? "null" : input_json, nullptr, false);
  ApprovalSnapshot out;
  for (const std::string& pointer : spec.material) {
    // A pointer that does not fit the input (an index into an object): absent.
    const Json* value = AtPointer(input, pointer);
    out.fields[pointer] = value != nullptr ? *value : Json(nullptr);
  }
  out.data_version = Sha256Hex(JsonText(out.fields));
  return out;
}

absl::StatusOr<ApprovalSnapshot> RenderApproval(const ApprovalSpec& spec,
                                                const std::string& input_json,
                                                const TemplateScope& context) {
  ApprovalSnapshot out = MaterialOf(spec, input_json);
  for (auto [field, text, into] : {std::tuple{"summary", &spec.summary, &out.summary},
                                   std::tuple{"requester", &spec.requester, &out.requester}}) {
    if (text->empty()) continue;
    auto parsed = Template::Parse(*text);
    absl::StatusOr<std::string> rendered =
        parsed.ok() ? parsed->RenderText(context) : absl::StatusOr<std::string>(parsed.status());
    if (!rendered.ok()) {
      return absl::InvalidArgumentError(std::string(field) + ": " +
                                        std::string(rendered.status().message()));
    }
    *into = *rendered;
  }
  return out;
}

Change OpenApproval(const Facts& facts, int index,
                    const absl::StatusOr<ApprovalSnapshot>& snapshot) {
  StepRecord step = facts.steps[index];
  if (!snapshot.ok()) {
    // A definition's mistake, not a decision: nothing is undone for it; an operator
    // fixes the data (a revision) or the definition and retries.
    step.attempts += 1;
    return FailStepAndWait(facts, step, "approval: " + std::string(snapshot.status().message()));
  }
  const Json before = RecordOf(step);
  step.attempts += 1;  // the request's number
  step.started_at = facts.now;
  step.finished_at = 0;
  step.request_hash = snapshot->data_version;
  step.error_class = ErrorClass::kNone;
  step.error_message.clear();
  Json record = {{"request", step.attempts},
                 {"data_version", snapshot->data_version},
                 {"requested_at", facts.now},
                 {"snapshot", snapshot->ToJson()}};
  // Whoever changed the material data of this request, before it opened or while
  // an earlier one was open, is, like the starter and the requester, not the one to
  // decide it.
  for (const std::string& reviser : RevisersIn(before)) AddReviser(record, reviser);
  if (step.state == StepState::kPending) {
    AddReviser(record, TextAt(ObjectAt(before, "cancelled"), "by"));
  }
  std::vector<AuditRecord> dropped;
  if (const auto early = before.find("early_decision");
      early != before.end() && early->is_object()) {
    const std::string by = TextAt(*early, "by");
    const bool own = !OwnInterest(facts, snapshot->requester, record, by).empty();
    if (TextAt(*early, "data_version") == snapshot->data_version && !own) {
      record["decision"] = *early;
      Change change = Decided(facts, step, record);
      AttachToLastEvent(change, record);
      return change;
    }
    // Decided on data that changed before the request opened (or by whom the request
    // now names as its requester): not this request's.
    dropped.push_back(
        {0, facts.now, by, facts.instance.tenant, facts.instance.id, "decision_dropped",
         own ? "decided before its request opened by '" + by + "', who " +
                   OwnInterest(facts, snapshot->requester, record, by)
             : "decided on data version " + Short(TextAt(*early, "data_version")) +
                   " before its request opened; the request is on " + Short(snapshot->data_version),
         JsonText(Json{{"step", step.name}, {"decision", *early}})});
  }
  Change change = At(facts);
  step.state = StepState::kWaiting;
  step.next_attempt_at = NextDeadline(facts.definition.steps[index].approval, record);
  step.response_json = JsonText(record);
  change.steps.push_back(step);
  change.audits = std::move(dropped);
  AddEvent(facts, change, "waystone.approval.requested", &step, snapshot->summary);
  AttachToLastEvent(change, record);
  return change;
}

Change ApprovalDue(const Facts& facts, int index) {
  const ApprovalSpec& spec = facts.definition.steps[index].approval;
  StepRecord step = facts.steps[index];
  Json record = RecordOf(step);
  const Millis requested = NumberAt(record, "requested_at");
  auto due = [&](Millis after, const char* done) {
    return after > 0 && NumberAt(record, done) == 0 && facts.now >= requested + after;
  };
  if (due(spec.timeout, "timed_out_at")) {
    record["timed_out_at"] = facts.now;
    record["decision"] = {{"outcome", spec.timeout_rejects ? "reject" : "timeout"},
                          {"by", "waystone"},
                          {"at", facts.now},
                          {"comment", "no decision within " + FormatDuration(spec.timeout)}};
    Change change = Decided(facts, step, record);
    AttachToLastEvent(change, record);
    change.audits.push_back({0, facts.now, "waystone", facts.instance.tenant, facts.instance.id,
                             "approval_timed_out",
                             "no decision within " + FormatDuration(spec.timeout),
                             JsonText(Json{{"step", step.name}, {"request", step.attempts}})});
    return change;
  }
  Change change = At(facts);
  if (due(spec.remind_after, "reminded_at")) {
    record["reminded_at"] = facts.now;
    AddEvent(facts, change, "waystone.approval.reminder", &step,
             "request " + std::to_string(step.attempts) + " waits for a decision since " +
                 FormatDuration(facts.now - requested));
    AttachToLastEvent(change, record);
  }
  if (due(spec.escalate_after, "escalated_at")) {
    record["escalated_at"] = facts.now;
    record["escalated_to"] = spec.escalate_to;
    AddEvent(facts, change, "waystone.approval.escalated", &step,
             "escalated to group " + spec.escalate_to);
    AttachToLastEvent(change, record);
    change.audits.push_back({0, facts.now, "waystone", facts.instance.tenant, facts.instance.id,
                             "approval_escalated",
                             "no decision within " + FormatDuration(spec.escalate_after),
                             JsonText(Json{{"step", step.name},
                                           {"request", step.attempts},
                                           {"escalated_to", spec.escalate_to}})});
  }
  step.response_json = JsonText(record);
  step.next_attempt_at = NextDeadline(spec, record);
  change.steps.push_back(step);
  return change;
}

DecisionOutcome DecisionArrived(const Facts& facts, int index, const Decision& decision,
                                const ApprovalSnapshot& current,
                                const std::vector<AlertRecord>& open_alerts) {
  const StepDefinition& def = facts.definition.steps[index];
  StepRecord step = facts.steps[index];
  Json record = RecordOf(step);
  DecisionOutcome out;
  out.change.now = facts.now;  // a refusal changes nothing but its audit (and alert)
  const Json detail = DetailOf(step, decision);
  auto refuse = [&](absl::Status status, const Json* standing) {
    Json refused = detail;
    refused["refused"] = std::string(status.message());
    out.change.audits.push_back(
        DecisionAudit(facts, "decision_refused", std::string(status.message()), decision, refused));
    const bool alert_open =
        std::any_of(open_alerts.begin(), open_alerts.end(), [&](const AlertRecord& a) {
          return a.kind == AlertKind::kContradictingDecision && a.step == step.name &&
                 a.state != AlertState::kResolved;
        });
    if (standing != nullptr && TextAt(*standing, "outcome") != Outcome(decision.approve) &&
        !alert_open) {
      AddAlert(facts, out.change, AlertKind::kContradictingDecision, step.name,
               "a late decision (" + Outcome(decision.approve) + " by " + decision.actor +
                   ") contradicts the one that stood on step '" + step.name + "' (" +
                   Describe(*standing) + ")");
    }
    out.refusal = std::move(status);
    return std::move(out);
  };

  const bool open = step.state == StepState::kWaiting;
  const std::string requester =
      open ? TextAt(ObjectAt(record, "snapshot"), "requester") : current.requester;
  const std::string escalated_to = open ? TextAt(record, "escalated_to") : "";
  if (absl::Status may = MayDecide(def, decision, escalated_to); !may.ok()) {
    return refuse(std::move(may), nullptr);
  }
  // Four eyes: whoever started the instance, requested the approval or changed its
  // material data (by any route, at any time before the decision) does not decide it.
  if (const std::string why = OwnInterest(facts, requester, record, decision.actor);
      !why.empty() && step.state != StepState::kCompleted && step.state != StepState::kFailed) {
    return refuse(
        absl::PermissionDeniedError("'" + decision.actor + "' " + why +
                                    " and may not decide step '" + step.name + "' (four eyes)"),
        nullptr);
  }
  if (step.state == StepState::kPending && !def.approval.requester.empty() &&
      current.requester.empty()) {
    // Who asked is not known yet (its template reads what is not there yet): a
    // decision now could be the requester's own.
    return refuse(absl::FailedPreconditionError("step '" + step.name +
                                                "' cannot take a decision before its request "
                                                "opens: its requester is not known yet"),
                  nullptr);
  }
  const Json* standing = nullptr;
  if (step.state == StepState::kPending && record.contains("early_decision")) {
    standing = &record["early_decision"];
  } else if ((step.state == StepState::kCompleted || step.state == StepState::kFailed) &&
             record.contains("decision")) {
    standing = &record["decision"];
  }
  const std::string standing_version =
      step.state == StepState::kPending ? TextAt(ObjectAt(record, "early_decision"), "data_version")
                                        : TextAt(record, "data_version");
  if (standing != nullptr && TextAt(*standing, "by") == decision.actor &&
      TextAt(*standing, "outcome") == Outcome(decision.approve) &&
      standing_version == decision.data_version) {
    out.replayed = true;  // the decision that stands, sent again (its answer was lost)
    out.change = Change{};
    return out;
  }
  if (standing != nullptr) {
    return refuse(absl::FailedPreconditionError("step '" + step.name +
                                                "' was decided already: " + Describe(*standing) +
                                                " on data version " + Short(standing_version) +
                                                "; the first decision stands"),
                  standing);
  }
  const InstanceState state = facts.instance.state;
  if (state != InstanceState::kRunning && state != InstanceState::kNeedsAttention) {
    return refuse(absl::FailedPreconditionError("instance '" + facts.instance.key + "' is " +
                                                std::string(ToString(state)) + "; step '" +
                                                step.name + "' takes no more decisions"),
                  nullptr);
  }
  const std::string current_version = open ? step.request_hash : current.data_version;
  if (open && decision.request != 0 && decision.request != step.attempts) {
    return refuse(
        absl::FailedPreconditionError("request " + std::to_string(decision.request) + " of step '" +
                                      step.name + "' is not the open one: the current request is " +
                                      std::to_string(step.attempts) + ", on data version " +
                                      Short(current_version)),
        nullptr);
  }
  if (step.state == StepState::kPending && decision.request != 0 &&
      decision.request <= step.attempts) {
    return refuse(
        absl::FailedPreconditionError(
            "request " + std::to_string(decision.request) + " of step '" + step.name +
            "' was cancelled (superseded): the next request is " +
            std::to_string(step.attempts + 1) + ", on data version " + Short(current_version)),
        nullptr);
  }
  if ((open || step.state == StepState::kPending) && decision.data_version != current_version) {
    return refuse(absl::FailedPreconditionError(
                      "the decision is about data version " + Short(decision.data_version) +
                      ", but step '" + step.name + "' asks about " + Short(current_version) +
                      ": the data changed; decide on what the current request shows"),
                  nullptr);
  }
  Json decided = {{"outcome", Outcome(decision.approve)},
                  {"by", decision.actor},
                  {"at", facts.now},
                  {"data_version", decision.data_version}};
  if (!decision.comment.empty()) decided["comment"] = decision.comment;
  const std::string reason =
      Outcome(decision.approve) + (decision.comment.empty() ? "" : ": " + decision.comment);
  if (open) {
    record["decision"] = decided;
    out.change = Decided(facts, step, record);
    AttachToLastEvent(out.change, record);
  } else if (step.state == StepState::kPending) {
    if (decision.request != 0 && decision.request != step.attempts + 1) {
      return refuse(
          absl::FailedPreconditionError("step '" + step.name + "' has no request " +
                                        std::to_string(decision.request) + " yet: its next is " +
                                        std::to_string(step.attempts + 1)),
          nullptr);
    }
    decided["before_request"] = true;
    record["early_decision"] = decided;
    step.response_json = JsonText(record);
    out.change.steps.push_back(step);
    AddEvent(facts, out.change, "waystone.approval.decided", &step,
             "decided before its request opened: " + reason);
  } else {
    return refuse(
        absl::FailedPreconditionError("step '" + step.name + "' is " +
                                      std::string(ToString(step.state)) + "; it takes no decision"),
        nullptr);
  }
  Json taken = detail;
  if (!open) taken["before_request"] = true;
  out.change.audits.push_back(DecisionAudit(facts, "decide", reason, decision, taken));
  return out;
}

absl::StatusOr<RevisionOutcome> Revise(const Facts& facts, const Revision& revision) {
  const InstanceRecord& instance = facts.instance;
  if (instance.state != InstanceState::kRunning &&
      instance.state != InstanceState::kNeedsAttention) {
    return absl::FailedPreconditionError("instance '" + instance.key + "' is " +
                                         std::string(ToString(instance.state)) +
                                         "; its input can no longer be revised");
  }
  const Json before =
      Json::parse(instance.input_json.empty() ? "null" : instance.input_json, nullptr, false);
  const Json after = Json::parse(revision.input_json, nullptr, false);
  if (!after.is_object()) return absl::InvalidArgumentError("the input must be a JSON object");
  RevisionOutcome out;
  out.input_hash = Sha256Hex(JsonText(after));
  if (!before.is_discarded() && JsonText(before) == JsonText(after)) {
    out.unchanged = true;
    return out;
  }
  Change& change = out.change;
  change = At(facts);
  bool reopened = false;
  std::vector<StepRecord> touched;
  for (const StepRecord& step : facts.steps) {
    const StepDefinition& def = facts.definition.steps[step.index];
    if (def.kind != StepKind::kApproval) continue;
    const std::string old_version = MaterialOf(def.approval, instance.input_json).data_version;
    const std::string new_version = MaterialOf(def.approval, revision.input_json).data_version;
    if (old_version == new_version) continue;
    out.material.push_back(step.name);
    Json record = RecordOf(step);
    if (step.state == StepState::kPending) {
      // Not asked yet: the request will be about data this actor chose.
      StepRecord noted = step;
      AddReviser(record, revision.actor);
      noted.response_json = JsonText(record);
      touched.push_back(noted);
    } else if (step.state == StepState::kWaiting) {
      AddReviser(record, revision.actor);
      StepRecord cancelled = step;
      const Json was = {{"by", revision.actor},
                        {"at", facts.now},
                        {"reason", revision.reason},
                        {"superseded_by", step.attempts + 1},
                        {"data_version", new_version}};
      record["cancelled"] = was;
      cancelled.state = StepState::kPending;
      cancelled.next_attempt_at = 0;
      cancelled.response_json = JsonText(record);
      touched.push_back(cancelled);
      Json detail = {{"step", step.name},
                     {"request", step.attempts},
                     {"data_version", step.request_hash},
                     {"superseded_by", step.attempts + 1},
                     {"new_data_version", new_version}};
      if (record.contains("snapshot")) detail["snapshot"] = record["snapshot"];
      change.audits.push_back({0, facts.now, revision.actor, instance.tenant, instance.id,
                               "approval_cancelled", revision.reason, JsonText(detail)});
      AddEvent(facts, change, "waystone.approval.cancelled", &cancelled,
               "request " + std::to_string(step.attempts) + " cancelled: " + revision.reason);
      AttachToLastEvent(change, record);
      out.cancelled.push_back(step.name);
    } else if (step.state == StepState::kFailed &&
               instance.state == InstanceState::kNeedsAttention && record.contains("decision")) {
      // Rejected, waiting for an operator: the revised data is asked about anew.
      StepRecord again = step;
      AddReviser(record, revision.actor);
      again.response_json = JsonText(record);
      again.state = StepState::kPending;
      again.error_class = ErrorClass::kNone;
      again.error_message.clear();
      again.next_attempt_at = 0;
      touched.push_back(again);
      out.reopened.push_back(step.name);
      reopened = true;
    } else if (step.state == StepState::kCompleted || step.state == StepState::kFailed) {
      const Json decision = ObjectAt(record, "decision");
      return absl::FailedPreconditionError(
          "step '" + step.name + "' decided request " + std::to_string(step.attempts) + " (" +
          (decision.is_object() ? Describe(decision) : std::string("?")) + ") on data version " +
          Short(step.request_hash) +
          "; the revision changes its material fields, which a decision never follows: "
          "close the case and start anew, or revise only what is not material");
    }
  }
  for (const std::string& name : facts.definition.revision_reruns) {
    const int index = facts.definition.StepIndex(name);
    if (index < 0 || facts.steps[index].state != StepState::kCompleted) continue;
    StepRecord again = facts.steps[index];
    again.state = StepState::kPending;
    again.next_attempt_at = 0;
    touched.push_back(again);
    out.reruns.push_back(name);
  }
  change.steps = std::move(touched);
  change.input_json = JsonText(after);
  Json detail = {{"input_hash", out.input_hash},
                 {"previous_input_hash",
                  Sha256Hex(before.is_discarded() ? instance.input_json : JsonText(before))},
                 {"material", out.material},
                 {"cancelled", out.cancelled},
                 {"reopened", out.reopened},
                 {"reruns", out.reruns}};
  change.audits.push_back({0, facts.now, revision.actor, instance.tenant, instance.id, "revise",
                           revision.reason, JsonText(detail)});
  AddEvent(facts, change, "waystone.instance.revised", nullptr,
           (out.material.empty() ? "not material to any approval: " : "") + revision.reason);
  if (reopened) {
    change.resolve_alerts = true;
    SetInstanceState(facts, change, InstanceState::kRunning,
                     "input revised by " + revision.actor + ": " + revision.reason);
  } else if (instance.state == InstanceState::kRunning && !change.steps.empty()) {
    change.next_run_at = facts.now;
  }
  return out;
}

}  // namespace waystone
