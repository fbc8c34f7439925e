#include <algorithm>

#include <nlohmann/json.hpp>

#include "base/status_macros.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "model/json_text.h"
#include "rules/approvals.h"
#include "server/api_handlers.h"
#include "server/redaction.h"
#include "server/request_bodies.h"
#include "server/request_helpers.h"
#include "server/wire.h"
#include "server/wire_json.h"

// POST /v1/instances/{key}/decide: an approver's decision on an approval step's
// request; POST /v1/instances/{key}/revise: a new version of an instance's input;
// both as CloudEvents too (ActOnEvent), and the view's "approvals". Who may decide
// is the step's (approvals.h); the token names the actor.

namespace waystone {

using Json = nlohmann::json;

Json ApprovalsJson(const ApiContext& ctx, const InstanceRecord& instance,
                   const std::vector<StepRecord>& steps) {
  Json out = Json::array();
  auto definition = ctx.definitions->Get(instance.definition_hash);
  if (!definition.ok()) return out;
  for (const StepRecord& step : steps) {
    if (step.index >= static_cast<int>((*definition)->steps.size())) continue;
    const StepDefinition& def = (*definition)->steps[step.index];
    if (def.kind != StepKind::kApproval) continue;
    Json record =
        Json::parse(step.response_json.empty() ? "{}" : step.response_json, nullptr, false);
    if (!record.is_object()) record = Json::object();
    Json item = {{"step", step.name}, {"state", ToString(step.state)}};
    item["approvers"] = def.approval.group.empty() ? Json{{"role", def.approval.role}}
                                                   : Json{{"group", def.approval.group}};
    const bool opened = step.state != StepState::kPending && record.contains("request");
    if (opened) {
      for (const char* field : {"request", "data_version", "snapshot", "decision"}) {
        if (record.contains(field)) item[field] = record[field];
      }
      for (const char* field : {"reminded_at", "escalated_at", "escalated_to", "cancelled"}) {
        if (record.contains(field)) item[field] = record[field];
      }
      if (record.contains("requested_at") && record["requested_at"].is_number_integer()) {
        const Millis requested = record["requested_at"].get<Millis>();
        item["requested_at"] = Rfc3339(requested);
        // The deadlines, and a countdown to the next one (the step's timer).
        const ApprovalSpec& a = def.approval;
        if (a.remind_after > 0) item["remind_at"] = Rfc3339(requested + a.remind_after);
        if (a.escalate_after > 0) item["escalate_at"] = Rfc3339(requested + a.escalate_after);
        if (a.timeout > 0) item["times_out_at"] = Rfc3339(requested + a.timeout);
        if (step.state == StepState::kWaiting && step.next_attempt_at > 0) {
          item["next_deadline_in_seconds"] =
              std::max<Millis>(0, step.next_attempt_at - ctx.clock->NowMillis()) / 1000;
        }
      }
    } else {
      // Not open yet: what a decision before its request quotes.
      const ApprovalSnapshot now = MaterialOf(def.approval, instance.input_json);
      item["next_request"] = step.attempts + 1;
      item["data_version"] = now.data_version;
      item["snapshot"] = now.ToJson();
      if (record.contains("early_decision")) item["early_decision"] = record["early_decision"];
    }
    out.push_back(std::move(item));
  }
  return out;
}

void DecideApproval(const ApiContext& ctx, const Principal& principal, const std::string& key,
                    const ServerRequest& req, ServerResponse& res) {
  auto body = JsonBody(req, res, ParseDecisionBody);
  if (!body) return;
  auto tenant = WriteTenant(principal, Param(req, "tenant"), req, res);
  if (!tenant) return;
  Decision decision;
  decision.step = body->step;
  decision.request = body->request;
  decision.data_version = body->data_version;
  decision.approve = body->approve;
  decision.comment = body->comment;
  decision.actor = principal.token_name;
  decision.role = RoleName(principal.role);
  decision.groups = GroupsOf(ctx.options.groups, principal.token_name, *tenant);
  auto result = ctx.engine->operations().Decide(*tenant, key, decision);
  if (!result.ok()) return Send(res, ProblemFromStatus(result.status()), req.path);
  const std::string& text = result->step.response_json;
  Json approval = Json::parse(text.empty() ? "{}" : text, nullptr, false);
  Json out = {{"step", result->step.name},
              {"step_state", ToString(result->step.state)},
              {"decision", body->approve ? "approve" : "reject"},
              {"replayed", result->replayed},
              {"approval", approval.is_discarded() ? Json(nullptr) : approval},
              {"instance", wire::InstanceSummary(result->instance)}};
  auto steps = ctx.store->GetSteps(result->instance.id);
  if (!steps.ok()) return Send(res, ProblemFromStatus(steps.status()), req.path);
  RedactFor(ctx, principal, result->instance, *steps, out);
  SendJson(res, 200, out);
}

void ReviseInstance(const ApiContext& ctx, const Principal& principal, const std::string& key,
                    const ServerRequest& req, ServerResponse& res) {
  auto body = JsonBody(req, res, ParseReviseBody);
  if (!body) return;
  auto tenant = WriteTenant(principal, Param(req, "tenant"), req, res);
  if (!tenant) return;
  if (!Permitted(ctx.options.permissions, principal, *tenant, Permission::kRevise, req, res)) {
    return;
  }
  const Revision revision{body->input_json, principal.token_name, body->reason};
  auto result = ctx.engine->operations().Revise(*tenant, key, revision);
  if (!result.ok()) return Send(res, ProblemFromStatus(result.status()), req.path);
  Json out = {{"unchanged", result->unchanged},
              {"input_hash", result->input_hash},
              {"material", result->material},
              {"cancelled", result->cancelled},
              {"reopened", result->reopened},
              {"reruns", result->reruns},
              {"instance", wire::InstanceSummary(result->instance)}};
  SendJson(res, 200, out);
}

absl::StatusOr<std::string> ActOnEvent(const ApiContext& ctx, const Principal& principal,
                                       const std::string& tenant, const std::string& key,
                                       const EventRoute& route, const std::string& source,
                                       const std::string& id, const std::string& data_json) {
  const Json data = Json::parse(data_json, nullptr, false);
  const InboxClaim inbox{tenant, source, id, EventDataHash(data_json)};
  auto fields = [&](std::initializer_list<const char*> names) {
    Json picked = Json::object();
    for (const char* name : names) {
      if (data.is_object() && data.contains(name)) picked[name] = data[name];
    }
    return JsonText(picked);
  };
  if (route.act == "revise") {
    if (!PermissionsOf(ctx.options.permissions, principal.role, tenant)
             .contains(Permission::kRevise)) {
      return absl::PermissionDeniedError("the " + std::string(RoleName(principal.role)) +
                                         " role may not revise in tenant '" + tenant + "'");
    }
    Json body = Json::parse(fields({"input", "reason"}));
    if (!body.contains("reason")) {
      body["reason"] = "event " + route.type + " " + id + " from " + source;
    }
    WS_ASSIGN_OR_RETURN(ReviseBody parsed, ParseReviseBody(JsonText(body)));
    const Revision revision{parsed.input_json, principal.token_name, parsed.reason, inbox};
    WS_ASSIGN_OR_RETURN(RevisionResult result,
                        ctx.engine->operations().Revise(tenant, key, revision));
    return result.duplicate ? "duplicate" : result.unchanged ? "unchanged" : "revised";
  }
  WS_ASSIGN_OR_RETURN(
      DecisionBody parsed,
      ParseDecisionBody(fields({"step", "request", "data_version", "decision", "comment"})));
  Decision decision;
  decision.step = parsed.step;
  decision.request = parsed.request;
  decision.data_version = parsed.data_version;
  decision.approve = parsed.approve;
  decision.comment = parsed.comment;
  decision.actor = principal.token_name;
  decision.role = RoleName(principal.role);
  decision.groups = GroupsOf(ctx.options.groups, principal.token_name, tenant);
  decision.inbox = inbox;
  WS_ASSIGN_OR_RETURN(DecisionResult result,
                      ctx.engine->operations().Decide(tenant, key, decision));
  return result.duplicate ? "duplicate" : "decided";
}

}  // namespace waystone
