#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "connectors/http/http_client.h"

namespace waystone::testing {

// What the fake does with one request.
struct FakeReply {
  enum class Kind {
    kAnswer,          // a complete response: `status`, `body`, `retry_after`
    kFailBeforeSend,  // nothing left the process (refused): kNotSent
    kFailAfterSend,   // sent, then the connection broke before an answer: kLostAfterSend
    kTimeout,         // sent, no answer within the request's timeout: kLostAfterSend, and
                      // the clock (when given) moves on by that timeout
  };
  Kind kind = Kind::kAnswer;
  int status = 200;
  std::string body = "{}";
  std::optional<Millis> retry_after;

  static FakeReply Answer(int status, std::string body = "{}") {
    return FakeReply{Kind::kAnswer, status, std::move(body), std::nullopt};
  }
  static FakeReply FailBeforeSend() { return FakeReply{Kind::kFailBeforeSend, 0, "", {}}; }
  static FakeReply FailAfterSend() { return FakeReply{Kind::kFailAfterSend, 0, "", {}}; }
  static FakeReply Timeout() { return FakeReply{Kind::kTimeout, 0, "", {}}; }
};

// FakeHttpClient is an HttpClient with no sockets: replies are scripted per route
// ("METHOD /path", the URL's path without scheme, host or query), first the queued
// ones (Next) in order, then the route's standing reply (Always); a route with
// neither answers 404. Every request is kept and counted, except one its may_send
// withdraws (answered kNotSent, as the real client does). Thread-safe.
class FakeHttpClient final : public HttpClient {
 public:
  // `clock`, when given, is moved on by a kTimeout's request timeout.
  explicit FakeHttpClient(const Clock* clock = nullptr) : clock_(clock) {}

  // Answers every request on `route` with `reply` once the queued ones are used.
  void Always(const std::string& route, FakeReply reply);
  // Queues `reply` for the next request on `route`.
  void Next(const std::string& route, FakeReply reply);

  HttpResponse Send(const HttpRequest& request) override;

  // The requests seen on `route`, so far.
  int Count(const std::string& route) const;
  // Every request seen, in order.
  std::vector<HttpRequest> Requests() const;
  // The requests seen on `route`, in order.
  std::vector<HttpRequest> Requests(const std::string& route) const;

  // "METHOD /path" of a request.
  static std::string RouteOf(const HttpRequest& request);

 private:
  const Clock* clock_;
  mutable std::mutex mu_;
  std::map<std::string, FakeReply> always_;            // guarded by mu_
  std::map<std::string, std::deque<FakeReply>> next_;  // guarded by mu_
  std::vector<HttpRequest> requests_;                  // guarded by mu_
};

}  // namespace waystone::testing
