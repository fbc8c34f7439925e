#include "sim/simulator.h"

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "sim/lost_response.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

enum class FaultKind {
  kNone, kDropResponse, kDelay, kUnavailable, kRateLimit, kFail, kError,
  // After the commit, as real servers and proxies lose answers (lost_response.h):
  kCloseBeforeBytes, kCloseBeforeBytesReused, kReset, kPartialStatus, kPartialHeaders,
  kStatus500, kStatus502, kStatus504,
};

// The shapes that take the connection away from the HTTP library, and how.
std::optional<LostResponse> LossOf(FaultKind kind) {
  switch (kind) {
    case FaultKind::kCloseBeforeBytes:
    case FaultKind::kCloseBeforeBytesReused: return LostResponse::kCloseBeforeBytes;
    case FaultKind::kReset: return LostResponse::kReset;
    case FaultKind::kPartialStatus: return LostResponse::kPartialStatus;
    case FaultKind::kPartialHeaders: return LostResponse::kPartialHeaders;
    case FaultKind::kNone:
    case FaultKind::kDropResponse:
    case FaultKind::kDelay:
    case FaultKind::kUnavailable:
    case FaultKind::kRateLimit:
    case FaultKind::kFail:
    case FaultKind::kError:
    case FaultKind::kStatus500:
    case FaultKind::kStatus502:
    case FaultKind::kStatus504:
      return std::nullopt;
  }
  return std::nullopt;
}

// The shapes that answer an error after the commit, with their status.
std::optional<int> StatusAfterCommit(FaultKind kind) {
  if (kind == FaultKind::kStatus500) return 500;
  if (kind == FaultKind::kStatus502) return 502;
  if (kind == FaultKind::kStatus504) return 504;
  return std::nullopt;
}

constexpr FaultKind kAllFaults[] = {
    FaultKind::kDropResponse, FaultKind::kDelay, FaultKind::kUnavailable, FaultKind::kRateLimit,
    FaultKind::kFail, FaultKind::kError, FaultKind::kCloseBeforeBytes,
    FaultKind::kCloseBeforeBytesReused, FaultKind::kReset, FaultKind::kPartialStatus,
    FaultKind::kPartialHeaders, FaultKind::kStatus500, FaultKind::kStatus502,
    FaultKind::kStatus504, FaultKind::kNone};

std::string_view FaultName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kNone: return "none";
    case FaultKind::kDropResponse: return "drop_response";
    case FaultKind::kDelay: return "delay";
    case FaultKind::kUnavailable: return "unavailable";
    case FaultKind::kRateLimit: return "rate_limit";
    case FaultKind::kFail: return "fail";
    case FaultKind::kError: return "error";
    case FaultKind::kCloseBeforeBytes: return "close_before_bytes";
    case FaultKind::kCloseBeforeBytesReused: return "close_before_bytes_reused";
    case FaultKind::kReset: return "reset";
    case FaultKind::kPartialStatus: return "partial_status";
    case FaultKind::kPartialHeaders: return "partial_headers";
    case FaultKind::kStatus500: return "status_500";
    case FaultKind::kStatus502: return "status_502";
    case FaultKind::kStatus504: return "status_504";
  }
  return "none";
}

// Knobs for one route. Probabilities are checked in the order of the fields;
// `next` forces the given faults on the next requests, one each, first.
struct Fault {
  double drop_response = 0;  // commit, then close the connection without a full response
  double delay = 0;          // commit, then answer after delay_ms (past the client's timeout)
  double unavailable = 0;    // 503 with Retry-After, nothing committed
  double rate_limit = 0;     // 429 with Retry-After, nothing committed
  double fail = 0;           // 503 without Retry-After, nothing committed
  double error = 0;          // 500, nothing committed (the caller cannot know that)
  int delay_ms = 3000;
  int retry_after_s = 1;
  std::deque<FaultKind> next;
  // Probabilities of the lost-response shapes, by kind (knobs named as the shapes).
  std::map<FaultKind, double> shapes;
};

}  // namespace

class Simulator::Impl {
 public:
  explicit Impl(const SimulatorOptions& options) : options_(options), random_(options.seed) {}

