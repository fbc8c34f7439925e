#include "sim/simulator.h"

#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "http/http_front.h"
#include "sim/faults.h"
#include "sim/lost_response.h"

namespace waystone {

using Json = nlohmann::json;

class Simulator::Impl {
 public:
  explicit Impl(const SimulatorOptions& options) : options_(options), random_(options.seed) {}

  absl::Status Listen() {
    const std::string& host = options_.host;
    HttpFrontOptions front;
    front.listen = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                   std::to_string(options_.port);
    front.max_body_bytes = 64 << 20;
    front.request_deadline_seconds = 5;
    front.max_connections = 100'000;
    front.handler_threads = options_.threads;  // delayed responses hold one each
    auto started = HttpFront::Start(
        front, [](ServerRequest&, ServerResponse&) { return false; },
        [this](const ServerRequest& req, ServerResponse& res) { Handle(req, res); });
    if (!started.ok()) {
      return absl::UnavailableError("simulator cannot listen on " + options_.host + ":" +
                                    std::to_string(options_.port));
    }
    front_ = std::move(*started);
    port_ = front_->port();
    return absl::OkStatus();
  }

  // Stops listening and joins the front's threads: no handler runs afterwards.
  void Stop() { front_.reset(); }

  int port() const { return port_; }

  absl::Status SetFaults(const std::string& text) {
    auto faults = ParseFaults(text, kRoutes);
    if (!faults.ok()) return faults.status();
    MutexLock lock(mu_);
    faults_ = std::move(*faults);
    return absl::OkStatus();
  }

  std::string StatsJson() {
    MutexLock lock(mu_);
    Json stats;
    int64_t open = 0, cancelled = 0;
    for (const auto& [id, order] : orders_) {
      (order["status"] == "cancelled" ? cancelled : open) += 1;
    }
    int64_t duplicate_orders = 0;
    for (const auto& [ref, ids] : orders_by_ref_)
      duplicate_orders += static_cast<int64_t>(ids.size()) - 1;
    stats["orders"] = orders_.size();
    stats["orders_open"] = open;
    stats["orders_cancelled"] = cancelled;
    stats["duplicate_orders"] = duplicate_orders;
    stats["cancel_requests"] = cancel_requests_;
    stats["shipments"] = CountValues(shipments_by_order_);
    stats["duplicate_shipments"] = Duplicates(shipments_by_order_);
    stats["line_messages"] = CountValues(line_by_content_);
    stats["duplicate_line_messages"] = Duplicates(line_by_content_);
    stats["emails"] = CountValues(email_by_content_);
    stats["duplicate_emails"] = Duplicates(email_by_content_);
    stats["crm_writebacks"] = writebacks_.size();
    stats["requests"] = requests_;
    Json keys = Json::object();
    for (const auto& [route, distinct] : keys_) keys[route] = distinct.size();
    stats["distinct_idempotency_keys"] = keys;
    stats["faults"] = faults_injected_;
    return stats.dump();
  }

 private:
  static inline const std::set<std::string> kRoutes = {
      "crm.get_customer", "crm.writeback",       "erp.create_order", "erp.find_orders",
      "erp.cancel_order", "erp.create_shipment", "line.push",        "email.send"};

  static int64_t CountValues(const std::map<std::string, int64_t>& m) {
    int64_t total = 0;
    for (const auto& [k, v] : m) total += v;
    return total;
  }
  static int64_t Duplicates(const std::map<std::string, int64_t>& m) {
    int64_t total = 0;
    for (const auto& [k, v] : m) total += v - 1;
    return total;
  }

  struct Drawn {
    FaultKind kind = FaultKind::kNone;
    int delay_ms = 0;
    int retry_after_s = 0;
    int fd = -1;  // the request's connection, for the shapes that take it over
  };

  // Counts the request and draws its fault; a reused-connection-only fault waits
  // for a request on a reused connection. Caller holds mu_.
  Drawn DrawLocked(const std::string& route, const ServerRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Drawn d;
    d.fd = req.socket_fd;
    requests_[route] = requests_.value(route, 0) + 1;
    const std::string key = KeyOf(req);
    if (!key.empty()) keys_[route].insert(key);
    auto it = faults_.find(route);
    if (it == faults_.end()) return d;
    d.kind = DrawFault(it->second, random_, req.earlier_requests > 0);
    d.delay_ms = it->second.delay_ms;
    d.retry_after_s = it->second.retry_after_s;
    if (d.kind != FaultKind::kNone) {
      Json& counts = faults_injected_[route];
      if (!counts.is_object()) counts = Json::object();
      const std::string name(FaultName(d.kind));
      counts[name] = counts.value(name, 0) + 1;
    }
    return d;
  }

