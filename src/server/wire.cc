#include "server/wire.h"

#include <nlohmann/json.hpp>

#include "base/status_macros.h"
#include "base/time_format.h"
#include "model/json_text.h"
#include "server/wire_json.h"

namespace waystone {
namespace wire {

nlohmann::json InstanceSummary(const InstanceRecord& r) {
  // No database id: it would count other tenants' instances. The key is the identity.
  return {{"tenant", r.tenant},
          {"key", r.key},
          {"workflow", r.workflow},
          {"state", ToString(r.state)},
          {"status_reason", r.status_reason},
          {"definition_hash", r.definition_hash},
          {"input_hash", r.input_hash},
          {"trace_id", r.trace_id},
          {"started_by", r.started_by},
          {"created_at", Rfc3339(r.created_at)},
          {"updated_at", Rfc3339(r.updated_at)}};
}

nlohmann::json Alert(const AlertRecord& a, const std::string& instance_key, const PublicIds& ids) {
  return {{"id", ids.Encode(a.id)},   {"instance", instance_key},
          {"tenant", a.tenant},       {"step", a.step},
          {"kind", ToString(a.kind)}, {"state", ToString(a.state)},
          {"message", a.message},     {"created_at", Rfc3339(a.created_at)}};
}

nlohmann::json Attempt(const AttemptRecord& a) {
  nlohmann::json out = {
      {"seq", a.seq},
      {"phase", ToString(a.phase)},
      {"sent", a.sent},
      {"connection", ToString(a.connection)},
      {"status", a.status},
      {"error_class", ToString(a.error_class)},
      {"detail", a.detail},
      {"started_at", Rfc3339(a.started_at)},
      {"finished_at", Rfc3339(a.finished_at)},
      // null when not known: a call a stopped worker left running
      {"worker", a.worker.empty() ? nlohmann::json() : nlohmann::json(a.worker)},
      {"lease_epoch", a.lease_epoch == 0 ? nlohmann::json() : nlohmann::json(a.lease_epoch)}};
  if (a.started_at > 0 && a.finished_at >= a.started_at) {
    out["latency_ms"] = a.finished_at - a.started_at;
  }
  return out;
}

nlohmann::json Tombstone(const TombstoneRecord& t) {
  nlohmann::json ids = nlohmann::json::parse(t.external_ids_json, nullptr, false);
  return {{"tenant", t.tenant},
          {"key", t.key},
          {"workflow", t.workflow},
          {"input_hash", t.input_hash},
          {"final_state", ToString(t.final_state)},
          {"external_ids", ids.is_discarded() ? nlohmann::json::object() : ids},
          {"finished_at", Rfc3339(t.finished_at)},
          {"collected_at", Rfc3339(t.collected_at)}};
}

}  // namespace wire

namespace {
using Json = nlohmann::json;

// The newest requests of each step the instance view carries; GET /v1/attempts
// pages through all of them.
constexpr int kViewRequests = 10;
}  // namespace

std::string Rfc3339(Millis at) { return at <= 0 ? "" : FormatRfc3339(at); }

std::string InstanceSummaryJson(const InstanceRecord& instance) {
  return JsonText(wire::InstanceSummary(instance));
}

absl::StatusOr<PublicIds> PublicIdsOf(AccessStore& store) {
  WS_ASSIGN_OR_RETURN(std::string key, store.ServerKey("public_ids"));
  return PublicIds(std::move(key));
}

absl::StatusOr<std::string> InstanceViewJson(Store& store, const InstanceRecord& instance,
                                             const PublicIds& ids) {
  WS_ASSIGN_OR_RETURN(std::vector<StepRecord> steps, store.GetSteps(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<AlertRecord> alerts, store.ListAlerts(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<AuditRecord> audit, store.ListAudit(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<DeliveryRecord> deliveries, store.ListDeliveries(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<StepAttemptCounts> counts, store.CountAttempts(instance.id));
  WS_ASSIGN_OR_RETURN(std::vector<KeptEvent> kept, store.GetKeptEvents(instance.id));
  Json out = wire::InstanceSummary(instance);
  out["steps"] = Json::array();
  for (const auto& s : steps) {
    Json step = {{"name", s.name},
                 {"state", ToString(s.state)},
                 {"attempts", s.attempts},
                 {"external_id", s.external_id},
                 {"idempotency_key", s.idempotency_key},
                 {"error_class", ToString(s.error_class)},
                 {"error_message", s.error_message},
                 {"resolution", ToString(s.resolution)},
                 {"unknown_outcomes", s.unknowns},
                 {"lookups", s.lookups},
                 {"compensation_attempts", s.compensation_attempts}};
    if (s.next_attempt_at > 0) step["next_attempt_at"] = Rfc3339(s.next_attempt_at);
    if (s.started_at > 0) step["started_at"] = Rfc3339(s.started_at);
    if (s.finished_at > 0) step["finished_at"] = Rfc3339(s.finished_at);
    // The step's newest requests, oldest first (whether each left, on which
    // connection, what came back), and how many it recorded and the bound dropped.
    step["requests"] = Json::array();
    step["requests_total"] = 0;
    step["requests_dropped"] = 0;
    for (const StepAttemptCounts& c : counts) {
      if (c.step_index != s.index) continue;
      step["requests_total"] = c.recorded;
      step["requests_dropped"] = c.recorded - c.kept;
      WS_ASSIGN_OR_RETURN(
          std::vector<AttemptRecord> newest,
          store.ListAttemptPage({instance.id, s.index, std::nullopt, kViewRequests}));
      for (auto a = newest.rbegin(); a != newest.rend(); ++a) {
        step["requests"].push_back(wire::Attempt(*a));
      }
    }
    out["steps"].push_back(step);
  }
  // A code workflow's events that came before its function waited for their type.
  if (!kept.empty()) out["kept_events"] = Json::array();
  for (const KeptEvent& e : kept) {
    Json data = Json::parse(e.data_json, nullptr, false);
    if (data.is_discarded()) data = e.data_json;
    out["kept_events"].push_back({{"type", e.event_type},
                                  {"source", e.source},
                                  {"id", e.event_id},
                                  {"received_at", Rfc3339(e.received_at)},
                                  {"data", std::move(data)}});
  }
  out["alerts"] = Json::array();
  for (const auto& a : alerts) out["alerts"].push_back(wire::Alert(a, instance.key, ids));
  out["audit"] = Json::array();
  for (const auto& a : audit) {
    Json detail = Json::parse(a.detail_json, nullptr, false);
    if (detail.is_discarded()) detail = a.detail_json;
    // An acknowledgement names its alert by the database id: shown as the public one.
    if (detail.is_object() && detail.contains("alert") && detail["alert"].is_number_integer()) {
      detail["alert"] = ids.Encode(detail["alert"].get<int64_t>());
    }
    out["audit"].push_back({{"at", Rfc3339(a.at)},
                            {"actor", a.actor},
                            {"action", a.action},
                            {"reason", a.reason},
                            {"detail", std::move(detail)}});
  }
  out["deliveries"] = Json::array();
  for (const auto& d : deliveries) {
    out["deliveries"].push_back({{"event_id", d.event_id},
                                 {"type", d.event_type},
                                 {"sink", d.sink},
                                 {"state", ToString(d.state)},
                                 {"attempts", d.attempts},
                                 {"last_error", d.last_error},
                                 {"delivered_at", Rfc3339(d.delivered_at)}});
  }
  RedactStrings(out);  // what the API and the CLI show carries no secret
  return JsonText(out, 2);
}

}  // namespace waystone
