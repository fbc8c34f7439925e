#include <algorithm>
#include <functional>
#include <optional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/crash_point.h"
#include "base/hex.h"
#include "base/time_format.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "server/api_handlers.h"
#include "server/redaction.h"
#include "server/request_bodies.h"
#include "server/request_helpers.h"
#include "server/triage.h"
#include "server/wire.h"
#include "server/wire_json.h"

// GET /v1/instances (a page, filtered), GET /v1/instances/{key} (one in full) and
// POST /v1/instances (start one).

namespace waystone {

using Json = nlohmann::json;

namespace {

std::string CursorOf(const InstanceRecord& r) { return HexOf(r.tenant + "\n" + r.key); }

// An attempts page's cursor names its last attempt: start time, step index, seq.
std::string CursorText(const AttemptRecord& a) {
  return HexOf(absl::StrCat(a.started_at, "\n", a.step_index, "\n", a.seq));
}

// Returns the attempt a cursor names; nullopt for anything CursorText did not make.
std::optional<AttemptCursor> AttemptCursorOf(const std::string& cursor) {
  auto named = FromHex(cursor);
  if (!named) return std::nullopt;
  std::vector<std::string> parts = absl::StrSplit(*named, '\n');
  AttemptCursor after;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &after.started_at) ||
      !absl::SimpleAtoi(parts[1], &after.step_index) || !absl::SimpleAtoi(parts[2], &after.seq) ||
      absl::StrCat(after.started_at, "\n", after.step_index, "\n", after.seq) != *named) {
    return std::nullopt;
  }
  return after;
}

}  // namespace

std::optional<std::string> ReadInstanceFilter(
    const std::function<const std::string*(const char*)>& get, InstanceFilter& filter) {
  auto has = [&](const char* name) { return get(name) != nullptr; };
  auto param = [&](const char* name) { return *get(name); };
  if (has("workflow")) filter.workflow = param("workflow");
  if (has("state")) {
    auto state = ParseInstanceState(param("state"));
    if (!state) return "state '" + param("state") + "' is not an instance state";
    filter.state = *state;
  }
  if (has("error_class")) {
    auto error_class = ParseErrorClass(param("error_class"));
    if (!error_class || *error_class == ErrorClass::kNone) {
      return "error_class must be transient, rejected or unknown";
    }
    filter.error_class = *error_class;
  }
  if (has("alert")) {
    if (param("alert") == "any") {
      filter.with_alert = true;
    } else if (auto kind = ParseAlertKind(param("alert"))) {
      filter.alert_kind = *kind;
    } else {
      return "alert must be 'any' or an alert kind such as needs_operator";
    }
  }
  for (const auto& [name, field] : {std::pair{"created_after", &filter.created_from},
                                    std::pair{"created_before", &filter.created_to},
                                    std::pair{"updated_after", &filter.updated_from},
                                    std::pair{"updated_before", &filter.updated_to}}) {
    if (!has(name)) continue;
    auto at = ParseRfc3339(param(name));
    if (!at) return std::string(name) + " must be an RFC 3339 time such as 2026-11-29T08:00:00Z";
    *field = *at;
  }
  if (has("definition")) {
    // The pinned definition's hash, whole or a prefix of it (the console shows 12).
    const std::string prefix = absl::AsciiStrToLower(param("definition"));
    if (prefix.size() < 6 || prefix.size() > 64 ||
        prefix.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return "definition must be a definition hash or a prefix of it, 6 to 64 hexadecimal digits";
    }
    filter.definition_prefix = prefix;
  }
  if (has("step")) {
    if (param("step").empty()) return "step must not be empty";
    filter.step = param("step");
  }
  if (has("step_state")) {
    auto state = ParseStepState(param("step_state"));
    if (!state) {
      return "step_state '" + param("step_state") +
             "' is not a step state such as unknown or "
             "compensation_failed";
    }
    filter.step_state = *state;
  }
  if (has("http_status")) {
    const std::string text = param("http_status");
    const int number = std::atoi(text.c_str());
    if (number < 100 || number > 599 || std::to_string(number) != text) {
      return "http_status must be a whole number from 100 to 599";
    }
    filter.http_status = number;
  }
  if (has("key_prefix")) filter.key_prefix = param("key_prefix");
  if (has("external_id")) {
    if (param("external_id").empty()) return "external_id must not be empty";
    filter.external_id = param("external_id");
  }
  return std::nullopt;
}