  absl::Status Listen() {
    const int threads = options_.threads;
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server_.set_keep_alive_max_count(1000);
    server_.set_read_timeout(5, 0);
    server_.set_keep_alive_timeout(1);
    server_.set_tcp_nodelay(true);  // no Nagle/delayed-ACK stall between headers and body
    Routes();
    if (options_.port == 0) {
      port_ = server_.bind_to_any_port(options_.host);
    } else {
      port_ = server_.bind_to_port(options_.host, options_.port) ? options_.port : -1;
    }
    if (port_ <= 0) {
      return absl::UnavailableError("simulator cannot listen on " + options_.host + ":" +
                                    std::to_string(options_.port));
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // The socket is already listening; connections queue until the loop accepts.
    while (!server_.is_running()) options_.clock->SleepFor(1, {});
    return absl::OkStatus();
  }

  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const { return port_; }

  absl::Status SetFaults(const std::string& text) {
    Json doc = Json::parse(text.empty() ? "{}" : text, nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) {
      return absl::InvalidArgumentError("faults must be a JSON object of route -> knobs");
    }
    std::map<std::string, Fault> faults;
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (!kRoutes.contains(it.key())) {
        return absl::InvalidArgumentError("unknown simulator route '" + it.key() + "'");
      }
      if (!it->is_object()) {
        return absl::InvalidArgumentError("faults for '" + it.key() + "' must be an object");
      }
      Fault fault;
      for (auto knob = it->begin(); knob != it->end(); ++knob) {
        const std::string& name = knob.key();
        if (name == "next") {
          if (!knob->is_array()) return absl::InvalidArgumentError("'next' must be a list");
          for (const auto& kind : *knob) {
            const std::string k = kind.is_string() ? kind.get<std::string>() : "";
            FaultKind parsed = FaultKind::kNone;
            for (FaultKind f : kAllFaults) {
              if (FaultName(f) == k) parsed = f;
            }
            if (FaultName(parsed) != k) {
              return absl::InvalidArgumentError("unknown fault '" + k + "' in " + it.key());
            }
            fault.next.push_back(parsed);
          }
          continue;
        }
        if (!knob->is_number()) {
          return absl::InvalidArgumentError(it.key() + "." + name + " must be a number");
        }
        const double value = knob->get<double>();
        if (name == "drop_response") fault.drop_response = value;
        else if (name == "delay") fault.delay = value;
        else if (name == "unavailable") fault.unavailable = value;
        else if (name == "rate_limit") fault.rate_limit = value;
        else if (name == "fail") fault.fail = value;
        else if (name == "error") fault.error = value;
        else if (name == "delay_ms") fault.delay_ms = static_cast<int>(value);
        else if (name == "retry_after_s") fault.retry_after_s = static_cast<int>(value);
        else {
          bool shape = false;
          for (FaultKind f : kAllFaults) {
            if ((LossOf(f) || StatusAfterCommit(f)) && FaultName(f) == name) {
              fault.shapes[f] = value;
              shape = true;
            }
          }
          if (!shape) return absl::InvalidArgumentError("unknown knob '" + name + "' for " + it.key());
        }
      }
      faults[it.key()] = std::move(fault);
    }
    bool takes_connections = false;
    for (const auto& [route, fault] : faults) {
      for (FaultKind kind : fault.next) takes_connections = takes_connections || LossOf(kind);
      for (const auto& [kind, p] : fault.shapes) {
        takes_connections = takes_connections || (LossOf(kind) && p > 0);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    faults_ = std::move(faults);
    takes_connections_ = takes_connections;
    return absl::OkStatus();
  }

  std::string StatsJson() {
    std::lock_guard<std::mutex> lock(mu_);
    Json stats;
    int64_t open = 0, cancelled = 0;
    for (const auto& [id, order] : orders_) {
      (order["status"] == "cancelled" ? cancelled : open) += 1;
    }
    int64_t duplicate_orders = 0;
    for (const auto& [ref, ids] : orders_by_ref_) duplicate_orders += static_cast<int64_t>(ids.size()) - 1;
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
      "crm.get_customer", "crm.writeback",   "erp.create_order", "erp.find_orders",
      "erp.cancel_order", "erp.create_shipment", "line.push",    "email.send"};

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

  // Counts the request and draws its fault; a reused-connection-only fault waits
  // for a request on a reused connection. Caller holds mu_.
  FaultKind Draw(const std::string& route, const std::string& key, bool reused_connection) {
    requests_[route] = requests_.value(route, 0) + 1;
    if (!key.empty()) keys_[route].insert(key);
    auto it = faults_.find(route);
    if (it == faults_.end()) return FaultKind::kNone;
    Fault& fault = it->second;
    FaultKind kind = FaultKind::kNone;
    if (!fault.next.empty()) {
      if (fault.next.front() == FaultKind::kCloseBeforeBytesReused && !reused_connection) {
        return FaultKind::kNone;
      }
      kind = fault.next.front();
      fault.next.pop_front();
    } else {
      std::uniform_real_distribution<double> roll(0.0, 1.0);
      const std::pair<double, FaultKind> table[] = {
          {fault.drop_response, FaultKind::kDropResponse},
          {fault.delay, FaultKind::kDelay},
          {fault.unavailable, FaultKind::kUnavailable},
          {fault.rate_limit, FaultKind::kRateLimit},
          {fault.fail, FaultKind::kFail},
          {fault.error, FaultKind::kError}};
      for (const auto& [p, k] : table) {
        if (p > 0 && roll(random_) < p) {
          kind = k;
          break;
        }
      }
      for (const auto& [k, p] : fault.shapes) {
        if (kind != FaultKind::kNone) break;
        if (k == FaultKind::kCloseBeforeBytesReused && !reused_connection) continue;
        if (p > 0 && roll(random_) < p) kind = k;
      }
    }
    if (kind != FaultKind::kNone) {
      Json& counts = faults_injected_[route];
      if (!counts.is_object()) counts = Json::object();
      const std::string name(FaultName(kind));
      counts[name] = counts.value(name, 0) + 1;
    }
    return kind;
  }

  struct Drawn {
    FaultKind kind = FaultKind::kNone;
    int delay_ms = 0;
    int retry_after_s = 0;
    int fd = -1;  // the request's connection, for the shapes that take it over
  };

  Drawn DrawLocked(const std::string& route, const httplib::Request& req) {
    Drawn d;
    // Which connection the request came on, and whether it came on it before: only
    // while some route has a shape that takes its connection (the lookup reads
    // /proc/self/fd; connections are counted from then on).
    int64_t seen = 0;
    if (takes_connections_) {
      d.fd = FindConnectionSocket(req.remote_addr, req.remote_port, req.local_port);
      const uint64_t connection = ConnectionId(d.fd);
      if (requests_on_connection_.size() > 100'000) requests_on_connection_.clear();
      seen = connection == 0 ? 0 : requests_on_connection_[connection]++;
    }
    d.kind = Draw(route, KeyOf(req), seen > 0);
    auto it = faults_.find(route);
    if (it != faults_.end()) {
      d.delay_ms = it->second.delay_ms;
      d.retry_after_s = it->second.retry_after_s;
    }
    return d;
  }

  // Answers a fault that acts before anything is committed; returns true if it did.
  static bool RefuseBeforeCommit(const Drawn& d, httplib::Response& res) {
    switch (d.kind) {
      case FaultKind::kUnavailable:
        res.status = 503;
        res.set_header("Retry-After", std::to_string(d.retry_after_s));
        res.set_content(R"({"error":"unavailable"})", "application/json");
        return true;
      case FaultKind::kRateLimit:
        res.status = 429;
        res.set_header("Retry-After", std::to_string(d.retry_after_s));
        res.set_content(R"({"error":"rate limited"})", "application/json");
        return true;
      case FaultKind::kFail:
        res.status = 503;
        res.set_content(R"({"error":"backend failure"})", "application/json");
        return true;
      case FaultKind::kError:
        res.status = 500;
        res.set_content(R"({"error":"internal error"})", "application/json");
        return true;
      case FaultKind::kNone:
      case FaultKind::kDropResponse:
      case FaultKind::kDelay:
      case FaultKind::kCloseBeforeBytes:
      case FaultKind::kCloseBeforeBytesReused:
      case FaultKind::kReset:
      case FaultKind::kPartialStatus:
      case FaultKind::kPartialHeaders:
      case FaultKind::kStatus500:
      case FaultKind::kStatus502:
      case FaultKind::kStatus504:
        return false;
    }
    return false;
  }

  // Sends `body` after the committed effect, honouring drop/delay faults.
  void Respond(const Drawn& d, httplib::Response& res, int status, const std::string& body) {
    res.status = status;
    if (d.kind == FaultKind::kDelay) {
      options_.clock->SleepFor(d.delay_ms, {});
    }
    if (auto loss = LossOf(d.kind); loss && d.fd >= 0 && LoseResponse(d.fd, *loss)) {
      // The connection is gone; what the library writes now goes nowhere.
      res.set_content(body, "application/json");
      return;
    }
    if (auto status = StatusAfterCommit(d.kind)) {
      // Committed, then the server (or a gateway in front of it) answers an error.
      res.status = *status;
      res.set_content(R"({"error":"failed after commit"})", "application/json");
      return;
    }
    if (d.kind == FaultKind::kDropResponse) {
      // Headers go out, then the connection closes before the body: the client
      // sent its request, the effect is committed, the response is lost.
      res.set_content_provider(
          body.size() + 64, "application/json",
          [](size_t, size_t, httplib::DataSink&) { return false; });
      return;
    }
    res.set_content(body, "application/json");
  }

  static Json ParseJson(const httplib::Request& req, httplib::Response& res, bool* ok) {
    Json body = Json::parse(req.body, nullptr, false);
    *ok = !body.is_discarded() && body.is_object();
    if (!*ok) {
      res.status = 400;
      res.set_content(R"({"error":"body must be a JSON object"})", "application/json");
    }
    return body;
  }

  static std::string KeyOf(const httplib::Request& req) {
    if (req.has_header("Idempotency-Key")) return req.get_header_value("Idempotency-Key");
    if (req.has_header("X-Line-Retry-Key")) return req.get_header_value("X-Line-Retry-Key");
    return "";
  }

  // Replays the stored answer for an idempotency key. Caller holds mu_.
  bool Replay(std::map<std::string, Json>& seen, const std::string& key, const Drawn& d,
              httplib::Response& res) {
    if (key.empty()) return false;
    auto it = seen.find(key);
    if (it == seen.end()) return false;
    Respond(d, res, 200, it->second.dump());
    return true;
  }

  void Routes() {
    server_.Get(R"(/crm/customers/([^/]+))", [this](const httplib::Request& req,
                                                    httplib::Response& res) {
      Drawn d;
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("crm.get_customer", req);
      }
      if (RefuseBeforeCommit(d, res)) return;
      const std::string id = req.matches[1];
      if (id.starts_with("missing")) {
        res.status = 404;
        res.set_content(R"({"error":"no such customer"})", "application/json");
        return;
      }
      Json customer = {{"id", id},
                       {"name", "Customer " + id},
                       {"email", id + "@example.test"},
                       {"line_user_id", std::string("U").append(std::to_string(std::hash<std::string>{}(id) % 1000000))},
                       {"address_ok", !id.starts_with("C-BLOCKED")}};
      Respond(d, res, 200, customer.dump());
    });

    server_.Put(R"(/crm/customers/([^/]+)/orders/([^/]+))", [this](const httplib::Request& req,
                                                                   httplib::Response& res) {
      bool ok = false;
      Json body = ParseJson(req, res, &ok);
      if (!ok) return;
      Drawn d;
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("crm.writeback", req);
        if (RefuseBeforeCommit(d, res)) return;
        writebacks_[std::string(req.matches[1]) + "/" + std::string(req.matches[2])] = body;
      }
      Respond(d, res, 200, Json{{"status", "linked"}}.dump());
    });

    server_.Post("/erp/orders", [this](const httplib::Request& req, httplib::Response& res) {
      bool ok = false;
      Json body = ParseJson(req, res, &ok);
      if (!ok) return;
      const std::string ref = body.value("ref", "");
      if (ref.empty()) {
        res.status = 422;
        res.set_content(R"({"error":"ref is required"})", "application/json");
        return;
      }
      if (body.contains("amount") && body["amount"].is_number() && body["amount"].get<double>() <= 0) {
        res.status = 422;
        res.set_content(R"({"error":"amount must be positive"})", "application/json");
        return;
      }
      Drawn d;
      Json order;
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("erp.create_order", req);
        if (RefuseBeforeCommit(d, res)) return;
        // This ERP does not deduplicate: a second POST creates a second order.
        const std::string id = "SO-" + std::to_string(100000 + ++order_seq_);
        order = {{"id", id}, {"ref", ref}, {"customer", body.value("customer", "")},
                 {"amount", body.value("amount", Json(0))}, {"status", "open"}};
        orders_[id] = order;
        orders_by_ref_[ref].push_back(id);
      }
      Respond(d, res, 201, order.dump());
    });

    server_.Get("/erp/orders", [this](const httplib::Request& req, httplib::Response& res) {
      Drawn d;
      Json items = Json::array();
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("erp.find_orders", req);
        if (RefuseBeforeCommit(d, res)) return;
        const std::string ref = req.get_param_value("ref");
        auto it = orders_by_ref_.find(ref);
        if (it != orders_by_ref_.end()) {
          for (const auto& id : it->second) items.push_back(orders_[id]);
        }
      }
      Respond(d, res, 200, Json{{"items", items}}.dump());
    });

