#include "verify/generic_target.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "connectors/http/http_client.h"
#include "http/http_front.h"
#include "sim/lost_response.h"

namespace waystone::verify {
namespace {

using Json = nlohmann::json;

// How much past a request's timeout a stalled or slow answer comes.
constexpr Millis kPastTimeout = 300;

bool SameValue(const Json& field, const std::string& value) {
  if (field.is_string()) return field.get<std::string>() == value;
  if (field.is_number() || field.is_boolean()) return field.dump() == value;
  return false;
}

// True when `object` holds `value` in its top-level field `name`, or — for a path
// value, whose field has no name — in any top-level field. A parameter that names
// no field is a search term ("q"): any string field that contains it matches.
bool Holds(const Json& object, const std::string& name, const std::string& value) {
  if (!object.is_object()) return false;
  auto it = name.empty() ? object.end() : object.find(name);
  if (it != object.end()) return SameValue(*it, value);
  for (const auto& [key, field] : object.items()) {
    if (name.empty()
            ? SameValue(field, value)
            : field.is_string() && field.get<std::string>().find(value) != std::string::npos) {
      return true;
    }
  }
  return false;
}

Json ProblemBody(int status, const std::string& detail) {
  return Json{{"type", "about:blank"}, {"status", status}, {"detail", detail}};
}

}  // namespace

class GenericTarget::Impl {
 public:
  // One verified run's simulated world: its schedule, its worker, what it was sent.
  struct Space {
    Schedule schedule;
    pid_t worker = 0;
    pid_t frozen = 0;  // stopped by a freeze outcome, not yet taken by the runner
    std::map<std::pair<std::string, Role>, int> attempts;
    std::map<std::pair<std::string, Role>, Outcome> last;  // the last outcome per request kind
    std::map<std::string, Json> objects;                   // id -> object
    std::map<std::string, std::string> creator;            // id -> step that created it
    std::map<std::string, std::string> put_paths;          // path -> id
    std::map<std::string, std::pair<int, std::string>> answered_keys;  // key -> status, body
    std::set<std::pair<std::string, std::string>> actions;             // (object, action) done
    int next_id = 1;
    Observed observed;
  };

  Impl(Contract contract, std::map<std::string, std::string> upstreams)
      : contract_(std::move(contract)), upstreams_(std::move(upstreams)) {
    if (!upstreams_.empty()) http_ = NewCurlHttpClient({});
  }

  absl::Status Listen() {
    HttpFrontOptions front;
    front.listen = "127.0.0.1:0";
    front.handler_threads = 64;  // stalled and slow answers hold one each
    front.max_connections = 10'000;
    front.request_deadline_seconds = 30;
    auto started = HttpFront::Start(
        front, [](ServerRequest&, ServerResponse&) { return false; },
        [this](const ServerRequest& req, ServerResponse& res) { Handle(req, res); });
    if (!started.ok()) return started.status();
    front_ = std::move(*started);
    return absl::OkStatus();
  }

  int port() const { return front_->port(); }
  int smtp_port() const { return smtp_port_; }

