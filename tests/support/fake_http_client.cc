#include "support/fake_http_client.h"

namespace waystone::testing {

std::string FakeHttpClient::RouteOf(const HttpRequest& request) {
  std::string_view url = request.url;
  if (const size_t scheme = url.find("://"); scheme != std::string_view::npos) {
    url.remove_prefix(scheme + 3);
    const size_t slash = url.find('/');
    url = slash == std::string_view::npos ? std::string_view("/") : url.substr(slash);
  }
  if (const size_t query = url.find_first_of("?#"); query != std::string_view::npos) {
    url = url.substr(0, query);
  }
  return request.method + " " + std::string(url);
}

void FakeHttpClient::Always(const std::string& route, FakeReply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  always_[route] = std::move(reply);
}

void FakeHttpClient::Next(const std::string& route, FakeReply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  next_[route].push_back(std::move(reply));
}

HttpResponse FakeHttpClient::Send(const HttpRequest& request) {
  if (request.may_send && !request.may_send()) {  // withdrawn as the real client does
    HttpResponse withdrawn;
    withdrawn.outcome.kind = CallOutcome::Kind::kNotSent;
    withdrawn.error = "not sent: the caller withdrew it before its first byte left";
    return withdrawn;
  }
  const std::string route = RouteOf(request);
  FakeReply reply = FakeReply::Answer(404, R"({"error":"no such route in the fake"})");
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(request);
    if (auto queued = next_.find(route); queued != next_.end() && !queued->second.empty()) {
      reply = std::move(queued->second.front());
      queued->second.pop_front();
    } else if (auto standing = always_.find(route); standing != always_.end()) {
      reply = standing->second;
    }
  }
  HttpResponse response;
  CallOutcome& outcome = response.outcome;
  switch (reply.kind) {
    case FakeReply::Kind::kAnswer:
      outcome.kind = CallOutcome::Kind::kResponse;
      outcome.status = reply.status;
      outcome.retry_after = reply.retry_after;
      outcome.sent = true;
      outcome.connection = ConnectionUsed::kNew;
      response.body = std::move(reply.body);
      break;
    case FakeReply::Kind::kFailBeforeSend:
      outcome.kind = CallOutcome::Kind::kNotSent;
      response.error = "fake: connection refused";
      break;
    case FakeReply::Kind::kFailAfterSend:
      outcome.kind = CallOutcome::Kind::kLostAfterSend;
      outcome.sent = true;
      outcome.connection = ConnectionUsed::kNew;
      response.error = "fake: connection reset after the request was sent";
      break;
    case FakeReply::Kind::kTimeout:
      if (clock_ != nullptr) clock_->SleepFor(request.timeout, {});
      outcome.kind = CallOutcome::Kind::kLostAfterSend;
      outcome.sent = true;
      outcome.connection = ConnectionUsed::kNew;
      response.error = "fake: timed out after " + std::to_string(request.timeout) + " ms";
      break;
  }
  return response;
}

int FakeHttpClient::Count(const std::string& route) const {
  return static_cast<int>(Requests(route).size());
}

std::vector<HttpRequest> FakeHttpClient::Requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

std::vector<HttpRequest> FakeHttpClient::Requests(const std::string& route) const {
  std::vector<HttpRequest> matching;
  for (HttpRequest& request : Requests()) {
    if (RouteOf(request) == route) matching.push_back(std::move(request));
  }
  return matching;
}

}  // namespace waystone::testing