void ListInstances(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res) {
  InstanceFilter filter;
  filter.tenant = TenantOf(principal, req);
  auto param = [&](const char* name) { return Param(req, name); };
  auto has = [&](const char* name) { return req.Query(name) != nullptr; };
  if (auto bad = ReadInstanceFilter([&](const char* name) { return req.Query(name); }, filter)) {
    return Send(res, BadRequest(*bad), req.path);
  }
  if (!WholeNumberParam(req, res, "limit", 1, 1000, &filter.limit)) return;
  if (has("cursor")) {
    // Opaque: it names the last instance of the page (tenant and key), never a
    // number that counts other tenants' instances.
    auto named = FromHex(param("cursor"));
    const size_t cut = named ? named->find('\n') : std::string::npos;
    if (cut == std::string::npos) {
      return Send(res, BadRequest("cursor is not one this server returned"), req.path);
    }
    const std::string tenant = named->substr(0, cut);
    if (!principal.Sees(tenant)) {
      return Send(res, BadRequest("cursor is not one this server returned"), req.path);
    }
    auto last = ctx.store->FindInstance(tenant, named->substr(cut + 1));
    if (absl::IsNotFound(last.status())) {
      return Send(res, BadRequest("the cursor's page is gone (collected); list from the start"),
                  req.path);
    }
    if (!last.ok()) return Send(res, ProblemFromStatus(last.status()), req.path);
    filter.after_id = last->id;
  }
  const int page = filter.limit;
  filter.limit = page + 1;  // one more tells whether there is a next page
  auto instances = ctx.store->ListInstances(filter);
  if (!instances.ok()) return Send(res, ProblemFromStatus(instances.status()), req.path);
  Json items = Json::array();
  Json next = nullptr;
  for (size_t i = 0; i < instances->size(); ++i) {
    if (static_cast<int>(i) == page) {
      const InstanceRecord& last = (*instances)[i - 1];
      next = CursorOf(last);
      break;
    }
    Json item = wire::InstanceSummary((*instances)[i]);
    // Its reason may quote a response body.
    absl::Status hidden = RedactShownInstance(ctx, principal, (*instances)[i], item);
    if (!hidden.ok()) return Send(res, ProblemFromStatus(hidden), req.path);
    items.push_back(std::move(item));
  }
  SendJson(res, 200, {{"items", items}, {"next_cursor", next}});
}

void ShowInstance(const ApiContext& ctx, const Principal& principal, const std::string& key,
                  const ServerRequest& req, ServerResponse& res) {
  auto tenant = TenantOf(principal, req);
  if (!tenant) return Send(res, BadRequest("an all-tenants token must name ?tenant="), req.path);
  auto instance = ctx.store->FindInstance(*tenant, key);
  // Another tenant's instance and a missing one look the same.
  if (!instance.ok()) return Send(res, ProblemFromStatus(instance.status()), req.path);
  auto view = InstanceViewJson(*ctx.store, *instance, *ctx.ids);
  if (!view.ok()) return Send(res, ProblemFromStatus(view.status()), req.path);
  auto steps = ctx.store->GetSteps(instance->id);
  if (!steps.ok()) return Send(res, ProblemFromStatus(steps.status()), req.path);
  auto alerts = ctx.store->ListAlerts(instance->id);
  if (!alerts.ok()) return Send(res, ProblemFromStatus(alerts.status()), req.path);
  Json out = Json::parse(*view);
  // The pinned input, as started (the view carries its hash only).
  Json input = Json::parse(instance->input_json, nullptr, false);
  out["input"] = input.is_discarded() ? Json(instance->input_json) : input;
  out["stopped"] = StopJson(ctx, principal, *instance, *steps, *alerts, TriageOptions{});
  if (Json approvals = ApprovalsJson(ctx, *instance, *steps); !approvals.empty()) {
    out["approvals"] = std::move(approvals);
  }
  RedactFor(ctx, principal, *instance, *steps, out);
  SendJson(res, 200, std::move(out));  // redacted again by SendJson
}