  // The SMTP listener: a thread accepting on loopback, a thread per connection.
  absl::Status ListenSmtp() {
    smtp_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (smtp_fd_ < 0) return absl::UnavailableError("verify's SMTP listener: no socket");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (::bind(smtp_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(smtp_fd_, 256) != 0 ||
        ::getsockname(smtp_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return absl::UnavailableError("verify's SMTP listener cannot listen on loopback");
    }
    smtp_port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { AcceptSmtp(); });
    return absl::OkStatus();
  }

  std::string Open(int id, const Schedule& schedule) {
    MutexLock lock(mu_);
    spaces_[id] = Space{};
    spaces_[id].schedule = schedule;
    return "http://127.0.0.1:" + std::to_string(front_->port()) + "/s" + std::to_string(id);
  }

  void SetWorker(int id, pid_t pid) {
    MutexLock lock(mu_);
    auto it = spaces_.find(id);
    if (it != spaces_.end()) it->second.worker = pid;
  }

  void ForgetWorker(int id, pid_t pid) {
    MutexLock lock(mu_);
    auto it = spaces_.find(id);
    if (it == spaces_.end()) return;
    if (it->second.worker == pid) it->second.worker = 0;
    if (it->second.frozen == pid) it->second.frozen = 0;
  }

  pid_t TakeFrozen(int id) {
    MutexLock lock(mu_);
    auto it = spaces_.find(id);
    if (it == spaces_.end()) return 0;
    return std::exchange(it->second.frozen, 0);
  }

  Observed Close(int id) {
    MutexLock lock(mu_);
    auto it = spaces_.find(id);
    if (it == spaces_.end()) return {};
    Observed observed = std::move(it->second.observed);
    spaces_.erase(it);
    return observed;
  }

  void Stop() {
    front_.reset();
    if (smtp_fd_ >= 0) {
      stopping_ = true;
      ::shutdown(smtp_fd_, SHUT_RDWR);
      if (acceptor_.joinable()) acceptor_.join();
      ::close(smtp_fd_);
      // Each session sees `stopping_` within its poll interval and ends.
      for (Session& session : sessions_) session.thread.join();
      sessions_.clear();
    }
  }

 private:
  struct Plan {  // what to do after the lock is let go
    Outcome outcome = Outcome::kOk;
    Millis timeout = 0;
    pid_t kill = 0;
    std::string forward;  // the sandbox URL the request goes on to; "" = answered here
    int space = 0;
    size_t log_line = 0;
  };

  void Handle(const ServerRequest& req, ServerResponse& res) {
    Plan plan;
    {
      MutexLock lock(mu_);
      plan = Decide(req, res);
    }
    if (!plan.forward.empty()) Forward(req, res, plan);
    Shape(req, res, plan);
  }

  // Sends the request on to the sandbox and takes its answer as this one's.
  void Forward(const ServerRequest& req, ServerResponse& res, const Plan& plan) {
    HttpRequest request;
    request.method = req.method;
    request.url = plan.forward;
    request.body = req.body;
    request.timeout = 30'000;
    for (const auto& [name, value] : req.headers) {
      if (name == "host" || name == "content-length" || name == "connection" ||
          name == "transfer-encoding" || name == "keep-alive") {
        continue;
      }
      request.headers.emplace_back(name, value);
    }
    const HttpResponse answer = http_->Send(request);
    MutexLock lock(mu_);
    auto space = spaces_.find(plan.space);
    const std::string line = " -> sandbox " + (answer.outcome.kind == CallOutcome::Kind::kResponse
                                                   ? "HTTP " + std::to_string(answer.outcome.status)
                                                   : "no answer: " + answer.error);
    if (space != spaces_.end() && plan.log_line < space->second.observed.log.size()) {
      space->second.observed.log[plan.log_line] += line;
    }
    if (answer.outcome.kind != CallOutcome::Kind::kResponse) {
      Answer(res, 502, ProblemBody(502, "verify: the sandbox did not answer: " + answer.error));
      return;
    }
    res.status = answer.outcome.status;
    res.headers.clear();
    const std::string type = answer.Header("content-type");
    res.SetContent(answer.body, type.empty() ? "application/json" : type);
    for (const auto& [name, value] : answer.headers) {
      if (name == "retry-after" || name.starts_with("x-") || name == "location") {
        res.SetHeader(name, value);
      }
    }
  }

  // Applies the request to its schedule's space (or refuses it), under the lock.
  Plan Decide(const ServerRequest& req, ServerResponse& res) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Plan plan;
    const std::string& path = req.path;
    const size_t slash = path.find('/', 1);
    int id = -1;
    if (path.size() > 2 && path[1] == 's') id = std::atoi(path.substr(2, slash - 2).c_str());
    auto space_it = spaces_.find(id);
    if (space_it == spaces_.end()) {
      Answer(res, 404, ProblemBody(404, "no schedule space " + path));
      return plan;
    }
    Space& space = space_it->second;
    const std::string rest = slash == std::string::npos ? "/" : path.substr(slash);
    if (rest == "/_events" && req.method == "POST") {
      Json event = Json::parse(req.body, nullptr, false);
      DeliveredEvent delivered;
      delivered.body = req.body;
      if (event.is_object()) {
        delivered.id = event.value("id", "");
        delivered.type = event.value("type", "");
        if (event.contains("data") && event["data"].is_object()) {
          delivered.step = event["data"].value("step", "");
          delivered.external_id = event["data"].value("external_id", "");
        }
      }
      space.observed.events.push_back(std::move(delivered));
      Answer(res, 200, Json::object());
      return plan;
    }
    const Route* route = MatchRoute(contract_, req.method, rest, req.body);
    if (route == nullptr) {
      space.observed.unmatched.push_back(req.method + " " + rest);
      Answer(res, 404,
             ProblemBody(404, "verify's target has no route for " + req.method + " " + rest));
      return plan;
    }
    plan.timeout = route->timeout;
    // verify's own look at a sandbox after the run (ObserveLookups): no fault, not counted.
    if (req.Header("x-verify-observe") != nullptr) {
      space.observed.log.push_back(route->step + " observed: " + req.method + " " + rest);
      if (auto upstream = upstreams_.find(route->env); upstream != upstreams_.end()) {
        plan.forward = upstream->second + req.target.substr(req.target.find('/', 1));
        plan.space = id;
        plan.log_line = space.observed.log.size() - 1;
      } else if (route->role == Role::kLookup) {
        Lookup(space, *route, req, rest, res, false);
      }
      return plan;
    }
    const auto kind = std::make_pair(route->step, route->role);
    const int attempt = ++space.attempts[kind];
    plan.outcome = Met(space, route->step, route->role, attempt);
    // A target that keeps keys answers a key it has seen as the first time: it does
    // not refuse it (a gateway's 429 or 503 may still come before it looks).
    if (plan.outcome == Outcome::kReject && route->honors_key && !route->forwarded) {
      for (const std::string& name : route->key_headers) {
        const std::string* value = req.Header(name);
        if (value != nullptr && space.answered_keys.contains(*value)) plan.outcome = Outcome::kOk;
      }
    }
    const std::string label = route->step + " " + std::string(RoleName(route->role));
    NoteOutcome(space, *route, plan.outcome);
    space.observed.log.push_back(label + " #" + std::to_string(attempt) + " " + req.method + " " +
                                 rest + " -> " + std::string(OutcomeName(plan.outcome)));
    switch (plan.outcome) {
      case Outcome::kReject:
        Answer(res, 422, ProblemBody(422, "verify: rejected"));
        return plan;
      case Outcome::kRateLimit:
        Answer(res, 429, ProblemBody(429, "verify: rate limited"));
        res.SetHeader("Retry-After", "1");
        return plan;
      case Outcome::kUnavailable:
      case Outcome::kStall:
        Answer(res, 503, ProblemBody(503, "verify: unavailable"));
        return plan;
      case Outcome::kDuplicate:
        Answer(res, 409, ProblemBody(409, "verify: this key was used before"));
        return plan;
      default:
        break;
    }
    // Committed from here on (by the sandbox, for a forwarded route).
    if (auto upstream = upstreams_.find(route->env); upstream != upstreams_.end()) {
      const size_t prefix = req.target.find('/', 1);
      plan.forward =
          upstream->second + (prefix == std::string::npos ? "/" : req.target.substr(prefix));
      plan.space = id;
      plan.log_line = space.observed.log.size() - 1;
      ArmSignal(space, plan);
      return plan;
    }
    std::string key;
    for (const std::string& name : route->key_headers) {
      if (const std::string* value = req.Header(name)) key = *value;
    }
    if (route->honors_key && !key.empty()) {
      auto seen = space.answered_keys.find(key);
      if (seen != space.answered_keys.end()) {
        Cover(space, label + " key replayed");
        res.status = seen->second.first;
        res.SetContent(seen->second.second, "application/json");
        ArmSignal(space, plan);
        return plan;
      }
    }
    if (route->role == Role::kLookup) {
      // Covered only when its answer reaches the worker whole.
      Lookup(space, *route, req, rest, res, plan.outcome == Outcome::kOk);
    } else if (!route->side_effecting) {
      Read(space, *route, rest, res);
    } else {
      Act(space, *route, req, rest, res);
      if (route->honors_key && !key.empty()) space.answered_keys[key] = {res.status, res.body};
    }
    ArmSignal(space, plan);
    return plan;
  }

