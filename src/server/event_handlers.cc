#include <nlohmann/json.hpp>

#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/operate/operations.h"
#include "server/api_handlers.h"
#include "server/cloudevents_in.h"
#include "server/redaction.h"
#include "server/request_helpers.h"
#include "server/wire_json.h"

// POST /v1/events: the CloudEvents inbox. Each event is routed by its type (the
// serve config's `events:`) to start an instance or to signal a waiting one; a
// batch is checked whole before any of it is applied, and stops at the first
// event that fails.

namespace waystone {
namespace {

using Json = nlohmann::json;

std::string StartOutcomeName(StartOutcome outcome) {
  switch (outcome) {
    case StartOutcome::kCreated:
      return "started";
    case StartOutcome::kExisting:
      return "existing";
    case StartOutcome::kCollected:
      return "existing";  // with its tombstone
    case StartOutcome::kDuplicateEvent:
      return "duplicate";
    case StartOutcome::kEventConflict:
      return "conflict";
  }
  return "unknown";
}

// A routed event, checked before any is applied.
struct Routed {
  IncomingEvent event;
  const EventRoute* route = nullptr;
  std::string tenant;
  std::shared_ptr<const WorkflowDefinition> definition;  // start
  std::string key;                                       // signal
};

}  // namespace

void ReceiveEvents(const ApiContext& ctx, const Principal& principal, const ServerRequest& req,
                   ServerResponse& res) {
  const std::string* type_header = req.Header("content-type");
  const std::string content_type = type_header != nullptr ? *type_header : "";
  auto events = ParseCloudEvents(content_type, req.headers, req.body);
  if (!events.ok()) return Send(res, ProblemFromStatus(events.status()), req.path);
  const bool batch =
      events->size() > 1 || content_type.starts_with("application/cloudevents-batch+json");
  std::vector<Routed> routed;
  for (size_t i = 0; i < events->size(); ++i) {
    IncomingEvent& event = (*events)[i];
    const std::string where = batch ? "event " + std::to_string(i) + ": " : "";
    auto found = ctx.event_routes.find(event.type);
    if (found == ctx.event_routes.end()) {
      return Send(res,
                  MakeProblem(ProblemKind::kUnroutedEvent,
                              where + "no route for event type '" + event.type + "'"),
                  req.path);
    }
    Routed r{event, &found->second, "", nullptr, ""};
    if (principal.tenant == "*") {
      if (event.tenant.empty()) {
        return Send(res,
                    BadRequest(where + "missing attribute 'tenant' (an all-tenants "
                                       "token names the tenant in each event)"),
                    req.path);
      }
      r.tenant = event.tenant;
    } else {
      if (!event.tenant.empty() && event.tenant != principal.tenant) {
        return Send(res, Forbidden(where + "the token is for tenant '" + principal.tenant + "'"),
                    req.path);
      }
      r.tenant = principal.tenant;
    }
    const Json data = Json::parse(event.data_json, nullptr, false);  // ours, bounded
    if (!r.route->start.empty()) {
      r.definition = ctx.engine->catalog().Current(r.route->start);
      if (r.definition == nullptr) {
        return Send(res,
                    MakeProblem(ProblemKind::kUnknownWorkflow, where + "event type '" + event.type +
                                                                   "' starts '" + r.route->start +
                                                                   "', which is not registered"),
                    req.path);
      }
      if (!data.is_object()) {
        return Send(res,
                    BadRequest(where + "data must be a JSON object: it is the input of '" +
                               r.route->start + "'"),
                    req.path);
      }
    } else {
      const Json::json_pointer pointer(r.route->signal_key);
      if (!data.is_object() || !data.contains(pointer) || !data.at(pointer).is_string()) {
        return Send(res,
                    BadRequest(where + "data has no string at " + r.route->signal_key +
                               " (the business key of the instance to signal)"),
                    req.path);
      }
      r.key = data.at(pointer).get<std::string>();
    }
    routed.push_back(std::move(r));
  }

  Json results = Json::array();
  // Ends the batch at event `i`: the events before it are applied (a redelivery of
  // them is a duplicate); it and the rest are not.
  auto stop_at = [&](size_t i, Json result, const char* outcome, const std::string& error,
                     const Problem& problem) {
    for (size_t j = i + 1; j < routed.size(); ++j) {
      results.push_back({{"id", routed[j].event.id},
                         {"source", routed[j].event.source},
                         {"type", routed[j].event.type},
                         {"outcome", "not_processed"}});
    }
    result["outcome"] = outcome;
    result["error"] = error;
    results.insert(results.begin() + static_cast<long>(i), std::move(result));
    Send(res, problem, req.path, {{"results", results}});
  };
  for (size_t i = 0; i < routed.size(); ++i) {
    const Routed& r = routed[i];
    Json result = {{"id", r.event.id}, {"source", r.event.source}, {"type", r.event.type}};
    absl::Status failed;
    std::string conflict;
    if (r.definition) {
      StartRequest start{r.tenant, r.event.data_json, r.event.source, r.event.id};
      start.started_by = principal.token_name;
      auto started = ctx.engine->StartInstance(*r.definition, start);
      if (started.ok() && started->outcome == StartOutcome::kEventConflict) {
        conflict = InboxConflictMessage(r.event.source, r.event.id, started->stored_data_hash,
                                        EventDataHash(r.event.data_json));
      } else if (started.ok()) {
        result["instance"] = started->instance.key;
        result["outcome"] = StartOutcomeName(started->outcome);
        if (started->tombstone) {
          Json tombstone = wire::Tombstone(*started->tombstone);
          KeyTombstoneHashes(ctx, principal, r.tenant, tombstone);
          result["tombstone"] = std::move(tombstone);
        }
      } else {
        failed = started.status();
      }
    } else if (r.route->act != "signal") {
      // An approval's decision, or a revision, carried by an event (approval_handlers.cc).
      auto acted = ActOnEvent(ctx, principal, r.tenant, r.key, *r.route, r.event.source, r.event.id,
                              r.event.data_json);
      result["instance"] = r.key;
      if (acted.ok()) {
        result["outcome"] = *acted;
      } else {
        failed = acted.status();
      }
    } else {
      Signal signal{r.tenant,
                    r.key,
                    r.event.type,
                    r.event.source,
                    r.event.id,
                    r.event.data_json,
                    principal.token_name};
      auto delivered = ctx.engine->operations().Deliver(signal);
      result["instance"] = r.key;
      if (delivered.ok() && delivered->outcome == SignalOutcome::kConflict) {
        conflict = InboxConflictMessage(r.event.source, r.event.id, delivered->stored_data_hash,
                                        delivered->data_hash);
      } else if (delivered.ok()) {
        result["outcome"] = delivered->outcome == SignalOutcome::kApplied ? "signalled"
                            : delivered->outcome == SignalOutcome::kKept  ? "kept"
                                                                          : "duplicate";
      } else {
        failed = delivered.status();
      }
    }
    if (!conflict.empty()) {
      // The same id with other data is never a duplicate: refused, with an alert.
      return stop_at(i, std::move(result), "conflict", conflict,
                     MakeProblem(ProblemKind::kInboxConflict,
                                 (batch ? "event " + std::to_string(i) + ": " : "") + conflict));
    }
    if (!failed.ok()) {
      // A busy instance is worth redelivering.
      const absl::Status shown =
          absl::IsAborted(failed) ? absl::UnavailableError(failed.message()) : failed;
      Problem problem = ProblemFromStatus(shown);
      if (problem.status != 503 && problem.status != 500) {
        problem.detail = (batch ? "event " + std::to_string(i) + ": " : "") + problem.detail;
      }
      return stop_at(i, std::move(result), "failed", std::string(failed.message()), problem);
    }
    results.push_back(result);
  }
  SendJson(res, 200, {{"results", results}});
}

}  // namespace waystone