    server_.Post(R"(/erp/orders/([^/]+)/cancel)", [this](const httplib::Request& req,
                                                         httplib::Response& res) {
      Drawn d;
      Json order;
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("erp.cancel_order", req);
        if (RefuseBeforeCommit(d, res)) return;
        ++cancel_requests_;
        auto it = orders_.find(req.matches[1]);
        if (it == orders_.end()) {
          res.status = 404;
          res.set_content(R"({"error":"no such order"})", "application/json");
          return;
        }
        // Deterministic failing cancel: orders of customers marked STUCK.
        if (it->second.value("customer", "").find("STUCK") != std::string::npos) {
          res.status = 503;
          res.set_content(R"({"error":"cancellation service down for this account"})",
                          "application/json");
          return;
        }
        it->second["status"] = "cancelled";  // cancelling twice is harmless
        order = it->second;
      }
      Respond(d, res, 200, order.dump());
    });

    server_.Post("/erp/shipments", [this](const httplib::Request& req, httplib::Response& res) {
      bool ok = false;
      Json body = ParseJson(req, res, &ok);
      if (!ok) return;
      if (body.value("address_ok", true) == false) {
        res.status = 422;
        res.set_content(R"({"error":"delivery address incomplete"})", "application/json");
        return;
      }
      const std::string key = KeyOf(req);
      Drawn d;
      Json shipment;
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("erp.create_shipment", req);
        if (RefuseBeforeCommit(d, res)) return;
        if (Replay(shipments_by_key_, key, d, res)) return;
        const std::string order_id = body.value("order_id", "");
        shipment = {{"id", "SH-" + std::to_string(500000 + ++shipment_seq_)},
                    {"order_id", order_id}};
        shipments_by_order_[order_id] += 1;
        if (!key.empty()) shipments_by_key_[key] = shipment;
      }
      Respond(d, res, 201, shipment.dump());
    });

    server_.Post("/line/push", [this](const httplib::Request& req, httplib::Response& res) {
      bool ok = false;
      Json body = ParseJson(req, res, &ok);
      if (!ok) return;
      const std::string key = KeyOf(req);
      Drawn d;
      Json sent;
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("line.push", req);
        if (RefuseBeforeCommit(d, res)) return;
        if (Replay(line_by_key_, key, d, res)) return;
        line_by_content_[body.value("to", "") + "|" + body["messages"].dump()] += 1;
        sent = {{"sentMessages", Json::array({{{"id", std::to_string(700000 + ++line_seq_)}}})}};
        if (!key.empty()) line_by_key_[key] = sent;
      }
      Respond(d, res, 200, sent.dump());
    });

    server_.Post("/email/messages", [this](const httplib::Request& req, httplib::Response& res) {
      bool ok = false;
      Json body = ParseJson(req, res, &ok);
      if (!ok) return;
      const std::string key = KeyOf(req);
      Drawn d;
      Json sent;
      {
        std::lock_guard<std::mutex> lock(mu_);
        d = DrawLocked("email.send", req);
        if (RefuseBeforeCommit(d, res)) return;
        if (Replay(email_by_key_, key, d, res)) return;
        email_by_content_[body.value("to", "") + "|" + body.value("subject", "")] += 1;
        sent = {{"message_id", std::string("<").append(std::to_string(900000 + ++email_seq_)).append("@sim.test>")}};
        if (!key.empty()) email_by_key_[key] = sent;
      }
      Respond(d, res, 202, sent.dump());
    });

    server_.Get("/_sim/stats", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(StatsJson(), "application/json");
    });
    server_.Post("/_sim/faults", [this](const httplib::Request& req, httplib::Response& res) {
      auto status = SetFaults(req.body);
      if (!status.ok()) {
        res.status = 400;
        res.set_content(Json{{"error", std::string(status.message())}}.dump(), "application/json");
        return;
      }
      res.set_content(R"({"status":"ok"})", "application/json");
    });
  }

  SimulatorOptions options_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;

  std::mutex mu_;
  std::mt19937_64 random_;                                   // guarded by mu_
  std::map<std::string, Fault> faults_;                      // guarded by mu_
  Json requests_ = Json::object();                           // guarded by mu_
  Json faults_injected_ = Json::object();                    // guarded by mu_
  int64_t order_seq_ = 0, shipment_seq_ = 0, line_seq_ = 0, email_seq_ = 0;
  std::map<std::string, Json> orders_;                       // by order id
  std::map<uint64_t, int64_t> requests_on_connection_;  // by connection id, guarded by mu_
  bool takes_connections_ = false;  // a configured shape takes a connection; guarded by mu_
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