  // The outcome the `attempt`-th request of (step, role) meets, noting the fault met.
  static Outcome Met(Space& space, const std::string& step, Role role, int attempt) {
    for (const Fault& fault : space.schedule.faults) {
      if (fault.step == step && fault.role == role &&
          (fault.attempt == 0 || fault.attempt == attempt)) {
        const std::string applied = std::string(RoleName(role)) + ":" + step + "#" +
                                    (fault.attempt == 0 ? "*" : std::to_string(fault.attempt));
        if (std::find(space.observed.applied.begin(), space.observed.applied.end(), applied) ==
            space.observed.applied.end()) {
          space.observed.applied.push_back(applied);
        }
        return fault.outcome;
      }
    }
    return Outcome::kOk;
  }

  // Notes what this request of (step, role) meets, and the branches that the request
  // before it makes this one reach: a retry after a 429, a compensation that failed
  // and then went through.
  static void NoteOutcome(Space& space, const Route& route, Outcome outcome) {
    const auto kind = std::make_pair(route.step, route.role);
    const std::string label = route.step + " " + std::string(RoleName(route.role));
    if (auto last = space.last.find(kind); last != space.last.end()) {
      if (last->second == Outcome::kRateLimit) Cover(space, label + " retried after 429");
      if (last->second == Outcome::kUnavailable && route.role == Role::kCompensate &&
          Commits(outcome)) {
        Cover(space, label + " failed, then recovered");
      }
    }
    space.last[kind] = outcome;
  }