void ListAttemptsOf(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                    ServerResponse& res) {
  const std::string key = Param(req, "key");
  if (key.empty())
    return Send(res, BadRequest("key (the instance's business key) is required"), req.path);
  auto tenant = TenantOf(principal, req);
  if (!tenant) return Send(res, BadRequest("an all-tenants token must name ?tenant="), req.path);
  AttemptQuery query;
  if (!WholeNumberParam(req, res, "limit", 1, 1000, &query.limit)) return;
  if (req.Query("cursor") != nullptr) {
    query.after = AttemptCursorOf(Param(req, "cursor"));
    if (!query.after)
      return Send(res, BadRequest("cursor is not one this server returned"), req.path);
  }
  auto instance = ctx.store->FindInstance(*tenant, key);
  if (!instance.ok()) return Send(res, ProblemFromStatus(instance.status()), req.path);
  auto steps = ctx.store->GetSteps(instance->id);
  if (!steps.ok()) return Send(res, ProblemFromStatus(steps.status()), req.path);
  if (req.Query("step") != nullptr) {
    for (const StepRecord& s : *steps) {
      if (s.name == Param(req, "step")) query.step_index = s.index;
    }
    if (!query.step_index) {
      return Send(res,
                  BadRequest("instance '" + key + "' has no step '" + Param(req, "step") + "'"),
                  req.path);
    }
  }
  query.instance_id = instance->id;
  const int page = query.limit;
  query.limit = page + 1;  // one more tells whether there is a next page
  auto attempts = ctx.store->ListAttemptPage(query);
  if (!attempts.ok()) return Send(res, ProblemFromStatus(attempts.status()), req.path);
  auto counts = ctx.store->CountAttempts(instance->id);
  if (!counts.ok()) return Send(res, ProblemFromStatus(counts.status()), req.path);
  int64_t total = 0, kept = 0;
  for (const StepAttemptCounts& c : *counts) {
    if (query.step_index && c.step_index != *query.step_index) continue;
    total += c.recorded;
    kept += c.kept;
  }
  Json items = Json::array();
  Json next = nullptr;
  for (size_t i = 0; i < attempts->size(); ++i) {
    if (static_cast<int>(i) == page) {
      next = CursorText((*attempts)[i - 1]);
      break;
    }
    const AttemptRecord& a = (*attempts)[i];
    Json item = wire::Attempt(a);
    item["step"] = a.step_index >= 0 && a.step_index < static_cast<int>(steps->size())
                       ? (*steps)[a.step_index].name
                       : "";
    items.push_back(std::move(item));
  }
  RedactFor(ctx, principal, *instance, *steps, items);
  SendJson(res, 200,
           {{"items", items}, {"total", total}, {"dropped", total - kept}, {"next_cursor", next}});
}

namespace {

// The longest a start waits for its outcome (Prefer: wait=N): a waiting request
// holds a handler thread.
constexpr int kMaxPreferWaitSeconds = 30;

// Returns the seconds of a `Prefer: wait=N` (RFC 7240: preferences separated by
// commas, each with optional `;` parameters; `wait` is case-insensitive, its value a
// token or quoted, with optional whitespace around "="), capped; 0 when absent or
// not understood (a preference that is not understood is ignored). Every Prefer
// header line counts, as one comma-joined list.
int PreferredWait(const ServerRequest& req) {
  std::string prefer;
  for (const auto& [name, value] : req.headers) {
    if (name == "prefer") absl::StrAppend(&prefer, value, ",");
  }
  for (absl::string_view item : absl::StrSplit(prefer, ',')) {
    // A preference's `;` parameters are not preferences themselves.
    const absl::string_view preference = absl::StripAsciiWhitespace(item.substr(0, item.find(';')));
    const size_t equals = preference.find('=');
    if (equals == absl::string_view::npos) continue;
    if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(preference.substr(0, equals)), "wait")) {
      continue;
    }
    absl::string_view value = absl::StripAsciiWhitespace(preference.substr(equals + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (value.empty() || value.find_first_not_of("0123456789") != absl::string_view::npos) return 0;
    if (value.size() > 4) return kMaxPreferWaitSeconds;
    return std::min(std::stoi(std::string(value)), kMaxPreferWaitSeconds);
  }
  return 0;
}

}  // namespace