  // The simulated systems' own error bodies: {"error": message}.
  static void Error(ServerResponse& res, int status, const std::string& message) {
    res.status = status;
    res.SetContent(Json{{"error", message}}.dump(), "application/json");
  }

  // Answers a fault that acts before anything is committed; returns true if it did.
  static bool RefuseBeforeCommit(const Drawn& d, ServerResponse& res) {
    switch (d.kind) {
      case FaultKind::kUnavailable:
        Error(res, 503, "unavailable");
        res.SetHeader("Retry-After", std::to_string(d.retry_after_s));
        return true;
      case FaultKind::kRateLimit:
        Error(res, 429, "rate limited");
        res.SetHeader("Retry-After", std::to_string(d.retry_after_s));
        return true;
      case FaultKind::kFail:
        Error(res, 503, "backend failure");
        return true;
      case FaultKind::kError:
        Error(res, 500, "internal error");
        return true;
      default:
        return false;
    }
  }

  // Sends `body` after the committed effect, honouring the faults that act after it.
  void Respond(const Drawn& d, ServerResponse& res, int status, const std::string& body) {
    res.status = status;
    if (d.kind == FaultKind::kDelay) {
      options_.clock->SleepFor(d.delay_ms, {});
    }
    if (auto loss = LossOf(d.kind); loss && d.fd >= 0 && LoseResponse(d.fd, *loss)) {
      // The connection is gone; what the front writes now goes nowhere.
      res.SetContent(body, "application/json");
      return;
    }
    if (auto after = StatusAfterCommit(d.kind)) {
      // Committed, then the server (or a gateway in front of it) answers an error.
      Error(res, *after, "failed after commit");
      return;
    }
    // Headers go out, then the connection closes before the body: the client
    // sent its request, the effect is committed, the response is lost.
    if (d.kind == FaultKind::kDropResponse && d.fd >= 0 &&
        CutBody(d.fd, status, body.size() + 64)) {
      return;
    }
    res.SetContent(body, "application/json");
  }

  static Json ParseJson(const ServerRequest& req, ServerResponse& res, bool* ok) {
    Json body = Json::parse(req.body, nullptr, false);
    *ok = !body.is_discarded() && body.is_object();
    if (!*ok) Error(res, 400, "body must be a JSON object");
    return body;
  }

  static std::string KeyOf(const ServerRequest& req) {
    if (const std::string* key = req.Header("idempotency-key")) return *key;
    if (const std::string* key = req.Header("x-line-retry-key")) return *key;
    return "";
  }

  // Replays the stored answer for an idempotency key. Caller holds mu_.
  bool Replay(std::map<std::string, Json>& seen, const std::string& key, const Drawn& d,
              ServerResponse& res) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (key.empty()) return false;
    auto it = seen.find(key);
    if (it == seen.end()) return false;
    Respond(d, res, 200, it->second.dump());
    return true;
  }

  // A create that deduplicates on the request's key (KeyOf): a key seen before gets
  // the stored answer again; otherwise `create` commits and makes the answer.
  void KeyedCreate(const ServerRequest& req, ServerResponse& res, const std::string& route,
                   std::map<std::string, Json>& by_key, int status,
                   const std::function<Json()>& create) {
    const std::string key = KeyOf(req);
    Drawn d;
    Json made;
    {
      MutexLock lock(mu_);
      d = DrawLocked(route, req);
      if (RefuseBeforeCommit(d, res)) return;
      if (Replay(by_key, key, d, res)) return;
      made = create();
      if (!key.empty()) by_key[key] = made;
    }
    Respond(d, res, status, made.dump());
  }