  // A kill or a freeze goes to the schedule's worker; a frozen one is the runner's
  // to take over.
  static void ArmSignal(Space& space, Plan& plan) {
    if (plan.outcome != Outcome::kKill && plan.outcome != Outcome::kFreeze) return;
    plan.kill = space.worker;
    if (plan.outcome == Outcome::kFreeze) space.frozen = space.worker;
  }

  // A side-effecting request: a create, an upsert, or an action on the object its
  // path names.
  void Act(Space& space, const Route& route, const ServerRequest& req, const std::string& rest,
           ServerResponse& res) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string named;
    for (const std::string& segment : PathSegments(rest)) {
      if (space.objects.contains(segment)) named = segment;
    }
    if (route.method == "PUT") {
      auto it = space.put_paths.find(rest);
      if (it == space.put_paths.end()) {
        const std::string id = NewObject(space, route, req.body, "/id");
        space.put_paths[rest] = id;
        Record(space, route, id, "put");
      }
      Answer(res, 200, space.objects[space.put_paths[rest]]);
      return;
    }
    if (!named.empty()) {
      const std::vector<std::string> segments = PathSegments(rest);
      const std::string action = segments.back() == named ? req.method : segments.back();
      if (space.actions.insert({named, action}).second) Record(space, route, named, action);
      Json& object = space.objects[named];
      if (object.is_object()) object["status"] = action;
      Answer(res, 200, object);
      return;
    }
    const std::string id = NewObject(space, route, req.body, route.result_pointer);
    Record(space, route, id, "create");
    Answer(res, 201, space.objects[id]);
  }

