#include <algorithm>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/crash_point.h"
#include "base/hex.h"
#include "base/time_format.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "server/api_handlers.h"
#include "server/request_bodies.h"
#include "server/redaction.h"
#include "server/request_helpers.h"
#include "server/triage.h"
#include "server/wire.h"
#include "server/wire_json.h"

// GET /v1/instances (a page, filtered), GET /v1/instances/{key} (one in full) and
// POST /v1/instances (start one).

namespace waystone {

using Json = nlohmann::json;

namespace {

// The most instances one request of a key-prefix or external-id search reads: these
// filters are applied here, over the store's pages, not by an index.
constexpr int kSearchScan = 5000;
constexpr int kSearchBatch = 500;

std::string CursorOf(const InstanceRecord& r) { return HexOf(r.tenant + "\n" + r.key); }

// GET /v1/instances with key_prefix or external_id (an ERP order number: some step's
// external id, exactly): reads the filtered instances in id order, keeps those that
// match, and stops at a full page or after kSearchScan instances. The cursor names
// the last instance read, so a page may hold fewer than `page` items (even none)
// while next_cursor goes on.
void ListMatching(const ApiContext& ctx, const ServerRequest& req, ServerResponse& res,
                  InstanceFilter filter, const std::string& key_prefix,
                  const std::string& external_id, int page) {
  if (req.Query("external_id") != nullptr && external_id.empty()) {
    return Send(res, BadRequest("external_id must not be empty"), req.path);
  }
  Json items = Json::array();
  Json next = nullptr;
  int scanned = 0;
  filter.limit = kSearchBatch;
  while (true) {
    auto batch = ctx.store->ListInstances(filter);
    if (!batch.ok()) return Send(res, ProblemFromStatus(batch.status()), req.path);
    for (const InstanceRecord& r : *batch) {
      ++scanned;
      filter.after_id = r.id;
      bool match = absl::StartsWith(r.key, key_prefix);
      if (match && !external_id.empty()) {
        auto steps = ctx.store->GetSteps(r.id);
        if (!steps.ok()) return Send(res, ProblemFromStatus(steps.status()), req.path);
        match = std::any_of(steps->begin(), steps->end(),
                            [&](const StepRecord& s) { return s.external_id == external_id; });
      }
      if (match) items.push_back(wire::InstanceSummary(r));
      if (static_cast<int>(items.size()) == page || scanned == kSearchScan) {
        next = CursorOf(r);
        break;
      }
    }
    if (!next.is_null() || static_cast<int>(batch->size()) < kSearchBatch) break;
  }
  SendJson(res, 200, {{"items", items}, {"next_cursor", next}});
}

}  // namespace

void ListInstances(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res) {
  InstanceFilter filter;
  filter.tenant = TenantOf(principal, req);
  auto param = [&](const char* name) { return Param(req, name); };
  auto has = [&](const char* name) { return req.Query(name) != nullptr; };
  if (has("workflow")) filter.workflow = param("workflow");
  if (has("state")) {
    auto state = ParseInstanceState(param("state"));
    if (!state) {
      return Send(res, BadRequest("state '" + param("state") + "' is not an instance state"),
                  req.path);
    }
    filter.state = *state;
  }
  if (has("error_class")) {
    auto error_class = ParseErrorClass(param("error_class"));
    if (!error_class || *error_class == ErrorClass::kNone) {
      return Send(res, BadRequest("error_class must be transient, rejected or unknown"),
                  req.path);
    }
    filter.error_class = *error_class;
  }
  if (has("alert")) {
    if (param("alert") == "any") {
      filter.with_alert = true;
    } else if (auto kind = ParseAlertKind(param("alert"))) {
      filter.alert_kind = *kind;
    } else {
      return Send(res, BadRequest("alert must be 'any' or an alert kind such as "
                                  "needs_operator"),
                  req.path);
    }
  }
  for (const auto& [name, field] : {std::pair{"created_after", &filter.created_from},
                                    std::pair{"created_before", &filter.created_to}}) {
    if (!has(name)) continue;
    auto at = ParseRfc3339(param(name));
    if (!at) {
      return Send(res, BadRequest(std::string(name) + " must be an RFC 3339 time such as "
                                                     "2026-11-29T08:00:00Z"),
                  req.path);
    }
    *field = *at;
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
  if (has("key_prefix") || has("external_id")) {
    return ListMatching(ctx, req, res, filter, param("key_prefix"), param("external_id"), page);
  }
  filter.limit = page + 1;  // one more tells whether there is a next page
  auto instances = ctx.store->ListInstances(filter);
  if (!instances.ok()) return Send(res, ProblemFromStatus(instances.status()), req.path);
  Json items = Json::array();
  Json next = nullptr;
  for (size_t i = 0; i < instances->size(); ++i) {
    if (static_cast<int>(i) == page) {
      const InstanceRecord& last = (*instances)[i - 1];
      next = HexOf(last.tenant + "\n" + last.key);
      break;
    }
    items.push_back(wire::InstanceSummary((*instances)[i]));
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
  RedactFor(ctx, principal, *instance, *steps, out);
  SendJson(res, 200, std::move(out));  // redacted again by SendJson
}

void ListAttemptsOf(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                    ServerResponse& res) {
  const std::string key = Param(req, "key");
  if (key.empty()) return Send(res, BadRequest("key (the instance's business key) is required"), req.path);
  auto tenant = TenantOf(principal, req);
  if (!tenant) return Send(res, BadRequest("an all-tenants token must name ?tenant="), req.path);
  int limit = 100;
  if (!WholeNumberParam(req, res, "limit", 1, 1000, &limit)) return;
  auto instance = ctx.store->FindInstance(*tenant, key);
  if (!instance.ok()) return Send(res, ProblemFromStatus(instance.status()), req.path);
  auto steps = ctx.store->GetSteps(instance->id);
  if (!steps.ok()) return Send(res, ProblemFromStatus(steps.status()), req.path);
  std::optional<int> only_step;
  if (req.Query("step") != nullptr) {
    for (const StepRecord& s : *steps) {
      if (s.name == Param(req, "step")) only_step = s.index;
    }
    if (!only_step) {
      return Send(res, BadRequest("instance '" + key + "' has no step '" + Param(req, "step") + "'"),
                  req.path);
    }
  }
  // The cursor names the last attempt of the page (step index and seq).
  std::optional<std::pair<int, int>> after;
  if (req.Query("cursor") != nullptr) {
    auto named = FromHex(Param(req, "cursor"));
    const size_t cut = named ? named->find('\n') : std::string::npos;
    int step_index = -1, seq = -1;
    if (cut != std::string::npos) {
      step_index = std::atoi(named->substr(0, cut).c_str());
      seq = std::atoi(named->substr(cut + 1).c_str());
    }
    if (cut == std::string::npos || *named != std::to_string(step_index) + "\n" + std::to_string(seq)) {
      return Send(res, BadRequest("cursor is not one this server returned"), req.path);
    }
    after = {step_index, seq};
  }
  auto attempts = ctx.store->ListAttempts(instance->id);
  if (!attempts.ok()) return Send(res, ProblemFromStatus(attempts.status()), req.path);
  std::vector<AttemptRecord> rows;
  for (AttemptRecord& a : *attempts) {
    if (!only_step || a.step_index == *only_step) rows.push_back(std::move(a));
  }
  // Newest first: by start time, then the later step, then the later attempt of it.
  std::sort(rows.begin(), rows.end(), [](const AttemptRecord& a, const AttemptRecord& b) {
    return std::tie(a.started_at, a.step_index, a.seq) > std::tie(b.started_at, b.step_index, b.seq);
  });
  size_t from = 0;
  if (after) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const AttemptRecord& a) {
      return a.step_index == after->first && a.seq == after->second;
    });
    if (it == rows.end()) return Send(res, BadRequest("cursor is not one this server returned"), req.path);
    from = static_cast<size_t>(it - rows.begin()) + 1;
  }
  Json items = Json::array();
  Json next = nullptr;
  for (size_t i = from; i < rows.size(); ++i) {
    if (static_cast<int>(items.size()) == limit) {
      const AttemptRecord& last = rows[i - 1];
      next = HexOf(std::to_string(last.step_index) + "\n" + std::to_string(last.seq));
      break;
    }
    const AttemptRecord& a = rows[i];
    const std::string step = a.step_index >= 0 && a.step_index < static_cast<int>(steps->size())
                                 ? (*steps)[a.step_index].name
                                 : "";
    Json item = wire::Attempt(a);
    item["step"] = step;
    if (a.started_at > 0 && a.finished_at >= a.started_at) {
      item["latency_ms"] = a.finished_at - a.started_at;
    }
    items.push_back(std::move(item));
  }
  RedactFor(ctx, principal, *instance, *steps, items);
  SendJson(res, 200, {{"items", items}, {"total", rows.size()}, {"next_cursor", next}});
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
    const absl::string_view preference =
        absl::StripAsciiWhitespace(item.substr(0, item.find(';')));
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
    return Send(res, MakeProblem(ProblemKind::kUnknownWorkflow,
                                 "no workflow '" + workflow + "' is registered on this server"),
                req.path);
  }
  CrashPoint("api-start", workflow);
  StartRequest start;
  start.tenant = *tenant;
  start.input_json = body->input_json;
  auto started = ctx.engine->StartInstance(*definition, start);
  if (!started.ok()) {
    if (absl::IsPermissionDenied(started.status())) {
      return Send(res, Forbidden(std::string(started.status().message())), req.path);
    }
    if (absl::IsFailedPrecondition(started.status())) {
      return Send(res, MakeProblem(ProblemKind::kBusinessKeyConflict,
                                   std::string(started.status().message())),
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
  }
  SendJson(res, created ? 201 : 200, out);
}

}  // namespace waystone