  void Handle(const ServerRequest& req, ServerResponse& res) {
    static const std::regex kCustomer(R"(/crm/customers/([^/]+))");
    static const std::regex kWriteback(R"(/crm/customers/([^/]+)/orders/([^/]+))");
    static const std::regex kCancel(R"(/erp/orders/([^/]+)/cancel)");
    const std::string method = req.method == "HEAD" ? "GET" : req.method;  // body dropped
    const std::string& path = req.path;
    std::smatch m;
    if (method == "GET" && std::regex_match(path, m, kCustomer)) return GetCustomer(req, res, m[1]);
    if (method == "PUT" && std::regex_match(path, m, kWriteback)) {
      return Writeback(req, res, std::string(m[1]) + "/" + std::string(m[2]));
    }
    if (method == "POST" && path == "/erp/orders") return CreateOrder(req, res);
    if (method == "GET" && path == "/erp/orders") return FindOrders(req, res);
    if (method == "POST" && std::regex_match(path, m, kCancel)) return CancelOrder(req, res, m[1]);
    if (method == "POST" && path == "/erp/shipments") return CreateShipment(req, res);
    // The Messaging API's own path too, where a `notify` step's LINE channel sends.
    if (method == "POST" && (path == "/line/push" || path == "/v2/bot/message/push")) {
      return PushLine(req, res);
    }
    if (method == "POST" && path == "/email/messages") return SendEmail(req, res);
    if (method == "GET" && path == "/_sim/stats") {
      return res.SetContent(StatsJson(), "application/json");
    }
    if (method == "POST" && path == "/_sim/faults") {
      auto status = SetFaults(req.body);
      if (!status.ok()) return Error(res, 400, std::string(status.message()));
      return res.SetContent(R"({"status":"ok"})", "application/json");
    }
    res.status = 404;
  }

  void GetCustomer(const ServerRequest& req, ServerResponse& res, const std::string& id) {
    Drawn d;
    {
      MutexLock lock(mu_);
      d = DrawLocked("crm.get_customer", req);
    }
    if (RefuseBeforeCommit(d, res)) return;
    if (id.starts_with("missing")) return Error(res, 404, "no such customer");
    Json customer = {{"id", id},
                     {"name", "Customer " + id},
                     {"email", id + "@example.test"},
                     {"line_user_id", std::string("U").append(
                                          std::to_string(std::hash<std::string>{}(id) % 1000000))},
                     {"address_ok", !id.starts_with("C-BLOCKED")}};
    Respond(d, res, 200, customer.dump());
  }

  void Writeback(const ServerRequest& req, ServerResponse& res, const std::string& link) {
    bool ok = false;
    Json body = ParseJson(req, res, &ok);
    if (!ok) return;
    Drawn d;
    {
      MutexLock lock(mu_);
      d = DrawLocked("crm.writeback", req);
      if (RefuseBeforeCommit(d, res)) return;
      writebacks_[link] = body;
    }
    Respond(d, res, 200, Json{{"status", "linked"}}.dump());
  }

  void CreateOrder(const ServerRequest& req, ServerResponse& res) {
    bool ok = false;
    Json body = ParseJson(req, res, &ok);
    if (!ok) return;
    const std::string ref = body.value("ref", "");
    if (ref.empty()) return Error(res, 422, "ref is required");
    if (body.contains("amount") && body["amount"].is_number() &&
        body["amount"].get<double>() <= 0) {
      return Error(res, 422, "amount must be positive");
    }
    Drawn d;
    Json order;
    {
      MutexLock lock(mu_);
      d = DrawLocked("erp.create_order", req);
      if (RefuseBeforeCommit(d, res)) return;
      // This ERP does not deduplicate: a second POST creates a second order.
      const std::string id = "SO-" + std::to_string(100000 + ++order_seq_);
      order = {{"id", id},
               {"ref", ref},
               {"customer", body.value("customer", "")},
               {"amount", body.value("amount", Json(0))},
               {"status", "open"}};
      orders_[id] = order;
      orders_by_ref_[ref].push_back(id);
    }
    Respond(d, res, 201, order.dump());
  }

  void FindOrders(const ServerRequest& req, ServerResponse& res) {
    Drawn d;
    Json items = Json::array();
    {
      MutexLock lock(mu_);
      d = DrawLocked("erp.find_orders", req);
      if (RefuseBeforeCommit(d, res)) return;
      const std::string* ref = req.Query("ref");
      auto it = orders_by_ref_.find(ref != nullptr ? *ref : "");
      if (it != orders_by_ref_.end()) {
        for (const auto& id : it->second) items.push_back(orders_[id]);
      }
    }
    Respond(d, res, 200, Json{{"items", items}}.dump());
  }