  // A read that is not a lookup: the object the path names, else one holding every
  // field the templates read.
  void Read(Space& space, const Route& route, const std::string& rest, ServerResponse& res)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& segment : PathSegments(rest)) {
      if (auto it = space.objects.find(segment); it != space.objects.end()) {
        Answer(res, 200, it->second);
        return;
      }
    }
    Json answer = Json::object();
    const std::vector<std::string> segments = PathSegments(rest);
    answer["id"] = segments.empty() ? "verify-object" : segments.back();
    for (const std::string& pointer : route.read_pointers) {
      if (pointer.empty()) continue;
      try {
        Json::json_pointer at(pointer);
        if (!answer.contains(at)) answer[at] = SampleValue(pointer);
      } catch (const Json::exception&) {
      }
    }
    Answer(res, 200, answer);
  }

  // A lookup: the objects the step created whose fields hold the request's query
  // values (and its path's template values), where the step's pointers look.
  void Lookup(Space& space, const Route& route, const ServerRequest& req, const std::string& rest,
              ServerResponse& res, bool covers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::pair<std::string, std::string>> wanted;
    for (const auto& [name, value] : req.query) {
      if (std::find(route.literal_params.begin(), route.literal_params.end(), name) ==
          route.literal_params.end()) {
        wanted.emplace_back(name, value);
      }
    }
    const std::vector<std::string> segments = PathSegments(rest);
    for (size_t i = 0; i < segments.size() && i < route.segments.size(); ++i) {
      if (route.segments[i] == "*") wanted.emplace_back("", segments[i]);
    }
    Json candidates = Json::array();
    for (const auto& [id, object] : space.objects) {
      if (space.creator[id] != route.step) continue;
      bool all = true;
      for (const auto& [name, value] : wanted) {
        if (!Holds(object, name, value) && !(name.empty() && value == id)) all = false;
      }
      if (all) candidates.push_back(object);
    }
    if (covers)
      Cover(space, route.step + " lookup " + (candidates.empty() ? "not found" : "found"));
    Json answer = Json::object();
    try {
      if (!route.items_pointer.empty() || route.found_pointer.empty()) {
        answer[Json::json_pointer(route.items_pointer)] = candidates;
      } else {
        answer[Json::json_pointer(route.found_pointer)] =
            candidates.empty() ? Json(nullptr) : candidates.front();
      }
    } catch (const Json::exception&) {
    }
    Answer(res, 200, answer);
  }

  std::string NewObject(Space& space, const Route& route, const std::string& body,
                        const std::string& id_pointer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Json object = Json::parse(body, nullptr, false);
    if (!object.is_object()) object = Json::object();
    const std::string id = "v" + std::to_string(space.next_id++) + "-" + route.step;
    try {
      object[Json::json_pointer(id_pointer)] = id;
    } catch (const Json::exception&) {
      object["id"] = id;
    }
    if (!route.lookup_id_pointer.empty()) {
      try {
        object[Json::json_pointer(route.lookup_id_pointer)] = id;
      } catch (const Json::exception&) {
      }
    }
    if (!object.contains("id")) object["id"] = id;
    space.objects[id] = std::move(object);
    space.creator[id] = route.step;
    return id;
  }

  void Record(Space& space, const Route& route, const std::string& object,
              const std::string& action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Effect effect{route.step, route.role, object, action,
                  static_cast<int>(space.observed.effects.size()) + 1};
    space.observed.effects.push_back(effect);
    if (route.role == Role::kCompensate) Cover(space, route.step + " compensated");
  }

  static void Cover(Space& space, const std::string& what) {
    for (const std::string& seen : space.observed.coverage) {
      if (seen == what) return;
    }
    space.observed.coverage.push_back(what);
  }

  static void Answer(ServerResponse& res, int status, const Json& body) {
    res.status = status;
    res.SetContent(body.dump(), status >= 400 ? "application/problem+json" : "application/json");
  }

  void AcceptSmtp() {
    while (!stopping_) {
      pollfd ready{smtp_fd_, POLLIN, 0};
      if (::poll(&ready, 1, 200) <= 0) continue;
      const int fd = ::accept4(smtp_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      // A run opens hundreds: the ended ones are joined as new ones come.
      std::erase_if(sessions_, [](Session& session) {
        if (!*session.done) return false;
        session.thread.join();
        return true;
      });
      auto done = std::make_shared<std::atomic<bool>>(false);
      sessions_.push_back({std::thread([this, fd, done] {
                             SmtpSession(fd);
                             *done = true;
                           }),
                           done});
    }
  }

  // One SMTP connection (RFC 5321, what a client that sends one message needs):
  // EHLO names the schedule's space; the message is committed when DATA ends, then
  // its reply is given, lost or delayed as the schedule says.
  void SmtpSession(int fd) {
    auto send = [fd](const std::string& line) {
      (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
    };
    send("220 verify ESMTP\r\n");
    std::string buffer, message;
    bool in_data = false;
    int id = -1;
    while (!stopping_) {
      pollfd ready{fd, POLLIN, 0};
      if (::poll(&ready, 1, 200) == 0) continue;
      char chunk[4096];
      const ssize_t got = ::recv(fd, chunk, sizeof chunk, 0);
      if (got <= 0) break;
      buffer.append(chunk, static_cast<size_t>(got));
      size_t end;
      bool closed = false;
      while (!closed && (end = buffer.find("\r\n")) != std::string::npos) {
        const std::string line = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (in_data) {
          if (line != ".") {
            message += (line.starts_with("..") ? line.substr(1) : line) + "\r\n";
            continue;
          }
          in_data = false;
          closed = EndOfData(fd, id, message, send);
          message.clear();
          continue;
        }
        std::string verb = line.substr(0, line.find(' '));
        std::transform(verb.begin(), verb.end(), verb.begin(),
                       [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
        if (verb == "EHLO" || verb == "HELO") {
          const std::string domain = line.size() > 5 ? line.substr(5) : "";
          id = domain.size() > 1 && domain[0] == 's' ? std::atoi(domain.c_str() + 1) : -1;
          send("250 verify\r\n");
        } else if (verb == "MAIL") {
          // Which step's email this is shows in its headers: its fault is drawn when
          // DATA ends (a refusal there is a refusal of the whole message).
          send("250 2.1.0 ok\r\n");
        } else if (verb == "RCPT") {
          send("250 2.1.5 ok\r\n");
        } else if (verb == "DATA") {
          in_data = true;
          send("354 end with <CRLF>.<CRLF>\r\n");
        } else if (verb == "QUIT") {
          send("221 2.0.0 bye\r\n");
          closed = true;
        } else if (verb == "RSET" || verb == "NOOP") {
          send("250 2.0.0 ok\r\n");
        } else {
          send("502 5.5.2 not here\r\n");
        }
      }
      if (closed) break;
    }
    ::close(fd);
  }

  // The end of a message's DATA: draws its outcome, commits it (or not) and replies
  // as the outcome says. Returns true when the connection is done with.
  template <typename Send>
  bool EndOfData(int fd, int id, const std::string& message, const Send& send) {
    auto header = [&](const std::string& name) {
      const size_t at = message.find("\r\n" + name + ": ");
      const size_t start = message.starts_with(name + ": ") ? 0 : at;
      if (start == std::string::npos) return std::string();
      const size_t value = message.find(": ", start) + 2;
      return message.substr(value, message.find("\r\n", value) - value);
    };
    Plan plan;
    std::string reply = "250 2.0.0 queued\r\n";
    {
      MutexLock lock(mu_);
      auto space_it = spaces_.find(id);
      const Route* route = MatchMail(contract_, header("X-Waystone-Delivery"));
      if (space_it == spaces_.end() || route == nullptr) {
        send("554 5.3.0 verify has no schedule or email route for this message\r\n");
        return false;
      }
      Space& space = space_it->second;
      const auto kind = std::make_pair(route->step, route->role);
      const int attempt = ++space.attempts[kind];
      plan.outcome = Met(space, route->step, route->role, attempt);
      NoteOutcome(space, *route, plan.outcome);
      space.observed.log.push_back(route->step + " " + std::string(RoleName(route->role)) + " #" +
                                   std::to_string(attempt) + " SMTP DATA " + header("Message-ID") +
                                   " -> " + std::string(OutcomeName(plan.outcome)));
      switch (plan.outcome) {
        case Outcome::kReject:
          send("550 5.7.1 verify: rejected\r\n");
          return false;
        case Outcome::kRateLimit:
        case Outcome::kUnavailable:
        case Outcome::kStall:
        case Outcome::kDuplicate:
          send("451 4.3.0 verify: try again later\r\n");
          return false;
        default:
          break;
      }
      const std::string message_id = header("Message-ID");
      space.objects[message_id] = Json{{"message_id", message_id}};
      space.creator[message_id] = route->step;
      Record(space, *route, message_id, "create");
      ArmSignal(space, plan);
    }
    switch (plan.outcome) {
      case Outcome::kOk:
      case Outcome::kSlow:
        send(reply);
        return false;
      case Outcome::kFreeze:
        if (plan.kill > 0) ::kill(plan.kill, SIGSTOP);
        send(reply);
        return false;
      case Outcome::kKill:
        if (plan.kill > 0) ::kill(plan.kill, SIGKILL);
        LoseResponse(fd, LostResponse::kReset);
        return true;
      case Outcome::kReset:
        LoseResponse(fd, LostResponse::kReset);
        return true;
      case Outcome::kPartialStatus:
      case Outcome::kPartialHeaders:
      case Outcome::kCutBody:
        send("25");
        return true;
      default:  // every other loss: the connection closes without the reply
        return true;
    }
  }

  // Shapes the answer as the outcome says, outside the lock (it may sleep).
  static void Shape(const ServerRequest& req, ServerResponse& res, const Plan& plan) {
    auto sleep_past = [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(plan.timeout + kPastTimeout));
    };
    switch (plan.outcome) {
      case Outcome::kStall:
      case Outcome::kSlow:
        sleep_past();
        return;
      case Outcome::kCloseBeforeBytes:
        LoseResponse(req.socket_fd, LostResponse::kCloseBeforeBytes);
        return;
      case Outcome::kReset:
        LoseResponse(req.socket_fd, LostResponse::kReset);
        return;
      case Outcome::kPartialStatus:
        LoseResponse(req.socket_fd, LostResponse::kPartialStatus);
        return;
      case Outcome::kPartialHeaders:
        LoseResponse(req.socket_fd, LostResponse::kPartialHeaders);
        return;
      case Outcome::kCutBody:
        CutBody(req.socket_fd, res.status, res.body.size() + 16);
        return;
      case Outcome::kLost500:
      case Outcome::kLost502:
      case Outcome::kLost504: {
        const int status = plan.outcome == Outcome::kLost500   ? 500
                           : plan.outcome == Outcome::kLost502 ? 502
                                                               : 504;
        res.status = status;
        res.SetContent(ProblemBody(status, "verify: failed after the commit").dump(),
                       "application/problem+json");
        return;
      }
      case Outcome::kFreeze:  // the answer goes out and waits, unread, in the socket
        if (plan.kill > 0) ::kill(plan.kill, SIGSTOP);
        return;
      case Outcome::kKill:
        if (plan.kill > 0) ::kill(plan.kill, SIGKILL);
        LoseResponse(req.socket_fd, LostResponse::kReset);
        return;
      default:
        return;
    }
  }

  const Contract contract_;
  const std::map<std::string, std::string> upstreams_;
  std::unique_ptr<HttpClient> http_;
  Mutex mu_;
  std::map<int, Space> spaces_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HttpFront> front_;
  int smtp_fd_ = -1;
  int smtp_port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  // The SMTP sessions, touched only by the acceptor thread (and by Stop once it
  // has joined it).
  struct Session {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Session> sessions_;
};

absl::StatusOr<std::unique_ptr<GenericTarget>> GenericTarget::Start(
    Contract contract, std::map<std::string, std::string> upstreams) {
  auto impl = std::make_unique<Impl>(std::move(contract), std::move(upstreams));
  if (absl::Status listening = impl->Listen(); !listening.ok()) return listening;
  if (absl::Status listening = impl->ListenSmtp(); !listening.ok()) return listening;
  return std::unique_ptr<GenericTarget>(new GenericTarget(std::move(impl)));
}

GenericTarget::GenericTarget(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GenericTarget::~GenericTarget() { impl_->Stop(); }
int GenericTarget::port() const { return impl_->port(); }
int GenericTarget::smtp_port() const { return impl_->smtp_port(); }
std::string GenericTarget::Open(int id, const Schedule& schedule) {
  return impl_->Open(id, schedule);
}
void GenericTarget::SetWorker(int id, pid_t pid) { impl_->SetWorker(id, pid); }
Observed GenericTarget::Close(int id) { return impl_->Close(id); }
pid_t GenericTarget::TakeFrozen(int id) { return impl_->TakeFrozen(id); }
void GenericTarget::ForgetWorker(int id, pid_t pid) { impl_->ForgetWorker(id, pid); }

}  // namespace waystone::verify