void StartInstance(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res) {
  auto body = JsonBody(req, res, ParseStartBody);
  if (!body) return;
  const std::string& workflow = body->workflow;
  auto tenant = WriteTenant(principal, body->tenant, req, res);
  if (!tenant) return;
  auto definition = ctx.engine->catalog().Current(workflow);
  if (definition == nullptr) {
    return Send(res,
                MakeProblem(ProblemKind::kUnknownWorkflow,
                            "no workflow '" + workflow + "' is registered on this server"),
                req.path);
  }
  CrashPoint("api-start", workflow);
  StartRequest start;
  start.tenant = *tenant;
  start.input_json = body->input_json;
  start.started_by = principal.token_name;
  auto started = ctx.engine->StartInstance(*definition, start);
  if (!started.ok()) {
    if (absl::IsPermissionDenied(started.status())) {
      return Send(res, Forbidden(std::string(started.status().message())), req.path);
    }
    if (absl::IsFailedPrecondition(started.status())) {
      return Send(
          res,
          MakeProblem(ProblemKind::kBusinessKeyConflict, std::string(started.status().message())),
          req.path);
    }
    return Send(res, ProblemFromStatus(started.status()), req.path);
  }
  CrashPoint("api-started", workflow);
  const bool created = started->outcome == StartOutcome::kCreated;
  res.SetHeader("Location", "/v1/instances/" + started->instance.key);
  const int wait = started->tombstone ? 0 : PreferredWait(req);
  const int max_waiting = std::max(1, ctx.options.handler_threads / 2);
  if (wait > 0 && ctx.waiting_starts.fetch_add(1) < max_waiting) {
    // The caller wants the outcome (an ERP order number) in this answer: the
    // instance as it rests, with its steps, or 202 and how far it got.
    auto rested = ctx.engine->AwaitRest(started->instance.id, wait * 1000LL);
    ctx.waiting_starts.fetch_sub(1);
    absl::StatusOr<std::string> view =
        rested.ok() ? InstanceViewJson(*ctx.store, *rested, *ctx.ids) : rested.status();
    if (view.ok()) {
      Json out = Json::parse(*view);
      out["created"] = created;
      absl::Status hidden = RedactShownInstance(ctx, principal, *rested, out);
      if (!hidden.ok()) return Send(res, ProblemFromStatus(hidden), req.path);
      res.SetHeader("Preference-Applied", "wait=" + std::to_string(wait));
      return SendJson(res, !IsTerminal(rested->state) ? 202 : created ? 201 : 200, out);
    }
    // The start happened; only the wait failed (gc removed it meanwhile, the store
    // blinked): the answer is the start's, as without a preference.
  } else if (wait > 0) {
    ctx.waiting_starts.fetch_sub(1);  // as many wait as may: answered at once
  }
  Json out = wire::InstanceSummary(started->instance);
  out["created"] = created;
  if (started->tombstone) {
    // Removed by gc: answered as existing, from what gc kept; nothing is started.
    out["collected"] = true;
    out["tombstone"] = wire::Tombstone(*started->tombstone);
    KeyTombstoneHashes(ctx, principal, started->instance.tenant, out);
  } else if (absl::Status hidden = RedactShownInstance(ctx, principal, started->instance, out);
             !hidden.ok()) {
    return Send(res, ProblemFromStatus(hidden), req.path);
  }
  SendJson(res, created ? 201 : 200, out);
}

}  // namespace waystone