  void CancelOrder(const ServerRequest& req, ServerResponse& res, const std::string& id) {
    Drawn d;
    Json order;
    {
      MutexLock lock(mu_);
      d = DrawLocked("erp.cancel_order", req);
      if (RefuseBeforeCommit(d, res)) return;
      ++cancel_requests_;
      auto it = orders_.find(id);
      if (it == orders_.end()) return Error(res, 404, "no such order");
      // Deterministic failing cancel: orders of customers marked STUCK.
      if (it->second.value("customer", "").find("STUCK") != std::string::npos) {
        return Error(res, 503, "cancellation service down for this account");
      }
      it->second["status"] = "cancelled";  // cancelling twice is harmless
      order = it->second;
    }
    Respond(d, res, 200, order.dump());
  }

  void CreateShipment(const ServerRequest& req, ServerResponse& res) {
    bool ok = false;
    Json body = ParseJson(req, res, &ok);
    if (!ok) return;
    if (body.value("address_ok", true) == false) {
      return Error(res, 422, "delivery address incomplete");
    }
    KeyedCreate(req, res, "erp.create_shipment", shipments_by_key_, 201, [&] {
      const std::string order_id = body.value("order_id", "");
      shipments_by_order_[order_id] += 1;
      return Json{{"id", "SH-" + std::to_string(500000 + ++shipment_seq_)}, {"order_id", order_id}};
    });
  }

  void PushLine(const ServerRequest& req, ServerResponse& res) {
    bool ok = false;
    Json body = ParseJson(req, res, &ok);
    if (!ok) return;
    KeyedCreate(req, res, "line.push", line_by_key_, 200, [&] {
      line_by_content_[body.value("to", "") + "|" + body["messages"].dump()] += 1;
      return Json{{"sentMessages", Json::array({{{"id", std::to_string(700000 + ++line_seq_)}}})}};
    });
  }

  void SendEmail(const ServerRequest& req, ServerResponse& res) {
    bool ok = false;
    Json body = ParseJson(req, res, &ok);
    if (!ok) return;
    KeyedCreate(req, res, "email.send", email_by_key_, 202, [&] {
      email_by_content_[body.value("to", "") + "|" + body.value("subject", "")] += 1;
      return Json{
          {"message_id",
           std::string("<").append(std::to_string(900000 + ++email_seq_)).append("@sim.test>")}};
    });
  }

  SimulatorOptions options_;
  int port_ = -1;

  Mutex mu_;
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Fault> faults_ ABSL_GUARDED_BY(mu_);
  Json requests_ ABSL_GUARDED_BY(mu_) = Json::object();
  Json faults_injected_ ABSL_GUARDED_BY(mu_) = Json::object();
  int64_t order_seq_ = 0, shipment_seq_ = 0, line_seq_ = 0, email_seq_ = 0;
  std::map<std::string, Json> orders_;  // by order id
  std::map<std::string, std::vector<std::string>> orders_by_ref_;
  int64_t cancel_requests_ = 0;
  std::map<std::string, int64_t> shipments_by_order_;
  std::map<std::string, Json> shipments_by_key_;
  std::map<std::string, int64_t> line_by_content_;
  std::map<std::string, Json> line_by_key_;
  std::map<std::string, int64_t> email_by_content_;
  std::map<std::string, Json> email_by_key_;
  std::map<std::string, Json> writebacks_;
  std::map<std::string, std::set<std::string>> keys_;  // route -> Idempotency-Keys seen
  // Last: destroyed (or reset by Stop) first, so no handler runs once the rest is gone.
  std::unique_ptr<HttpFront> front_;
};

Simulator::Simulator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Simulator::~Simulator() { Stop(); }

absl::StatusOr<std::unique_ptr<Simulator>> Simulator::Start(const SimulatorOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  if (auto status = impl->SetFaults(options.faults_json); !status.ok()) return status;
  if (auto status = impl->Listen(); !status.ok()) return status;
  return std::unique_ptr<Simulator>(new Simulator(std::move(impl)));
}

int Simulator::port() const { return impl_->port(); }
std::string Simulator::base_url() const {
  return "http://127.0.0.1:" + std::to_string(impl_->port());
}
absl::Status Simulator::SetFaults(const std::string& faults_json) {
  return impl_->SetFaults(faults_json);
}
std::string Simulator::StatsJson() const { return impl_->StatsJson(); }
void Simulator::Stop() {
  if (impl_) impl_->Stop();
}

}  // namespace waystone
