#include "server/api_server.h"

#include <map>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/log.h"
#include "base/sha256.h"
#include "base/time_format.h"
#include "engine/catalog.h"
#include "engine/engine.h"
#include "engine/lease_reaper.h"
#include "engine/operations.h"
#include "model/json_text.h"
#include "server/auth.h"
#include "server/cloudevents_in.h"
#include "server/metrics.h"
#include "server/problem.h"
#include "server/request_bodies.h"
#include "server/wire.h"
#include "server/wire_json.h"

namespace waystone {
namespace {

std::string StartOutcomeName(StartOutcome outcome) {
  switch (outcome) {
    case StartOutcome::kCreated: return "started";
    case StartOutcome::kExisting: return "existing";
    case StartOutcome::kCollected: return "existing";  // with its tombstone
    case StartOutcome::kDuplicateEvent: return "duplicate";
    case StartOutcome::kEventConflict: return "conflict";
  }
  return "unknown";
}

using Json = nlohmann::json;

void Send(httplib::Response& res, const Problem& problem, const std::string& path,
          const Json& extra = Json::object()) {
  res.status = problem.status;
  Json body = Json::parse(problem.ToJson(path));
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  if (problem.status == 503) res.set_header("Retry-After", "1");
  res.set_content(JsonText(body), "application/problem+json");
}

void SendJson(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(JsonText(body), "application/json");
}

Json PlanJson(const ActionPlan& plan) {
  Json changed = Json::array();
  for (const StepRecord& s : plan.changed_steps) {
    changed.push_back({{"name", s.name}, {"state", ToString(s.state)}});
  }
  Json execute = Json::array();
  for (const PlannedCall& c : plan.would_execute) {
    Json call = {{"step", c.step}, {"phase", c.phase}};
    if (!c.method.empty()) call["method"] = c.method;
    if (!c.url.empty()) call["url"] = c.url;
    if (!c.idempotency_key.empty()) call["idempotency_key"] = c.idempotency_key;
    if (!c.event.empty()) call["event"] = c.event;
    execute.push_back(std::move(call));
  }
  Json skip = Json::array();
  for (const SkippedStep& s : plan.would_skip) skip.push_back({{"step", s.step}, {"why", s.why}});
  return {{"state_before", ToString(plan.state_before)},
          {"state_after", ToString(plan.state_after)},
          {"changed_steps", changed},
          {"would_execute", execute},
          {"would_skip", skip}};
}

bool ValidIdempotencyKey(const std::string& key) {
  if (key.empty() || key.size() > 255) return false;
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

class ApiServer::Impl {
 public:
  Impl(const ApiServerOptions& options, Store* store, const Clock* clock, Engine* engine)
      : options_(options),
        store_(store),
        clock_(clock),
        engine_(engine),
        owner_(engine != nullptr ? engine->owner() + "/api" : MakeOwnerName("api")) {
    for (const EventRoute& route : options_.events) routes_[route.type] = route;
  }
  ~Impl() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Listen() {
    const size_t colon = options_.listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError("--listen '" + options_.listen + "' is not host:port");
    }
    const std::string host = options_.listen.substr(0, colon);
    const int port = std::atoi(options_.listen.substr(colon + 1).c_str());
    server_.set_payload_max_length(options_.max_body_bytes);
    server_.set_read_timeout(options_.read_timeout_seconds, 0);
    server_.set_write_timeout(10, 0);
    server_.set_keep_alive_timeout(2);
    // Headers and body go out in separate writes: without this, Nagle's algorithm
    // and the client's delayed ACK add ~40 ms to every response.
    server_.set_tcp_nodelay(true);
    server_.set_exception_handler([](const httplib::Request& req, httplib::Response& res,
                                     std::exception_ptr) {
      Send(res, ProblemFromStatus(absl::InternalError("handler threw")), req.path);
    });
    server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler already wrote a problem
      if (res.status == 413) {
        Send(res, {413, "urn:waystone:problem:payload-too-large", "Request body too large", ""},
             req.path);
      } else if (res.status == 404) {
        Send(res, NotFound("no route " + req.method + " " + req.path), req.path);
      } else if (res.status == 400) {
        Send(res, BadRequest("the request could not be read"), req.path);
      }
    });
    Routes();
    port_ = port == 0 ? server_.bind_to_any_port(host)
                      : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ <= 0) return absl::UnavailableError("cannot listen on " + options_.listen);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op before the loop runs: wait for it so destruction cannot hang.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::OkStatus();
  }

  int port() const { return port_; }

 private:
  // Authenticates the request and checks the role; writes the problem and returns
  // nullopt when refused.
  std::optional<Principal> Allow(const httplib::Request& req, httplib::Response& res, Role need) {
    auto principal = Authenticate(*store_, req.get_header_value("Authorization"));
    if (!principal.ok()) {
      Send(res, ProblemFromStatus(principal.status()), req.path);
      return std::nullopt;
    }
    if (static_cast<int>(principal->role) < static_cast<int>(need)) {
      Send(res, Forbidden("this route needs the " + std::string(need == Role::kAdmin ? "admin" : "operator") +
                          " role"),
           req.path);
      return std::nullopt;
    }
    return *principal;
  }

  // The tenant a request reads: the token's, or ?tenant= for an all-tenants token.
  std::optional<std::string> TenantOf(const Principal& p, const httplib::Request& req) {
    const std::string asked = req.get_param_value("tenant");
    if (p.tenant == "*") return asked.empty() ? std::nullopt : std::optional<std::string>(asked);
    return p.tenant;
  }

  // The one tenant a write acts in: the token's, or `asked` for an all-tenants token.
  std::optional<std::string> WriteTenant(const Principal& p, const std::string& asked,
                                         const httplib::Request& req, httplib::Response& res) {
    if (p.tenant == "*") {
      if (asked.empty()) {
        Send(res, BadRequest("an all-tenants token must name the tenant"), req.path);
        return std::nullopt;
      }
      return asked;
    }
    if (!asked.empty() && asked != p.tenant) {
      Send(res, Forbidden("the token is for tenant '" + p.tenant + "'"), req.path);
      return std::nullopt;
    }
    return p.tenant;
  }

  // Parses a JSON object body; writes a problem and returns nullopt otherwise.
  // Parses a JSON body with `parse` (request_bodies.h), answering 415 or 400 itself.
  template <typename Parse>
  auto JsonBody(const httplib::Request& req, httplib::Response& res, Parse parse)
      -> std::optional<typename decltype(parse(req.body))::value_type> {
    const std::string type = req.get_header_value("Content-Type");
    if (!req.body.empty() && !type.empty() && !type.starts_with("application/json")) {
      Send(res, {415, "urn:waystone:problem:unsupported-media-type", "Unsupported media type",
                 "send application/json"},
           req.path);
      return std::nullopt;
    }
    auto parsed = parse(req.body);
    if (!parsed.ok()) {
      Send(res, BadRequest(std::string(parsed.status().message())), req.path);
      return std::nullopt;
    }
    return std::move(*parsed);
  }

  // Reads an optional string member; writes a problem when it has another type.
  bool NeedEngine(const httplib::Request& req, httplib::Response& res) {
    if (engine_ != nullptr) return true;
    Send(res, ProblemFromStatus(absl::UnavailableError("read-only server")), req.path);
    return false;
  }

  // Runs `handle` under the request's Idempotency-Key, if it has one
  // (draft-ietf-httpapi-idempotency-key-header): a repeated key replays the stored
  // response, a key in flight is 409, a key reused for another request is 422.
  template <typename Handle>
  void Idempotent(const Principal& principal, const httplib::Request& req,
                  httplib::Response& res, Handle&& handle) {
    if (!req.has_header("Idempotency-Key")) return handle();
    const std::string key = req.get_header_value("Idempotency-Key");
    if (!ValidIdempotencyKey(key)) {
      return Send(res, BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters"),
                  req.path);
    }
    const Millis now = clock_->NowMillis();
    ApiRequestRecord record;
    record.tenant = principal.tenant;
    record.key = key;
    record.request_hash = Sha256Hex(req.method + " " + req.path + " dry_run=" +
                                    req.get_param_value("dry_run") + " tenant=" +
                                    req.get_param_value("tenant") + "\n" + req.body);
    record.created_at = now;
    record.expires_at = now + options_.idempotency_retention;
    record.owner = owner_;
    auto claim = store_->BeginApiRequest(record, now - options_.idempotency_stale_after, "");
    if (claim.ok() && claim->outcome == ApiRequestOutcome::kInFlight &&
        IsDeadLocalOwner(claim->stored.owner)) {
      // Its server was killed mid-request: this request takes over (the work it
      // did is idempotent under the business key or the event id).
      claim = store_->BeginApiRequest(record, now - options_.idempotency_stale_after,
                                      claim->stored.owner);
    }
    if (!claim.ok()) return Send(res, ProblemFromStatus(claim.status()), req.path);
    switch (claim->outcome) {
      case ApiRequestOutcome::kInFlight:
        res.set_header("Retry-After", "1");
        return Send(res, {409, "urn:waystone:problem:idempotency-key-in-flight",
                          "A request with this Idempotency-Key is being processed",
                          "retry after it finished"},
                    req.path);
      case ApiRequestOutcome::kMismatch:
        return Send(res, {422, "urn:waystone:problem:idempotency-key-reused",
                          "Idempotency-Key reused with another request",
                          "key '" + key + "' was first used with a different request; use a "
                          "new key for a new request"},
                    req.path);
      case ApiRequestOutcome::kReplay:
        res.status = claim->stored.status;
        res.set_header("Idempotent-Replayed", "true");
        res.set_content(claim->stored.body, claim->stored.content_type);
        return;
      case ApiRequestOutcome::kNew:
        break;
    }
    handle();
    if (res.status >= 500) {
      // Not an answer to the request: a retry with the same key should try again.
      (void)store_->AbandonApiRequest(record.tenant, record.key);
      return;
    }
    record.status = res.status;
    record.content_type = res.get_header_value("Content-Type");
    record.body = res.body;
    record.done = true;
    if (auto stored = store_->FinishApiRequest(record); !stored.ok()) {
      Log(LogLevel::kWarning, "storing the response for Idempotency-Key: " + stored.ToString());
    }
  }

  void Routes() {
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    server_.Get("/readyz", [this](const httplib::Request& req, httplib::Response& res) {
      auto summary = store_->Summary();
      if (!summary.ok()) return Send(res, ProblemFromStatus(summary.status()), req.path);
      res.set_content("ready\n", "text/plain");
    });
    server_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      auto text = RenderMetrics(*store_, clock_->NowMillis());
      if (!text.ok()) return Send(res, ProblemFromStatus(text.status()), req.path);
      res.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/v1/openapi.json", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(OpenApiDocument()), "application/json");
    });
    server_.Get("/v1/instances", [this](const httplib::Request& req, httplib::Response& res) {
      ListInstances(req, res);
    });
    server_.Post("/v1/instances", [this](const httplib::Request& req, httplib::Response& res) {
      auto principal = Allow(req, res, Role::kOperator);
      if (!principal || !NeedEngine(req, res)) return;
      Idempotent(*principal, req, res, [&] { StartInstance(*principal, req, res); });
    });
    server_.Get(R"(/v1/instances/(.+))", [this](const httplib::Request& req,
                                                httplib::Response& res) {
      auto principal = Allow(req, res, Role::kViewer);
      if (!principal) return;
      auto tenant = TenantOf(*principal, req);
      const std::string key = req.matches[1];
      if (!tenant) return Send(res, BadRequest("an all-tenants token must name ?tenant="), req.path);
      auto instance = store_->FindInstance(*tenant, key);
      // Another tenant's instance and a missing one look the same.
      if (!instance.ok()) return Send(res, ProblemFromStatus(instance.status()), req.path);
      auto view = InstanceViewJson(*store_, *instance);
      if (!view.ok()) return Send(res, ProblemFromStatus(view.status()), req.path);
      res.set_content(*view, "application/json");
    });
    server_.Post(R"(/v1/instances/(.+)/(retry|confirm|compensate|skip|close))",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   auto principal = Allow(req, res, Role::kOperator);
                   if (!principal || !NeedEngine(req, res)) return;
                   Idempotent(*principal, req, res, [&] { Act(*principal, req, res); });
                 });
    server_.Get("/v1/alerts", [this](const httplib::Request& req, httplib::Response& res) {
      ListAlerts(req, res);
    });
    server_.Post(R"(/v1/alerts/(\d+)/acknowledge)", [this](const httplib::Request& req,
                                                         httplib::Response& res) {
      auto principal = Allow(req, res, Role::kOperator);
      if (!principal || !NeedEngine(req, res)) return;
      Idempotent(*principal, req, res, [&] { Acknowledge(*principal, req, res); });
    });
    server_.Post("/v1/events", [this](const httplib::Request& req, httplib::Response& res) {
      auto principal = Allow(req, res, Role::kOperator);
      if (!principal || !NeedEngine(req, res)) return;
      Idempotent(*principal, req, res, [&] { ReceiveEvents(*principal, req, res); });
    });
  }

  void ListInstances(const httplib::Request& req, httplib::Response& res) {
    auto principal = Allow(req, res, Role::kViewer);
    if (!principal) return;
    InstanceFilter filter;
    filter.tenant = TenantOf(*principal, req);
    auto param = [&](const char* name) { return req.get_param_value(name); };
    if (req.has_param("workflow")) filter.workflow = param("workflow");
    if (req.has_param("state")) {
      auto state = ParseInstanceState(param("state"));
      if (!state) {
        return Send(res, BadRequest("state '" + param("state") + "' is not an instance state"),
                    req.path);
      }
      filter.state = *state;
    }
    if (req.has_param("error_class")) {
      auto error_class = ParseErrorClass(param("error_class"));
      if (!error_class || *error_class == ErrorClass::kNone) {
        return Send(res, BadRequest("error_class must be transient, rejected or unknown"),
                    req.path);
      }
      filter.error_class = *error_class;
    }
    if (req.has_param("alert")) {
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
      if (!req.has_param(name)) continue;
      auto at = ParseRfc3339(param(name));
      if (!at) {
        return Send(res, BadRequest(std::string(name) + " must be an RFC 3339 time such as "
                                                       "2026-11-29T08:00:00Z"),
                    req.path);
      }
      *field = *at;
    }
    if (req.has_param("limit")) {
      const std::string text = param("limit");
      const int limit = std::atoi(text.c_str());
      if (limit < 1 || limit > 1000 || std::to_string(limit) != text) {
        return Send(res, BadRequest("limit must be a whole number from 1 to 1000"), req.path);
      }
      filter.limit = limit;
    }
    if (req.has_param("cursor")) {
      const std::string text = param("cursor");
      char* end = nullptr;
      const long long after = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || after < 0) {
        return Send(res, BadRequest("cursor is not one this server returned"), req.path);
      }
      filter.after_id = after;
    }
    const int page = filter.limit;
    filter.limit = page + 1;  // one more tells whether there is a next page
    auto instances = store_->ListInstances(filter);
    if (!instances.ok()) return Send(res, ProblemFromStatus(instances.status()), req.path);
    Json items = Json::array();
    Json next = nullptr;
    for (size_t i = 0; i < instances->size(); ++i) {
      if (static_cast<int>(i) == page) {
        next = std::to_string((*instances)[i - 1].id);
        break;
      }
      items.push_back(wire::InstanceSummary((*instances)[i]));
    }
    SendJson(res, 200, {{"items", items}, {"next_cursor", next}});
  }

  void StartInstance(const Principal& principal, const httplib::Request& req,
                     httplib::Response& res) {
    auto body = JsonBody(req, res, ParseStartBody);
    if (!body) return;
    const std::string& workflow = body->workflow;
    auto tenant = WriteTenant(principal, body->tenant, req, res);
    if (!tenant) return;
    auto definition = engine_->catalog().Current(workflow);
    if (definition == nullptr) {
      return Send(res, Unprocessable("unknown-workflow", "Unknown workflow",
                                     "no workflow '" + workflow + "' is registered on this server"),
                  req.path);
    }
    CrashPoint("api-start", workflow);
    StartRequest start;
    start.tenant = *tenant;
    start.input_json = body->input_json;
    auto started = engine_->StartInstance(*definition, start);
    if (!started.ok()) {
      if (absl::IsFailedPrecondition(started.status())) {
        return Send(res, {409, "urn:waystone:problem:business-key-conflict",
                          "The business key is held with other input or by another workflow",
                          std::string(started.status().message())},
                    req.path);
      }
      return Send(res, ProblemFromStatus(started.status()), req.path);
    }
    CrashPoint("api-started", workflow);
    const bool created = started->outcome == StartOutcome::kCreated;
    res.set_header("Location", "/v1/instances/" + started->instance.key);
    Json out = wire::InstanceSummary(started->instance);
    out["created"] = created;
    if (started->tombstone) {
      // Removed by gc: answered as existing, from what gc kept; nothing is started.
      out["collected"] = true;
      out["tombstone"] = wire::Tombstone(*started->tombstone);
    }
    SendJson(res, created ? 201 : 200, out);
  }

  void Act(const Principal& principal, const httplib::Request& req, httplib::Response& res) {
    const std::string key = req.matches[1];
    const std::string action_name = req.matches[2];
    auto body = JsonBody(req, res, ParseActionBody);
    if (!body) return;
    auto tenant = WriteTenant(principal, req.get_param_value("tenant"), req, res);
    if (!tenant) return;
    OperatorRequest request = *body;
    request.action = *ParseOperatorAction(action_name);
    request.actor = principal.token_name;
    const std::string dry = req.get_param_value("dry_run");
    if (!dry.empty() && dry != "true" && dry != "false") {
      return Send(res, BadRequest("dry_run must be true or false"), req.path);
    }
    request.dry_run = dry == "true";
    auto result = engine_->operations().Apply(*tenant, key, request);
    if (!result.ok()) return Send(res, ProblemFromStatus(result.status()), req.path);
    Json out = PlanJson(result->plan);
    out["action"] = action_name;
    out["dry_run"] = request.dry_run;
    out["applied"] = result->applied;
    out["instance"] = wire::InstanceSummary(result->instance);
    SendJson(res, 200, out);
  }

  void ListAlerts(const httplib::Request& req, httplib::Response& res) {
    auto principal = Allow(req, res, Role::kViewer);
    if (!principal) return;
    std::optional<AlertState> state;
    if (req.has_param("state")) {
      state = ParseAlertState(req.get_param_value("state"));
      if (!state) {
        return Send(res, BadRequest("state must be open, acknowledged or resolved"), req.path);
      }
    }
    auto alerts = store_->ListAlerts(0);
    if (!alerts.ok()) return Send(res, ProblemFromStatus(alerts.status()), req.path);
    auto tenant = TenantOf(*principal, req);
    std::map<int64_t, std::string> keys;
    Json items = Json::array();
    for (const auto& a : *alerts) {
      if (tenant && a.tenant != *tenant) continue;
      if (state && a.state != *state) continue;
      auto [it, fresh] = keys.try_emplace(a.instance_id);
      if (fresh) {
        auto instance = store_->GetInstance(a.instance_id);
        it->second = instance.ok() ? instance->key : "";
      }
      items.push_back(wire::Alert(a, it->second));
    }
    SendJson(res, 200, {{"items", items}});
  }

  void Acknowledge(const Principal& principal, const httplib::Request& req,
                   httplib::Response& res) {
    auto body = JsonBody(req, res, ParseReasonBody);
    if (!body) return;
    const std::string& reason = *body;
    const std::string dry = req.get_param_value("dry_run");
    const int64_t id = std::strtoll(std::string(req.matches[1]).c_str(), nullptr, 10);
    auto alert = engine_->operations().AcknowledgeAlert(principal.tenant, id,
                                                        principal.token_name, reason,
                                                        dry == "true");
    if (!alert.ok()) return Send(res, ProblemFromStatus(alert.status()), req.path);
    auto instance = store_->GetInstance(alert->instance_id);
    Json out = wire::Alert(*alert, instance.ok() ? instance->key : "");
    out["dry_run"] = dry == "true";
    if (dry == "true") out["state_after"] = "acknowledged";
    SendJson(res, 200, out);
  }

  // A routed event, checked before any is applied.
  struct Routed {
    IncomingEvent event;
    const EventRoute* route = nullptr;
    std::string tenant;
    std::shared_ptr<const WorkflowDefinition> definition;  // start
    std::string key;                                       // signal
  };

  void ReceiveEvents(const Principal& principal, const httplib::Request& req,
                     httplib::Response& res) {
    auto header = [&req](std::string_view name) -> std::optional<std::string> {
      const std::string n(name);
      if (!req.has_header(n)) return std::nullopt;
      return req.get_header_value(n);
    };
    auto events = ParseCloudEvents(req.get_header_value("Content-Type"), header, req.body);
    if (!events.ok()) return Send(res, ProblemFromStatus(events.status()), req.path);
    const bool batch = events->size() > 1 ||
                       req.get_header_value("Content-Type").starts_with(
                           "application/cloudevents-batch+json");
    std::vector<Routed> routed;
    for (size_t i = 0; i < events->size(); ++i) {
      IncomingEvent& event = (*events)[i];
      const std::string where = batch ? "event " + std::to_string(i) + ": " : "";
      auto found = routes_.find(event.type);
      if (found == routes_.end()) {
        return Send(res, Unprocessable("unrouted-event", "No route for this event type",
                                       where + "no route for event type '" + event.type + "'"),
                    req.path);
      }
      Routed r{event, &found->second, "", nullptr, ""};
      if (principal.tenant == "*") {
        if (event.tenant.empty()) {
          return Send(res, BadRequest(where + "missing attribute 'tenant' (an all-tenants "
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
      const Json data = Json::parse(event.data_json, nullptr, false);
      if (!r.route->start.empty()) {
        r.definition = engine_->catalog().Current(r.route->start);
        if (r.definition == nullptr) {
          return Send(res, Unprocessable("unknown-workflow", "Unknown workflow",
                                         where + "event type '" + event.type + "' starts '" +
                                             r.route->start + "', which is not registered"),
                      req.path);
        }
        if (!data.is_object()) {
          return Send(res, BadRequest(where + "data must be a JSON object: it is the input of '" +
                                      r.route->start + "'"),
                      req.path);
        }
      } else {
        const Json::json_pointer pointer(r.route->signal_key);
        if (!data.is_object() || !data.contains(pointer) || !data.at(pointer).is_string()) {
          return Send(res, BadRequest(where + "data has no string at " + r.route->signal_key +
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
        results.push_back({{"id", routed[j].event.id}, {"source", routed[j].event.source},
                           {"type", routed[j].event.type}, {"outcome", "not_processed"}});
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
        auto started = engine_->StartInstance(*r.definition, start);
        if (started.ok() && started->outcome == StartOutcome::kEventConflict) {
          conflict = InboxConflictMessage(r.event.source, r.event.id, started->stored_data_hash,
                                          EventDataHash(r.event.data_json));
        } else if (started.ok()) {
          result["instance"] = started->instance.key;
          result["outcome"] = StartOutcomeName(started->outcome);
          if (started->tombstone) result["tombstone"] = wire::Tombstone(*started->tombstone);
        } else {
          failed = started.status();
        }
      } else {
        Signal signal{r.tenant, r.key, r.event.type, r.event.source, r.event.id,
                      r.event.data_json, principal.token_name};
        auto delivered = engine_->operations().Deliver(signal);
        result["instance"] = r.key;
        if (delivered.ok() && delivered->outcome == SignalOutcome::kConflict) {
          conflict = InboxConflictMessage(r.event.source, r.event.id, delivered->stored_data_hash,
                                          delivered->data_hash);
        } else if (delivered.ok()) {
          result["outcome"] =
              delivered->outcome == SignalOutcome::kApplied ? "signalled" : "duplicate";
        } else {
          failed = delivered.status();
        }
      }
      if (!conflict.empty()) {
        // The same id with other data is never a duplicate: refused, with an alert.
        return stop_at(i, std::move(result), "conflict", conflict,
                       {409, "urn:waystone:problem:inbox-conflict",
                        "This event id was received before with other data",
                        (batch ? "event " + std::to_string(i) + ": " : "") + conflict});
      }
      if (!failed.ok()) {
        // A busy instance is worth redelivering.
        const absl::Status shown = absl::IsAborted(failed)
                                       ? absl::UnavailableError(failed.message())
                                       : failed;
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

  ApiServerOptions options_;
  Store* store_;
  const Clock* clock_;
  Engine* engine_;
  std::string owner_;  // names this server on its Idempotency-Key claims
  std::map<std::string, EventRoute> routes_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
};

ApiServer::ApiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ApiServer::~ApiServer() = default;

absl::StatusOr<std::unique_ptr<ApiServer>> ApiServer::Start(const ApiServerOptions& options,
                                                           Store* store, const Clock* clock,
                                                           Engine* engine) {
  auto impl = std::make_unique<Impl>(options, store, clock, engine);
  if (auto status = impl->Listen(); !status.ok()) return status;
  return std::unique_ptr<ApiServer>(new ApiServer(std::move(impl)));
}

int ApiServer::port() const { return impl_->port(); }

}  // namespace waystone
