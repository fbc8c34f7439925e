#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "base/hex.h"
#include "base/secure_token.h"
#include "base/status_macros.h"
#include "base/time_format.h"
#include "engine/engine.h"
#include "engine/operate/batch_runner.h"
#include "engine/operate/operations.h"
#include "model/json_text.h"
#include "server/api_handlers.h"
#include "server/permissions.h"
#include "server/redaction.h"
#include "server/request_bodies.h"
#include "server/request_helpers.h"
#include "server/wire.h"
#include "server/wire_json.h"

// /v1/batches: one operator action over the instances a filter matches — its
// preview (the count and a sample of dry runs), the batch the serve processes'
// runners apply (engine/operate/batch_runner.h), its items, and pause, resume, cancel.

namespace waystone {
namespace {

using Json = nlohmann::json;

// The most instances one batch takes; a broader filter is refused.
constexpr size_t kMaxBatchItems = 1000;
// The most instances a batch's search reads (stopped_at is applied here, over the
// store's pages; every other filter by the store).
constexpr int kBatchScan = 50'000;
constexpr int kScanPage = 500;
// Dry runs in a preview, and keys shown.
constexpr size_t kPreviewDryRuns = 5;
constexpr size_t kPreviewKeys = 20;

// The filter fields a batch takes: the instance list's, and the step it stopped at.
const char* const kFilterFields[] = {
    "workflow",       "state",         "error_class",    "alert",       "created_after",
    "created_before", "updated_after", "updated_before", "definition",  "step",
    "step_state",     "http_status",   "key_prefix",     "external_id", "stopped_at"};

// A step the instance has stopped at: neither ahead of it (pending) nor behind it.
bool StoppedAt(const StepRecord& step) {
  return step.state != StepState::kPending && step.state != StepState::kCompleted &&
         step.state != StepState::kSkipped && step.state != StepState::kCompensated &&
         step.resolution != Resolution::kPassedOver;
}

// The instances of `tenant` that `fields` match, in id order: at most
// kMaxBatchItems + 1 (one more says the filter is too broad). The text of a 400 or
// 422 when the filter is bad or too broad.
struct Matched {
  std::vector<InstanceRecord> instances;
  std::optional<Problem> problem;
};

absl::StatusOr<Matched> MatchInstances(const ApiContext& ctx, const std::string& tenant,
                                       const std::map<std::string, std::string>& fields) {
  Matched out;
  for (const auto& field : fields) {
    const std::string& name = field.first;
    if (std::find_if(std::begin(kFilterFields), std::end(kFilterFields),
                     [&](const char* f) { return name == f; }) == std::end(kFilterFields)) {
      out.problem = BadRequest("unknown filter '" + name + "'");
      return out;
    }
  }
  auto get = [&](const char* name) -> const std::string* {
    auto it = fields.find(name);
    return it == fields.end() ? nullptr : &it->second;
  };
  InstanceFilter filter;
  filter.tenant = tenant;
  if (auto bad = ReadInstanceFilter(get, filter)) {
    out.problem = BadRequest("filter: " + *bad);
    return out;
  }
  const std::string stopped_at = get("stopped_at") ? *get("stopped_at") : "";
  if (get("stopped_at") && stopped_at.empty()) {
    out.problem = BadRequest("filter: stopped_at must not be empty");
    return out;
  }
  filter.limit = kScanPage;
  int scanned = 0;
  while (true) {
    WS_ASSIGN_OR_RETURN(std::vector<InstanceRecord> page, ctx.store->ListInstances(filter));
    for (InstanceRecord& r : page) {
      ++scanned;
      filter.after_id = r.id;
      bool match = true;
      if (!stopped_at.empty()) {
        WS_ASSIGN_OR_RETURN(std::vector<StepRecord> steps, ctx.store->GetSteps(r.id));
        match = std::any_of(steps.begin(), steps.end(), [&](const StepRecord& s) {
          return s.name == stopped_at && StoppedAt(s);
        });
      }
      if (match) out.instances.push_back(std::move(r));
      if (out.instances.size() > kMaxBatchItems || scanned >= kBatchScan) {
        out.problem = MakeProblem(
            ProblemKind::kFilterTooBroad,
            out.instances.size() > kMaxBatchItems
                ? "the filter matches more than " + std::to_string(kMaxBatchItems) +
                      " instances; narrow it (workflow, state, stopped_at, a created range)"
                : "the filter reaches more than " + std::to_string(kBatchScan) +
                      " instances to search; narrow it (workflow, state, a created range)");
        return out;
      }
    }
    if (static_cast<int>(page.size()) < kScanPage) return out;
  }
}

Json FilterJson(const std::map<std::string, std::string>& fields) {
  Json out = Json::object();
  for (const auto& [name, value] : fields) out[name] = value;
  return out;
}

Json BatchJson(const BatchRecord& b) {
  Json counts = Json::object();
  for (const auto& [state, count] : b.counts) counts[std::string(ToString(state))] = count;
  Json fields = Json::parse(b.action_json, nullptr, false);
  Json filter = Json::parse(b.filter_json, nullptr, false);
  return {{"id", b.public_id},
          {"tenant", b.tenant},
          {"actor", b.actor},
          {"reason", b.reason},
          {"action", b.action},
          {"fields", fields.is_discarded() ? Json::object() : fields},
          {"filter", filter.is_discarded() ? Json::object() : filter},
          {"state", ToString(b.state)},
          {"total", b.total},
          {"counts", counts},
          {"created_at", Rfc3339(b.created_at)},
          {"updated_at", Rfc3339(b.updated_at)}};
}

Json ItemJson(const BatchItemRecord& i) {
  Json out = {{"key", i.instance_key},
              {"state", ToString(i.state)},
              {"tries", i.tries},
              {"updated_at", Rfc3339(i.updated_at)}};
  if (!i.result_state.empty()) out["result_state"] = i.result_state;
  if (!i.message.empty()) out["message"] = i.message;
  if (i.applied_at > 0) out["applied_at"] = Rfc3339(i.applied_at);
  if (i.finished_at > 0) out["finished_at"] = Rfc3339(i.finished_at);
  return out;
}

// The batch `id` names when `principal` may see it; answers 404 itself otherwise
// (another tenant's batch and a missing one look the same).
std::optional<BatchRecord> VisibleBatch(const ApiContext& ctx, const Principal& principal,
                                        const std::string& id, const ServerRequest& req,
                                        ServerResponse& res) {
  auto batch = ctx.store->FindBatch(id);
  if (batch.ok() && !principal.Sees(batch->tenant)) batch = absl::NotFoundError("");
  if (absl::IsNotFound(batch.status())) {
    Send(res, NotFound("no batch '" + id + "'"), req.path);
    return std::nullopt;
  }
  if (!batch.ok()) {
    Send(res, ProblemFromStatus(batch.status()), req.path);
    return std::nullopt;
  }
  return *batch;
}

// Hides, in `shown` (what the batch view or preview says of the instance `key`),
// what its definition's redact: list names, unless `principal` may see it.
absl::Status RedactForInstance(const ApiContext& ctx, const Principal& principal,
                               const std::string& tenant, const std::string& key, Json& shown) {
  if (PermissionsOf(ctx.options.permissions, principal.role, tenant)
          .contains(Permission::kSeeRedacted)) {
    return absl::OkStatus();
  }
  auto instance = ctx.store->FindInstance(tenant, key);
  // Collected (gc): its definition is no longer known from here; shown as recorded.
  if (absl::IsNotFound(instance.status())) return absl::OkStatus();
  if (!instance.ok()) return instance.status();
  return RedactShownInstance(ctx, principal, *instance, shown);
}

}  // namespace

void PreviewOrCreateBatch(const ApiContext& ctx, const Principal& principal,
                          const ServerRequest& req, ServerResponse& res) {
  auto body = JsonBody(req, res, ParseBatchBody);
  if (!body) return;
  auto tenant = WriteTenant(principal, body->tenant, req, res);
  if (!tenant) return;
  // As for the action on one instance: before anything is read, a preview too.
  if (!Permitted(ctx.options.permissions, principal, *tenant, PermissionOf(body->request.action),
                 req, res)) {
    return;
  }
  const bool dry_run = DryRun(req).value_or(false);
  auto matched = MatchInstances(ctx, *tenant, body->filter);
  if (!matched.ok()) return Send(res, ProblemFromStatus(matched.status()), req.path);
  if (matched->problem) return Send(res, *matched->problem, req.path);
  const std::vector<InstanceRecord>& instances = matched->instances;
  OperatorRequest request = body->request;
  request.actor = principal.token_name;
  const std::string action(ToString(request.action));
  if (dry_run) {
    Json keys = Json::array();
    Json samples = Json::array();
    for (size_t i = 0; i < instances.size(); ++i) {
      if (i < kPreviewKeys) keys.push_back(instances[i].key);
      if (i >= kPreviewDryRuns) continue;
      OperatorRequest preview = request;
      preview.dry_run = true;
      auto planned = ctx.engine->operations().Apply(*tenant, instances[i].key, preview);
      Json sample = {{"key", instances[i].key}};
      if (planned.ok()) {
        sample["plan"] = PlanJson(planned->plan);
        absl::Status hidden = RedactForInstance(ctx, principal, *tenant, instances[i].key, sample);
        if (!hidden.ok()) return Send(res, ProblemFromStatus(hidden), req.path);
      } else {
        sample["refused"] = Json::parse(ProblemFromStatus(planned.status()).ToJson(req.path));
      }
      samples.push_back(std::move(sample));
    }
    return SendJson(res, 200,
                    {{"dry_run", true},
                     {"action", action},
                     {"tenant", *tenant},
                     {"filter", FilterJson(body->filter)},
                     {"count", instances.size()},
                     {"max_items", kMaxBatchItems},
                     {"keys", keys},
                     {"dry_runs", samples}});
  }
  if (instances.empty()) {
    return Send(res, MakeProblem(ProblemKind::kStateConflict, "the filter matches no instance"),
                req.path);
  }
  NewBatch batch;
  batch.batch.public_id = SecureRandomHex(8);
  batch.batch.tenant = *tenant;
  batch.batch.actor = principal.token_name;
  batch.batch.reason = request.reason;
  batch.batch.action = action;
  batch.batch.action_json = BatchActionJson(request);
  batch.batch.filter_json = JsonText(FilterJson(body->filter));
  for (const InstanceRecord& r : instances) batch.items.push_back({r.id, r.key});
  batch.now = ctx.clock->NowMillis();
  auto created = ctx.store->CreateBatch(batch);
  if (!created.ok()) return Send(res, ProblemFromStatus(created.status()), req.path);
  res.SetHeader("Location", "/v1/batches/" + created->public_id);
  SendJson(res, 201, BatchJson(*created));
}

void ListBatches(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                 ServerResponse& res) {
  BatchFilter filter;
  filter.tenant = TenantOf(principal, req);
  if (!WholeNumberParam(req, res, "limit", 1, 200, &filter.limit)) return;
  if (req.Query("cursor") != nullptr) {
    // Opaque: the last batch of the page, by its public id.
    auto last = ctx.store->FindBatch(Param(req, "cursor"));
    if (!last.ok() || !principal.Sees(last->tenant)) {
      return Send(res, BadRequest("cursor is not one this server returned"), req.path);
    }
    filter.before_id = last->id;
  }
  const int page = filter.limit;
  filter.limit = page + 1;
  auto batches = ctx.store->ListBatches(filter);
  if (!batches.ok()) return Send(res, ProblemFromStatus(batches.status()), req.path);
  Json items = Json::array();
  Json next = nullptr;
  for (size_t i = 0; i < batches->size(); ++i) {
    if (static_cast<int>(i) == page) {
      next = (*batches)[i - 1].public_id;
      break;
    }
    items.push_back(BatchJson((*batches)[i]));
  }
  SendJson(res, 200, {{"items", items}, {"next_cursor", next}});
}

void ShowBatch(const ApiContext& ctx, const Principal& principal, const std::string& id,
               const ServerRequest& req, ServerResponse& res) {
  int limit = 100;
  if (!WholeNumberParam(req, res, "limit", 1, 1000, &limit)) return;
  int64_t after = 0;
  if (req.Query("cursor") != nullptr) {
    // Opaque: the last item of the page.
    auto named = FromHex(Param(req, "cursor"));
    after = named ? std::atoll(named->c_str()) : 0;
    if (!named || after <= 0 || std::to_string(after) != *named) {
      return Send(res, BadRequest("cursor is not one this server returned"), req.path);
    }
  }
  auto batch = VisibleBatch(ctx, principal, id, req, res);
  if (!batch) return;
  auto items = ctx.store->ListBatchItems(batch->id, after, limit + 1);
  if (!items.ok()) return Send(res, ProblemFromStatus(items.status()), req.path);
  Json out = BatchJson(*batch);
  Json list = Json::array();
  Json next = nullptr;
  for (size_t i = 0; i < items->size(); ++i) {
    if (static_cast<int>(i) == limit) {
      next = HexOf(std::to_string((*items)[i - 1].id));
      break;
    }
    Json item = ItemJson((*items)[i]);
    if (item.contains("message")) {  // the instance's reason: it may quote a response
      absl::Status hidden =
          RedactForInstance(ctx, principal, batch->tenant, (*items)[i].instance_key, item);
      if (!hidden.ok()) return Send(res, ProblemFromStatus(hidden), req.path);
    }
    list.push_back(std::move(item));
  }
  out["items"] = list;
  out["next_cursor"] = next;
  SendJson(res, 200, std::move(out));
}

void ChangeBatch(const ApiContext& ctx, const Principal& principal, const std::string& id,
                 const std::string& verb, const ServerRequest& req, ServerResponse& res) {
  if (!CheckJsonMediaType(req, res)) return;
  auto batch = VisibleBatch(ctx, principal, id, req, res);
  if (!batch) return;
  // Pausing, resuming or cancelling a batch needs what its action needs there.
  if (auto action = ParseOperatorAction(batch->action);
      action && !Permitted(ctx.options.permissions, principal, batch->tenant, PermissionOf(*action),
                           req, res)) {
    return;
  }
  std::vector<BatchState> from;
  BatchState to = BatchState::kRunning;
  if (verb == "pause") {
    from = {BatchState::kRunning};
    to = BatchState::kPaused;
  } else if (verb == "resume") {
    from = {BatchState::kPaused};
  } else {
    from = {BatchState::kRunning, BatchState::kPaused};
    to = BatchState::kCancelled;
  }
  auto changed = ctx.store->ChangeBatchState(batch->id, from, to, ctx.clock->NowMillis());
  if (absl::IsFailedPrecondition(changed)) {
    return Send(res,
                MakeProblem(ProblemKind::kStateConflict,
                            std::string(changed.message()) + "; it cannot " + verb),
                req.path);
  }
  if (!changed.ok()) return Send(res, ProblemFromStatus(changed), req.path);
  auto after = ctx.store->GetBatch(batch->id);
  if (!after.ok()) return Send(res, ProblemFromStatus(after.status()), req.path);
  SendJson(res, 200, BatchJson(*after));
}

}  // namespace waystone
