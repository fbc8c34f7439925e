#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "model/classify.h"

namespace waystone {

// One HTTP request to an external system. A value type.
struct HttpRequest {
  std::string method;
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  Millis timeout = 10'000;
};

// What came back. `outcome` says whether a response arrived, and if not, whether
// the request had already left (which makes the result unknown).
struct HttpResponse {
  CallOutcome outcome;
  std::string body;
  std::string error;  // transport error text when no complete response arrived
};

// HttpClient sends requests to the outside world; the only place that does.
// Implementations are thread-safe.
class HttpClient {
 public:
  virtual ~HttpClient() = default;
  // Sends `request` and waits for the response or the timeout. Never throws.
  virtual HttpResponse Send(const HttpRequest& request) = 0;
};

struct HttpClientOptions {
  // Longest time to establish a connection, within the request's own timeout.
  Millis connect_timeout = 5'000;
  // Verify TLS peers (always on outside tests against self-signed endpoints).
  bool verify_tls = true;
};

// Returns a libcurl-based client; connections are kept alive per thread.
std::unique_ptr<HttpClient> NewCurlHttpClient(const HttpClientOptions& options);

}  // namespace waystone
